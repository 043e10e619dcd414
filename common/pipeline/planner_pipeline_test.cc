// The auto-planner's plans run by the in-process pipeline: its memory model against the
// allocator, a split moved for a memory budget, and SCHEDULE_AUTO resolved into a job that
// trains bit for bit like the reference trainer.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/pipeline/local_pipeline.h"
#include "common/plan/partition.h"
#include "common/plan/planner.h"
#include "common/plan/planner_test_util.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using planner_test::Gpt;

// The in-process pipeline trains `spec` to the reference trainer's weights, bit for bit.
void ExpectTrainsLikeTheReference(const baton::v1::JobSpec& spec) {
  auto ref = ReferenceTrainer::Create(spec);
  auto pipe = LocalPipelineTrainer::Create(spec);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  for (int i = 0; i < spec.steps(); ++i) {
    ASSERT_TRUE((*ref)->Step().ok());
    ASSERT_TRUE((*pipe)->Step().ok());
  }
  EXPECT_EQ(DigestHex((*pipe)->WeightsDigest()), DigestHex((*ref)->WeightsDigest()));
}

// The split search: under 1F1B rank r holds S-r micro-batches in flight, so under a budget
// the balanced split misses, blocks move from the first ranks towards the last until it
// fits; the moved split is timed (slower than the balanced one), written into the spec as
// pipeline.partition, and trains bit for bit like the reference.
TEST(PlannerTest, ABudgetTheBalancedSplitMissesMovesBlocksOffTheFullestRank) {
  baton::v1::JobSpec spec = Gpt(6, 32);
  auto* p = spec.mutable_pipeline();
  p->set_schedule(baton::v1::SCHEDULE_1F1B);
  p->set_stages(4);
  p->set_microbatches(8);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  PlannerInput in = PlannerInputFor(spec, 4);
  absl::StatusOr<Plan> free = PlanPipeline(in);
  ASSERT_TRUE(free.ok()) << free.status();
  ASSERT_EQ(free->considered, 1);
  const PlanCandidate balanced = free->ranked[0];
  EXPECT_FALSE(balanced.split_moved);
  // Balanced (embedding + 1 layer | 2 | 2 | 2 + head), rank 1 needs the most: two layers
  // with three micro-batches in flight (rank 0 holds four, of one layer).
  ASSERT_EQ(PartitionSizes(balanced.stage_blocks), (std::vector<int>{2, 2, 2, 2}));
  const int fullest = static_cast<int>(
      std::max_element(balanced.peak_bytes.begin(), balanced.peak_bytes.end()) -
      balanced.peak_bytes.begin());
  EXPECT_EQ(fullest, 1);

  in.memory_budget_bytes = balanced.max_peak_bytes * 9 / 10;
  absl::StatusOr<Plan> tight = PlanPipeline(in);
  ASSERT_TRUE(tight.ok()) << tight.status();
  const PlanCandidate& moved = tight->ranked[0];
  EXPECT_TRUE(moved.split_moved);
  EXPECT_TRUE(moved.fits);
  EXPECT_LE(moved.max_peak_bytes, in.memory_budget_bytes);
  // No single move fits (rank 1's layer would overload rank 0 or 2): the layers shift
  // down the chain, and the last rank, one micro-batch in flight, takes the extra one.
  EXPECT_LT(moved.stage_blocks[fullest].size(), balanced.stage_blocks[fullest].size());
  EXPECT_GT(moved.stage_blocks[3].size(), balanced.stage_blocks[3].size());
  EXPECT_EQ(PartitionSizes(moved.stage_blocks), (std::vector<int>{2, 1, 2, 3}));
  EXPECT_GE(moved.step_time, balanced.step_time);
  EXPECT_TRUE(absl::StrContains(moved.Describe(), " split ")) << moved.Describe();

  // SCHEDULE_AUTO under that budget writes the split into the spec, which trains bit-exact.
  baton::v1::JobSpec automatic = spec;
  automatic.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_AUTO);
  absl::StatusOr<Plan> resolved = ResolveAutoPipeline(&automatic, in.memory_budget_bytes);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const PlanCandidate& pick = resolved->ranked[0];
  EXPECT_EQ(automatic.pipeline().partition_size() > 0, pick.split_moved);
  if (pick.split_moved) {
    EXPECT_EQ(std::vector<int>(automatic.pipeline().partition().begin(),
                               automatic.pipeline().partition().end()),
              PartitionSizes(pick.stage_blocks));
  }
  // The moved 1F1B split itself, run by the in-process pipeline.
  baton::v1::JobSpec run = spec;
  for (int n : PartitionSizes(moved.stage_blocks)) run.mutable_pipeline()->add_partition(n);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&run).ok());
  ExpectTrainsLikeTheReference(run);
}

// The memory model against the allocator: one stage (the whole process is the rank), a
// step's peak bytes above what was in use before the trainer existed, for GPipe (every
// micro-batch in flight), 1F1B (one) and GPipe with recomputation, in fp32 and bf16 (whose
// kept activations are mostly bf16 bits).
TEST(PlannerTest, PredictedPeakMemoryIsWithinFivePercentOfTheAllocatorsPeak) {
  struct Case {
    baton::v1::Schedule schedule;
    bool recompute;
    bool bf16;
  };
  for (const Case& k : {Case{baton::v1::SCHEDULE_GPIPE, false, false},
                        Case{baton::v1::SCHEDULE_1F1B, false, false},
                        Case{baton::v1::SCHEDULE_GPIPE, true, false},
                        Case{baton::v1::SCHEDULE_GPIPE, false, true},
                        Case{baton::v1::SCHEDULE_1F1B, false, true}}) {
    baton::v1::JobSpec spec = Gpt(4, 32);
    if (k.bf16) spec.set_precision(baton::v1::PRECISION_BF16);
    auto* p = spec.mutable_pipeline();
    p->set_schedule(k.schedule);
    p->set_microbatches(4);
    p->set_recompute(k.recompute ? baton::v1::RECOMPUTE_FULL : baton::v1::RECOMPUTE_NONE);
    const std::string name = absl::StrCat(baton::v1::Schedule_Name(k.schedule),
                                          k.recompute ? "_recompute" : "", k.bf16 ? "_bf16" : "");
    SCOPED_TRACE(name);
    absl::StatusOr<Plan> plan = PlanPipeline(PlannerInputFor(spec, 1));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t predicted = plan->ranked[0].peak_bytes[0];

    Allocator* alloc = CpuAllocator();
    const int64_t before = alloc->Stats().bytes_in_use;
    auto t = LocalPipelineTrainer::Create(spec);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Step().ok());  // the optimizer state exists from the first step
    alloc->ResetPeak();
    ASSERT_TRUE((*t)->Step().ok());
    const int64_t measured = alloc->Stats().peak_bytes_in_use - before;
    RecordProperty(absl::StrCat("peak_", name, "_measured"), std::to_string(measured));
    RecordProperty(absl::StrCat("peak_", name, "_predicted"), std::to_string(predicted));
    EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(measured),
                0.05 * static_cast<double>(measured))
        << "predicted " << predicted << " bytes, allocator " << measured;
  }
}

// A sharded optimizer against the allocator: one stage, D replicas in the process. The
// state a job keeps between steps (weights, gradients, optimizer state) is what sharding
// changes: the allocator's bytes in use after a step, over all D ranks, drop by what the
// planner predicts (its per-rank peaks, with and without sharding, times D) within 5%,
// for D = 2 and 4 with AdamW (two moments: 8 bytes per parameter times (D - 1) / D). The
// ranks' step peaks are printed, not checked: D threads' peaks need not coincide, so their
// sum over-states the process's (the per-rank peak is checked above, with one rank).
TEST(PlannerTest, AShardedOptimizerSavesWhatThePlannerPredicts) {
  // In bf16 the saving also counts the Linear weights kept as bf16 bits by non-owners.
  for (const auto& [d, bf16] :
       {std::pair{2, false}, std::pair{4, false}, std::pair{2, true}, std::pair{4, true}}) {
    SCOPED_TRACE(absl::StrCat("D=", d, bf16 ? " bf16" : " fp32"));
    int64_t predicted[2] = {0, 0}, kept[2] = {0, 0};  // by shard
    for (bool shard : {false, true}) {
      baton::v1::JobSpec spec = Gpt(4, 32);
      if (bf16) spec.set_precision(baton::v1::PRECISION_BF16);
      auto* p = spec.mutable_pipeline();
      p->set_schedule(baton::v1::SCHEDULE_1F1B);
      p->set_microbatches(4);
      p->set_data_parallel(d);
      spec.mutable_optimizer()->set_shard(shard);
      ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
      absl::StatusOr<Plan> plan = PlanPipeline(PlannerInputFor(spec, 1));
      ASSERT_TRUE(plan.ok()) << plan.status();
      predicted[shard] = d * plan->ranked[0].peak_bytes[0];
      Allocator* alloc = CpuAllocator();
      const int64_t before = alloc->Stats().bytes_in_use;
      auto t = LocalPipelineTrainer::Create(spec);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE((*t)->Step().ok());
      alloc->ResetPeak();
      ASSERT_TRUE((*t)->Step().ok());
      const AllocatorStats after = alloc->Stats();
      kept[shard] = after.bytes_in_use - before;
      std::printf("D=%d%s%s: between steps %lld bytes; step peak %lld, predicted %lld (%d ranks)\n",
                  d, bf16 ? " bf16" : "", shard ? " sharded" : "",
                  static_cast<long long>(kept[shard]),
                  static_cast<long long>(after.peak_bytes_in_use - before),
                  static_cast<long long>(predicted[shard]), d);
    }
    const double saved = static_cast<double>(kept[0] - kept[1]);
    const double want = static_cast<double>(predicted[0] - predicted[1]);
    const char* precision = bf16 ? "_bf16" : "";
    RecordProperty(absl::StrCat("saved_D", d, precision, "_measured"),
                   std::to_string(kept[0] - kept[1]));
    RecordProperty(absl::StrCat("saved_D", d, precision, "_predicted"),
                   std::to_string(predicted[0] - predicted[1]));
    EXPECT_GT(saved, 0.0);
    EXPECT_NEAR(want, saved, 0.05 * saved) << "predicted " << want << ", allocator " << saved;
  }
}

// SCHEDULE_AUTO: nothing trains it until it is resolved; resolved, it is a concrete spec
// whose pipeline run equals the reference trainer's, bit for bit.
TEST(PlannerTest, AutoSpecIsResolvedIntoAJobThatTrainsBitExact) {
  baton::v1::JobSpec spec = Gpt();
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_AUTO);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_microbatches(0);
  spec.mutable_pipeline()->set_virtual_stages(0);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  auto refused = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "SCHEDULE_AUTO"));
  EXPECT_FALSE(LocalPipelineTrainer::Create(spec).ok());

  absl::StatusOr<Plan> plan = ResolveAutoPipeline(&spec, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(spec.pipeline().schedule(), baton::v1::SCHEDULE_AUTO);
  EXPECT_EQ(absl::StrCat(ScheduleKindName(plan->ranked[0].kind), " V=",
                         spec.pipeline().virtual_stages(), " M=", spec.pipeline().microbatches()),
            plan->ranked[0].Describe());
  const std::string summary = SummarizePlan(*plan);
  EXPECT_TRUE(absl::StartsWith(summary, "auto-planner chose " + plan->ranked[0].Describe()))
      << summary;
  EXPECT_TRUE(absl::StrContains(summary, "model FLOPs")) << summary;

  ExpectTrainsLikeTheReference(spec);

  // A concrete spec is left alone.
  const std::string before = spec.SerializeAsString();
  absl::StatusOr<Plan> none = ResolveAutoPipeline(&spec, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->considered, 0);
  EXPECT_EQ(spec.SerializeAsString(), before);
}

}  // namespace
}  // namespace baton
