// The auto-planner (planner.h): what it searches, how it ranks and explains, and its
// calibration from measured costs. Its plans run by the in-process pipeline (its memory
// model against the allocator, SCHEDULE_AUTO resolved into a job that trains bit for bit
// like the reference) are checked in common/pipeline/planner_pipeline_test.cc.
#include "common/plan/planner.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/plan/partition.h"
#include "common/schedule/generators.h"
#include "common/schedule/vocabulary.h"
#include "common/plan/planner_test_util.h"
#include "common/spec/spec.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using planner_test::AutoInput;
using planner_test::Gpt;

// FLOPs per sample of a chunk as the planner counts them (+1 per block).
double Flops(const PlannerInput& in, const BlockRange& r) {
  double flops = 0;
  for (int b = r.first; b < r.last; ++b) flops += in.blocks[b].forward_flops + 1;
  return flops;
}

// The simulated makespan of 1F1B on S ranks with M micro-batches at these costs.
double Makespan1F1B(int S, int M, const Costs& costs) {
  ScheduleOptions o;
  o.num_ranks = S;
  o.num_microbatches = M;
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<SimResult> sim = Simulate(*s, costs);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? sim->makespan : -1;
}

TEST(PlannerTest, SearchesEveryScheduleVAndMAndRanksThemByPredictedTime) {
  const PlannerInput in = AutoInput(Gpt(), 4);
  absl::StatusOr<Plan> plan = PlanPipeline(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->measured);
  EXPECT_EQ(plan->considered, static_cast<int>(plan->ranked.size()));
  std::set<ScheduleKind> kinds;
  std::set<int> ms, vs;
  for (size_t k = 0; k < plan->ranked.size(); ++k) {
    const PlanCandidate& c = plan->ranked[k];
    kinds.insert(c.kind);
    ms.insert(c.microbatches);
    if (c.kind == ScheduleKind::kInterleaved1F1B) vs.insert(c.virtual_stages);
    EXPECT_EQ(16 % c.microbatches, 0) << c.Describe();
    EXPECT_EQ(static_cast<int>(c.stage_blocks.size()), 4 * c.virtual_stages);
    EXPECT_TRUE(c.fits);
    if (k > 0) {
      EXPECT_GE(c.step_time, plan->ranked[k - 1].step_time) << c.Describe();
      EXPECT_FALSE(c.lost.empty()) << c.Describe();
    }
  }
  EXPECT_TRUE(plan->ranked[0].lost.empty());
  // Every schedule of the table that S = 4 and these 8 blocks allow.
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (e.generate != nullptr) {
      EXPECT_TRUE(kinds.count(e.kind)) << e.name;
    }
  }
  EXPECT_EQ(ms, (std::set<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(vs, (std::set<int>{2}));  // 8 blocks: V = 3 would need 12
  // With unit-like FLOP costs and free communication, more micro-batches only shrink the
  // bubble: the pick uses all 16, and a zero-bubble schedule.
  EXPECT_EQ(plan->ranked[0].microbatches, 16);
  EXPECT_TRUE(ScheduleEntryOf(plan->ranked[0].kind).split_backward) << plan->ranked[0].Describe();
  // Deterministic.
  absl::StatusOr<Plan> again = PlanPipeline(in);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->ranked.size(), plan->ranked.size());
  for (size_t k = 0; k < plan->ranked.size(); ++k) {
    EXPECT_EQ(again->ranked[k].Describe(), plan->ranked[k].Describe());
    EXPECT_EQ(again->ranked[k].step_time, plan->ranked[k].step_time);
  }
}

// The predicted step is the simulator's makespan for the candidate's clock with its costs;
// the bubble is the simulator's too.
TEST(PlannerTest, PredictionIsTheSimulationOfTheCandidatesClock) {
  PlannerInput in = AutoInput(Gpt(), 2);
  in.schedule = ScheduleKind::k1F1B;
  in.microbatches = 4;
  absl::StatusOr<Plan> plan = PlanPipeline(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->considered, 1);
  const PlanCandidate& c = plan->ranked[0];
  // FLOP costs: each stage's F is rows * its blocks' FLOPs (+1 each); I = W = F.
  Costs costs;
  for (const BlockRange& r : c.stage_blocks) {
    Costs st;
    st.f = st.i = st.w = 4 * Flops(in, r);  // 16 samples / 4 micro-batches
    st.b = st.i + st.w;
    st.send = st.recv = 0;
    costs.per_stage.push_back(st);
  }
  costs.step = 0;
  ScheduleOptions o;
  o.num_ranks = 2;
  o.num_microbatches = 4;
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  ASSERT_TRUE(s.ok());
  absl::StatusOr<SimResult> sim = Simulate(*s, costs);
  ASSERT_TRUE(sim.ok());
  EXPECT_DOUBLE_EQ(c.step_time, sim->makespan);
  EXPECT_DOUBLE_EQ(c.bubble, sim->bubble_ratio);
  // The memory follows the clock: GPipe holds all 4 micro-batches on every rank where 1F1B
  // holds min(S - r, M) = 2 on rank 0 and 1 on rank 1, on the same split.
  in.schedule = ScheduleKind::kGpipe;
  absl::StatusOr<Plan> gpipe = PlanPipeline(in);
  ASSERT_TRUE(gpipe.ok()) << gpipe.status();
  const PlanCandidate& g = gpipe->ranked[0];
  ASSERT_EQ(g.stage_blocks.size(), c.stage_blocks.size());
  EXPECT_GT(g.peak_bytes[0], c.peak_bytes[0]);
  EXPECT_GT(g.peak_bytes[1], c.peak_bytes[1]);
  EXPECT_GT(g.peak_bytes[1] - c.peak_bytes[1], g.peak_bytes[0] - c.peak_bytes[0])
      << "1F1B's last rank saves 3 micro-batches' stash, its first 2 (stashes of similar size)";
}

// Fixed choices in the spec are kept: a concrete schedule with its V and M is one
// candidate; SCHEDULE_AUTO with M fixed searches schedules only.
TEST(PlannerTest, KeepsWhatTheSpecFixes) {
  baton::v1::JobSpec spec = Gpt();
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_ZB_H1);
  spec.mutable_pipeline()->set_microbatches(8);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  absl::StatusOr<Plan> one = PlanPipeline(PlannerInputFor(spec, 2));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->considered, 1);
  EXPECT_EQ(one->ranked[0].Describe(), "zb-h1 V=1 M=8");

  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_AUTO);
  spec.mutable_pipeline()->set_virtual_stages(0);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(spec.pipeline().virtual_stages(), 0);  // left to the planner
  absl::StatusOr<Plan> all = PlanPipeline(PlannerInputFor(spec, 2));
  ASSERT_TRUE(all.ok()) << all.status();
  for (const PlanCandidate& c : all->ranked) EXPECT_EQ(c.microbatches, 8) << c.Describe();
  EXPECT_GT(all->considered, 5);
}

// optimizer.shard: each replica of a rank counts the optimizer state of an even share of
// the rank's parameters; nothing else changes.
TEST(PlannerTest, AShardedOptimizerCountsOneShareOfTheState) {
  baton::v1::JobSpec spec = Gpt();
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_1F1B);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_pipeline()->set_data_parallel(4);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
  const PlannerInput plain = PlannerInputFor(spec, 2);
  EXPECT_FALSE(plain.shard_optimizer);
  spec.mutable_optimizer()->set_shard(true);
  const PlannerInput sharded = PlannerInputFor(spec, 2);
  EXPECT_TRUE(sharded.shard_optimizer);
  absl::StatusOr<Plan> a = PlanPipeline(plain);
  absl::StatusOr<Plan> b = PlanPipeline(sharded);
  ASSERT_TRUE(a.ok() && b.ok());
  const PlanCandidate& pa = a->ranked[0];
  const PlanCandidate& pb = b->ranked[0];
  ASSERT_EQ(pa.stage_blocks.size(), pb.stage_blocks.size());
  for (size_t r = 0; r < pa.peak_bytes.size(); ++r) {
    ASSERT_EQ(pa.stage_blocks[r].first, pb.stage_blocks[r].first);
    ASSERT_EQ(pa.stage_blocks[r].last, pb.stage_blocks[r].last);
    int64_t params = 0;
    for (int bl = pa.stage_blocks[r].first; bl < pa.stage_blocks[r].last; ++bl) {
      params += plain.blocks[bl].parameters;
    }
    // AdamW: two floats per parameter, of which a replica keeps ceil(params / 4).
    EXPECT_EQ(pa.peak_bytes[r] - pb.peak_bytes[r], 4 * 2 * (params - (params + 3) / 4)) << r;
  }
}

// On a GPU with replicas the NCCL engine gathers D copies of a bucket into one buffer (the
// caching allocator's): each rank counts D times its largest bucket, the spec's bucket size
// or its largest parameter when that is larger; in fast mode unsharded (an all-reduce in
// place) and on the CPU nothing.
TEST(PlannerTest, AGpuReplicaGroupCountsTheEnginesGatherBuffer) {
  baton::v1::JobSpec spec = Gpt();
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_1F1B);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_pipeline()->set_data_parallel(4);
  spec.mutable_pipeline()->set_reduce_bucket_bytes(4096);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
  const PlannerInput cpu = PlannerInputFor(spec, 2);
  EXPECT_EQ(cpu.reduce_bucket_floats, 0);
  spec.set_device(baton::v1::DEVICE_KIND_CUDA);
  const PlannerInput gpu = PlannerInputFor(spec, 2);
  EXPECT_EQ(gpu.reduce_bucket_floats, 1024);
  spec.mutable_pipeline()->set_reduce_mode(baton::v1::REDUCE_MODE_FAST);
  EXPECT_EQ(PlannerInputFor(spec, 2).reduce_bucket_floats, 0);
  spec.mutable_optimizer()->set_shard(true);  // reduce-scatter gathers in either mode
  EXPECT_EQ(PlannerInputFor(spec, 2).reduce_bucket_floats, 1024);
  absl::StatusOr<Plan> a = PlanPipeline(cpu);
  absl::StatusOr<Plan> b = PlanPipeline(gpu);
  ASSERT_TRUE(a.ok() && b.ok());
  const PlanCandidate& pa = a->ranked[0];
  const PlanCandidate& pb = b->ranked[0];
  ASSERT_EQ(pa.Describe(), pb.Describe());
  bool larger_than_a_bucket = false;
  for (size_t r = 0; r < pa.peak_bytes.size(); ++r) {
    int64_t largest = 0;
    for (int bl = pa.stage_blocks[r].first; bl < pa.stage_blocks[r].last; ++bl) {
      largest = std::max(largest, cpu.blocks[bl].largest_parameter);
    }
    larger_than_a_bucket |= largest > 1024;
    EXPECT_EQ(pb.peak_bytes[r] - pa.peak_bytes[r], 4 * 4 * std::max<int64_t>(1024, largest)) << r;
  }
  EXPECT_TRUE(larger_than_a_bucket) << "the case should have a parameter larger than a bucket";
}

// The planner counts the attention kernels the spec names (a block's stash, measured in
// the kernels' tests): the fused and tiled ones keep no probabilities; unspecified (a
// worker's environment decides) counts the materialised ones, the most any keeps.
TEST(PlannerTest, TheSpecsAttentionKernelsSetTheBlocksStash) {
  baton::v1::JobSpec spec = Gpt();
  spec.set_precision(baton::v1::PRECISION_BF16);
  // H T^2 = 8192 probabilities against H T + T C = 2176 floats a sequence.
  spec.mutable_model()->mutable_gpt()->set_context(64);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
  const std::vector<BlockInfo> plain = PlannerInputFor(spec, 2).blocks;
  EXPECT_EQ(plain[1].activation_floats, DescribeBlocks(spec.model())[1].activation_floats);
  for (auto a : {baton::v1::ATTENTION_KERNEL_FUSED, baton::v1::ATTENTION_KERNEL_TILED}) {
    spec.set_attention(a);
    ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
    const std::vector<BlockInfo> flash = PlannerInputFor(spec, 2).blocks;
    const AttentionKernel k =
        a == baton::v1::ATTENTION_KERNEL_FUSED ? AttentionKernel::kFused : AttentionKernel::kTiled;
    EXPECT_EQ(flash[1].activation_floats,
              DescribeBlocks(spec.model(), {k, /*bf16=*/true})[1].activation_floats);
    EXPECT_LT(flash[1].activation_floats, plain[1].activation_floats);
    EXPECT_EQ(flash[0].activation_floats, plain[0].activation_floats);  // the embedding
  }
}

TEST(PlannerTest, MemoryBudgetExcludesAndExplainsAndRefusesWhenNothingFits) {
  PlannerInput in = AutoInput(Gpt(), 4);
  absl::StatusOr<Plan> free = PlanPipeline(in);
  ASSERT_TRUE(free.ok());
  int64_t smallest = INT64_MAX, largest = 0;
  for (const PlanCandidate& c : free->ranked) {
    smallest = std::min(smallest, c.max_peak_bytes);
    largest = std::max(largest, c.max_peak_bytes);
  }
  ASSERT_LT(smallest, largest);
  // Between the two: some fit, some do not; the pick fits; the rest say "memory".
  in.memory_budget_bytes = (smallest + largest) / 2;
  absl::StatusOr<Plan> some = PlanPipeline(in);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_GT(some->over_budget, 0);
  EXPECT_LE(some->ranked[0].max_peak_bytes, in.memory_budget_bytes);
  bool saw_memory = false;
  for (const PlanCandidate& c : some->ranked) {
    if (!c.fits) {
      saw_memory = true;
      EXPECT_TRUE(absl::StartsWith(c.lost, "memory: needs ")) << c.lost;
    }
  }
  EXPECT_TRUE(saw_memory);
  // Below anything a split search can reach: refused, naming the smallest need; a budget
  // of that need (rounded up as printed) then plans.
  in.memory_budget_bytes = 1024;
  absl::StatusOr<Plan> none = PlanPipeline(in);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(none.status().message());
  EXPECT_TRUE(absl::StartsWith(msg, "memory budget: no candidate fits 1 KiB per rank; the "
                                    "smallest, "))
      << msg;
  const size_t at = msg.find(", needs ");
  ASSERT_NE(at, std::string::npos) << msg;
  double need = 0;
  char unit[8] = {};
  ASSERT_EQ(std::sscanf(msg.c_str() + at + 8, "%lf %7s", &need, unit), 2) << msg;
  const double scale = std::string(unit) == "GiB" ? 1 << 30 : std::string(unit) == "MiB" ? 1 << 20 : 1024;
  EXPECT_LE(need * scale, 1.001 * static_cast<double>(smallest)) << msg;
  in.memory_budget_bytes = static_cast<int64_t>((need + 0.1) * scale);
  EXPECT_TRUE(PlanPipeline(in).ok()) << msg;
}

// Measured costs calibrate the rates: a run whose per-stage times are exactly proportional
// to FLOPs (2e-6 ms per FLOP-sample forward, twice that backward, 0.01 ms per message,
// 1 ms optimizer step) predicts that same run's simulation, in ms.
TEST(PlannerTest, MeasuredCostsCalibrateTheModel) {
  const baton::v1::JobSpec spec = Gpt();
  PlannerInput in = AutoInput(spec, 2);
  in.schedule = ScheduleKind::k1F1B;
  in.microbatches = 4;
  absl::StatusOr<Plan> unit = PlanPipeline(in);
  ASSERT_TRUE(unit.ok());
  const std::vector<BlockRange> blocks = unit->ranked[0].stage_blocks;
  MeasuredRun m;
  m.rows = 4;
  m.stage_blocks = blocks;
  m.source = "test run";
  Costs measured;
  for (int s = 0; s < 2; ++s) {
    Costs c;
    c.f = 2e-6 * Flops(in, blocks[s]) * 4;
    c.i = c.w = c.f;
    c.b = c.i + c.w;
    c.send = 0.01;
    c.recv = 0.01;
    measured.per_stage.push_back(c);
  }
  measured.step = 1;
  m.costs = measured;
  in.measured = {m};
  absl::StatusOr<Plan> plan = PlanPipeline(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->measured);
  EXPECT_EQ(plan->cost_source, "test run");
  // The step cost is spread by parameters (the measured step is the slowest rank's).
  const double makespan = Makespan1F1B(2, 4, measured);
  EXPECT_NEAR(plan->ranked[0].step_time, makespan, 0.05 * makespan);
  EXPECT_GT(plan->ranked[0].step_time, 1.0);  // in ms, with the step in it

  // A measured partition that does not fit this model is refused, naming the source.
  in.measured[0].stage_blocks = {{0, 3}, {3, 99}};
  absl::StatusOr<Plan> bad = PlanPipeline(in);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "test run")) << bad.status();
}

// Two runs at different micro-batch sizes measure how the compute rate depends on it: times
// built as 3e-6 ms per FLOP-sample at 2 rows and 2e-6 at 8 give those rates back at those
// sizes, log-linear between (2.5e-6 at 4 rows), the small one's below 2 rows; a candidate's
// prediction is its clock simulated with those costs. The split into chunks does not change
// the rate (a per-action overhead would have: that model was dropped, it priced more chunks
// per rank far above what they measured).
TEST(PlannerTest, RunsOfTwoMicrobatchSizesCalibrateTheRatePerSize) {
  const baton::v1::JobSpec spec = Gpt();
  PlannerInput in = AutoInput(spec, 2);
  absl::StatusOr<std::vector<BlockRange>> blocks = PartitionBlocks(in.blocks, 2);
  ASSERT_TRUE(blocks.ok());
  auto rate = [](int64_t rows) { return rows == 2 ? 3e-6 : 2e-6; };  // the two runs
  auto run = [&](int64_t rows) {
    MeasuredRun m;
    m.rows = rows;
    m.stage_blocks = *blocks;
    m.source = absl::StrCat("rows ", rows);
    for (const BlockRange& r : *blocks) {
      Costs c;
      c.f = rate(rows) * Flops(in, r) * rows;
      c.b = 2 * c.f;
      c.i = c.w = c.f;
      m.costs.per_stage.push_back(c);
    }
    return m;
  };
  in.measured = {run(2), run(8)};
  in.schedule = ScheduleKind::k1F1B;
  EXPECT_EQ(DescribeEfficiency({{2, 1.5}, {8, 1}}), "per micro-batch size 2 rows x1.50, 8 rows x1.00");
  // Gpt()'s batch is 16: M = 16, 8, 4, 2 give 1, 2, 4, 8 rows.
  for (const auto& [m, want_rate] : std::vector<std::pair<int, double>>{
           {16, 3e-6}, {8, 3e-6}, {4, 2.5e-6}, {2, 2e-6}}) {
    const double rows = 16.0 / m;
    in.microbatches = m;
    absl::StatusOr<Plan> plan = PlanPipeline(in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->cost_source, "rows 2 + rows 8");
    ASSERT_EQ(plan->efficiency.size(), 2u);
    EXPECT_NEAR(plan->efficiency[0].second, 1.5, 1e-9);
    Costs want;
    for (const BlockRange& r : *blocks) {
      Costs c;
      c.f = want_rate * Flops(in, r) * rows;
      c.b = 2 * c.f;
      want.per_stage.push_back(c);
    }
    const double makespan = Makespan1F1B(2, m, want);
    EXPECT_NEAR(plan->ranked[0].step_time, makespan, 1e-6 * makespan) << "M=" << m;
  }
  // One run: one rate for every size.
  in.measured = {run(8)};
  absl::StatusOr<Plan> one = PlanPipeline(in);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->efficiency.size(), 1u);
  EXPECT_EQ(one->efficiency[0].second, 1);
}

TEST(PlannerTest, RefusesWhatCannotRunNamingTheField) {
  PlannerInput in = AutoInput(Gpt(), 9);  // 8 blocks
  absl::StatusOr<Plan> plan = PlanPipeline(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "pipeline.stages")) << plan.status();
  in = AutoInput(Gpt(), 2);
  in.microbatches = 5;
  plan = PlanPipeline(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "pipeline.microbatches"))
      << plan.status();
}

}  // namespace
}  // namespace baton
