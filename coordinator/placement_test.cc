#include "coordinator/placement.h"

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/nn/model.h"
#include "common/plan/clock_proto.h"
#include "common/plan/planner.h"
#include "common/rpc/rpc.h"
#include "common/schedule/generators.h"
#include "common/spec/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

baton::v1::JobSpec MlpSpec(baton::v1::Schedule schedule, int stages, int virtual_stages,
                           int microbatches, int depth = 7) {
  baton::v1::JobSpec spec;
  spec.set_name("placement");
  baton::v1::MlpSpec* mlp = spec.mutable_model()->mutable_mlp();
  mlp->set_input_dim(8);
  mlp->set_width(16);
  mlp->set_depth(depth);
  mlp->set_output_dim(4);
  spec.mutable_data()->mutable_synthetic();
  spec.mutable_data()->set_batch_size(microbatches * 2);
  spec.mutable_pipeline()->set_schedule(schedule);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_virtual_stages(virtual_stages);
  spec.mutable_pipeline()->set_microbatches(microbatches);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(3);
  spec.set_seed(5);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  return spec;
}

std::vector<PlacedWorker> Workers(int n) {
  std::vector<PlacedWorker> out;
  for (int i = 0; i < n; ++i) {
    PlacedWorker w;
    w.worker_id = absl::StrCat("w-", i + 1);
    w.address = absl::StrCat("127.0.0.1:", 6000 + i);
    out.push_back(std::move(w));
  }
  return out;
}

std::vector<baton::v1::WorkerInfo> Idle(const std::string& kinds) {
  std::vector<baton::v1::WorkerInfo> out;
  for (size_t i = 0; i < kinds.size(); ++i) {
    baton::v1::WorkerInfo w;
    w.set_worker_id(absl::StrCat("w-", i));
    w.mutable_device()->set_kind(kinds[i] == 'g' ? "cuda" : "cpu");
    out.push_back(w);
  }
  return out;
}

TEST(ChooseWorkersTest, ByTheSpecsDeviceNeverMixing) {
  baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 2);
  std::string waiting;
  // cuda: GPU workers only, and waits with a reason when too few are idle.
  spec.set_device(baton::v1::DEVICE_KIND_CUDA);
  EXPECT_FALSE(ChooseWorkers(spec, Idle("cgc"), {}, &waiting).has_value());
  EXPECT_EQ(waiting, "waiting for 2 idle GPU workers (1 idle; the job asks for device cuda)");
  std::optional<WorkerChoice> c = ChooseWorkers(spec, Idle("cgcg"), {}, &waiting);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(c->device, Device::kCuda);
  // cpu: CPU-only workers first, GPU workers when short.
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  c = ChooseWorkers(spec, Idle("gcgc"), {}, &waiting);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(c->device, Device::kCpu);
  c = ChooseWorkers(spec, Idle("gcg"), {}, &waiting);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(c->device, Device::kCpu);
  // auto: cuda when enough GPU workers are idle, else cpu on CPU-only workers first.
  spec.set_device(baton::v1::DEVICE_KIND_UNSPECIFIED);
  c = ChooseWorkers(spec, Idle("cgcg"), {}, &waiting);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->device, Device::kCuda);
  EXPECT_EQ(c->why, "cuda: every worker has a GPU");
  c = ChooseWorkers(spec, Idle("gcc"), {}, &waiting);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->device, Device::kCpu);
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(c->why, "cpu: fewer than 2 idle workers have a GPU");
  // Taken workers are skipped; too few left waits.
  c = ChooseWorkers(spec, Idle("ggc"), {true, false, false}, &waiting);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->device, Device::kCpu);
  EXPECT_FALSE(ChooseWorkers(spec, Idle("g"), {}, &waiting).has_value());
  EXPECT_EQ(waiting, "waiting for 2 idle workers (1 idle)");
}

// A rank goes only where it fits: workers are chosen by the memory they registered (what
// their limits allow), and a job no registered worker can hold waits saying so.
TEST(ChooseWorkersTest, OnlyWorkersWhoseMemoryHoldsAStage) {
  baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 2);
  spec.mutable_model()->mutable_mlp()->set_width(4096);  // ~0.9 GiB a stage by the estimate
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  const int64_t stage = RankNeedBytes(spec);
  ASSERT_GT(stage, int64_t{256} << 20);
  std::vector<baton::v1::WorkerInfo> idle = Idle("cccc");
  const int64_t small = int64_t{128} << 20, large = int64_t{8} << 30;
  for (int i : {0, 1, 2}) idle[i].mutable_device()->set_memory_bytes(small);
  idle[3].mutable_device()->set_memory_bytes(large);
  std::string waiting;
  EXPECT_FALSE(ChooseWorkers(spec, idle, {}, &waiting, stage, large).has_value());
  EXPECT_THAT(waiting, HasSubstr("waiting for 2 idle workers with at least"));
  EXPECT_THAT(waiting, HasSubstr("(1 idle; 3 more too small for a rank)"));
  idle[1].mutable_device()->set_memory_bytes(0);  // unknown: taken as enough
  std::optional<WorkerChoice> c = ChooseWorkers(spec, idle, {}, &waiting, stage, large);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 3}));
  // No registered worker, busy ones included, is large enough: the job waits saying so.
  EXPECT_FALSE(ChooseWorkers(spec, idle, {}, &waiting, stage, small).has_value());
  EXPECT_THAT(waiting, HasSubstr("no registered worker can hold a rank of this job"));
  // The need is the planner's per-rank model: 1F1B keeps fewer micro-batches in flight on
  // the last rank than GPipe does.
  baton::v1::JobSpec gpipe = spec;
  gpipe.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_GPIPE);
  gpipe.mutable_pipeline()->set_microbatches(8);
  gpipe.mutable_data()->set_batch_size(64);
  baton::v1::JobSpec f1b = gpipe;
  f1b.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_1F1B);
  EXPECT_LE(RankNeedBytes(f1b), RankNeedBytes(gpipe));
}

// Mixed workers: each rank goes on a worker that holds its own share (the largest ranks
// first), the fastest adequate workers first; alike workers still go out in order.
TEST(ChooseWorkersTest, EachRankOnAWorkerThatHoldsItsShareFastestFirst) {
  baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 2);
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  const int64_t gib = int64_t{1} << 30;
  std::vector<baton::v1::WorkerInfo> idle = Idle("cc");
  idle[0].mutable_device()->set_memory_bytes(2 * gib);
  idle[1].mutable_device()->set_memory_bytes(8 * gib);
  std::string waiting;
  // Rank 0 needs 4 GiB, rank 1 1 GiB: the 2 GiB worker is of use, for rank 1.
  std::optional<WorkerChoice> c =
      ChooseWorkers(spec, idle, {}, &waiting, 4 * gib, 8 * gib, {4 * gib, 1 * gib});
  ASSERT_TRUE(c.has_value()) << waiting;
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 0}));
  // Without the per-rank shares, every rank counts as the busiest: the 2 GiB worker is not.
  EXPECT_FALSE(ChooseWorkers(spec, idle, {}, &waiting, 4 * gib, 8 * gib).has_value());
  EXPECT_THAT(waiting, HasSubstr("1 more too small for a rank"));

  // Faster workers first, whatever their place in the list.
  idle = Idle("cccc");
  for (int i = 0; i < 4; ++i) {
    idle[i].mutable_device()->set_peak_flops(i == 1 || i == 3 ? 5e12 : 1e12);
  }
  c = ChooseWorkers(spec, idle, {}, &waiting, 0, 0, {gib, gib});
  ASSERT_TRUE(c.has_value()) << waiting;
  EXPECT_EQ(c->indices, (std::vector<size_t>{1, 3}));
  // Alike workers: in order, rank r on the r-th.
  idle = Idle("cccc");
  c = ChooseWorkers(spec, idle, {}, &waiting, 0, 0, {gib, 3 * gib});
  ASSERT_TRUE(c.has_value()) << waiting;
  EXPECT_EQ(c->indices, (std::vector<size_t>{0, 1}));
}

// A rank that fits no registered worker waits naming the rank, its stage and its bytes; one
// that fits no idle worker says how many idle ones hold it.
TEST(ChooseWorkersTest, ARankThatFitsNowhereIsNamedWithItsBytes) {
  baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 2);
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  const int64_t gib = int64_t{1} << 30;
  std::vector<baton::v1::WorkerInfo> idle = Idle("ccc");
  idle[0].mutable_device()->set_memory_bytes(8 * gib);
  idle[1].mutable_device()->set_memory_bytes(2 * gib);
  idle[2].mutable_device()->set_memory_bytes(2 * gib);
  std::string waiting;
  EXPECT_FALSE(
      ChooseWorkers(spec, idle, {}, &waiting, 9 * gib, 8 * gib, {gib, 9 * gib}).has_value());
  EXPECT_THAT(waiting, HasSubstr("no registered worker can hold rank 1 (stage 1) of this job "
                                 "(it needs about 9 GiB; the largest worker has 8 GiB"));
  baton::v1::JobSpec three = MlpSpec(baton::v1::SCHEDULE_1F1B, 3, 1, 2);
  three.set_device(baton::v1::DEVICE_KIND_CPU);
  idle[1].mutable_device()->set_memory_bytes(6 * gib);
  idle[2].mutable_device()->set_memory_bytes(6 * gib);
  EXPECT_FALSE(ChooseWorkers(three, idle, {}, &waiting, 7 * gib, 8 * gib,
                             {5 * gib, 7 * gib, 7 * gib})
                   .has_value());
  EXPECT_THAT(waiting, HasSubstr("waiting for idle workers that hold each rank: rank 2 (stage "
                                 "2) needs about 7 GiB and 2 ranks need that much (1 idle "
                                 "worker has it)"));
  // The planner's per-rank model: as many shares as ranks, the largest RankNeedBytes.
  const std::vector<int64_t> needs = RankNeeds(spec);
  ASSERT_EQ(needs.size(), 2u);
  EXPECT_EQ(*std::max_element(needs.begin(), needs.end()), RankNeedBytes(spec));
}

TEST(PlaceJobTest, ThePlansSayTheDevice) {
  const baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 2);
  for (Device d : {Device::kCpu, Device::kCuda}) {
    absl::StatusOr<Placement> p = PlaceJob(spec, "job-1", 1, Workers(2), absl::Seconds(5), d);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->report.device(), DeviceName(d));
    for (const baton::v1::JobPlan& plan : p->plans) {
      EXPECT_EQ(plan.spec().device(),
                d == Device::kCuda ? baton::v1::DEVICE_KIND_CUDA : baton::v1::DEVICE_KIND_CPU);
    }
  }
}

TEST(PlaceJobTest, TheReportNamesEachKernelSetOnceInRankOrder) {
  const baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 4, 1, 4);
  std::vector<PlacedWorker> workers = Workers(4);
  const char* kernels[] = {"OpenBLAS 0.3.21, SkylakeX kernels", "",
                           "OpenBLAS 0.3.21, Haswell kernels", "OpenBLAS 0.3.21, SkylakeX kernels"};
  for (int i = 0; i < 4; ++i) workers[i].device.set_kernels(kernels[i]);
  absl::StatusOr<Placement> cpu = PlaceJob(spec, "job-1", 1, workers, absl::Seconds(5));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_EQ(cpu->report.kernels_size(), 2);
  EXPECT_EQ(cpu->report.kernels(0), "OpenBLAS 0.3.21, SkylakeX kernels");
  EXPECT_EQ(cpu->report.kernels(1), "OpenBLAS 0.3.21, Haswell kernels");
  // A GPU job computes on no CPU kernels.
  absl::StatusOr<Placement> gpu =
      PlaceJob(spec, "job-1", 1, workers, absl::Seconds(5), Device::kCuda);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->report.kernels_size(), 0);
}

// Workers with the given fp32 and bf16 peaks (FLOP/s; 0: unknown).
std::vector<PlacedWorker> WorkersWithPeaks(const std::vector<double>& fp32,
                                           const std::vector<double>& bf16 = {}) {
  std::vector<PlacedWorker> out = Workers(static_cast<int>(fp32.size()));
  for (size_t i = 0; i < fp32.size(); ++i) {
    out[i].device.set_peak_flops(fp32[i]);
    out[i].device.set_peak_flops_bf16(i < bf16.size() ? bf16[i] : 0);
  }
  return out;
}

// The receive deadline a job's planned step asks for: 16 serial steps at the slowest peak.
absl::Duration Sixteen(double flops, double peak) {
  return absl::Seconds(std::ceil(kReceiveHeadroom * flops / peak));
}

TEST(PlannedReceiveTimeoutTest, ASmallJobOrAnUnknownPeakKeepsTheFloor) {
  const baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 2);
  const std::vector<BlockInfo> blocks = DescribeBlocks(spec.model());
  EXPECT_EQ(PlannedReceiveTimeout(spec, blocks, WorkersWithPeaks({1e9, 1e9}), absl::Seconds(60)),
            absl::Seconds(60));
  baton::v1::JobSpec big = spec;
  big.mutable_model()->mutable_mlp()->set_width(4096);
  const std::vector<BlockInfo> big_blocks = DescribeBlocks(big.model());
  EXPECT_GT(PlannedReceiveTimeout(big, big_blocks, WorkersWithPeaks({1e6, 1e6}), absl::Seconds(60)),
            absl::Seconds(60));
  // One worker whose peak is unknown: nothing to plan with.
  EXPECT_EQ(PlannedReceiveTimeout(big, big_blocks, WorkersWithPeaks({1e6, 0}), absl::Seconds(60)),
            absl::Seconds(60));
}

TEST(PlannedReceiveTimeoutTest, ALongStepRaisesItToSixteenSerialStepsOnTheSlowestWorker) {
  baton::v1::JobSpec spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 4);
  spec.mutable_model()->mutable_mlp()->set_width(4096);
  spec.mutable_data()->set_batch_size(64);
  const std::vector<BlockInfo> blocks = DescribeBlocks(spec.model());
  const double flops = TrainingFlops(blocks, 0, static_cast<int>(blocks.size()), 64);
  const absl::Duration want = Sixteen(flops, 1e9);
  ASSERT_GT(want, absl::Seconds(60));
  EXPECT_EQ(PlannedReceiveTimeout(spec, blocks, WorkersWithPeaks({1e10, 1e9}), absl::Seconds(60)),
            want);
  // A floor above it stays.
  EXPECT_EQ(PlannedReceiveTimeout(spec, blocks, WorkersWithPeaks({1e10, 1e9}), want * 2), want * 2);

  // Every plan and the report carry it.
  absl::StatusOr<Placement> p =
      PlaceJob(spec, "job-1", 1, WorkersWithPeaks({1e10, 1e9}), absl::Seconds(60));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(FromProtoDuration(p->report.recv_timeout()), want);
  for (const baton::v1::JobPlan& plan : p->plans) {
    EXPECT_EQ(FromProtoDuration(plan.recv_timeout()), want);
  }

  // Recomputation's extra forward: a third more.
  baton::v1::JobSpec recompute = spec;
  recompute.mutable_pipeline()->set_recompute(baton::v1::RECOMPUTE_FULL);
  EXPECT_EQ(
      PlannedReceiveTimeout(recompute, blocks, WorkersWithPeaks({1e9, 1e9}), absl::Seconds(60)),
      Sixteen(flops * 4 / 3, 1e9));

  // A bf16 job plans with the bf16 peaks.
  baton::v1::JobSpec bf16 = spec;
  bf16.set_precision(baton::v1::PRECISION_BF16);
  EXPECT_EQ(PlannedReceiveTimeout(bf16, blocks, WorkersWithPeaks({1e9, 1e9}, {4e9, 8e9}),
                                  absl::Seconds(60)),
            Sixteen(flops, 4e9));
  EXPECT_EQ(PlannedReceiveTimeout(bf16, blocks, WorkersWithPeaks({1e9, 1e9}), absl::Seconds(60)),
            absl::Seconds(60));  // their bf16 peaks are unknown

  // Replicas: each trains on its share of the batch, and sends its gradients out and back.
  baton::v1::JobSpec dp = spec;
  dp.mutable_pipeline()->set_data_parallel(2);
  double parameters = 0;
  for (const BlockInfo& b : blocks) parameters += static_cast<double>(b.parameters);
  const double seconds = TrainingFlops(blocks, 0, static_cast<int>(blocks.size()), 32) / 1e9 +
                         8 * parameters / kPlannedReplicaBytesPerSecond;
  EXPECT_EQ(
      PlannedReceiveTimeout(dp, blocks, WorkersWithPeaks({1e9, 1e9, 1e9, 1e9}), absl::Seconds(60)),
      absl::Seconds(std::ceil(kReceiveHeadroom * seconds)));

  // At most a day.
  EXPECT_EQ(PlannedReceiveTimeout(spec, blocks, WorkersWithPeaks({1, 1}), absl::Seconds(60)),
            absl::Hours(24));
}

struct Case {
  baton::v1::Schedule schedule;
  ScheduleKind kind;
  int stages, virtual_stages, microbatches;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << ScheduleKindName(c.kind) << " S=" << c.stages << " V=" << c.virtual_stages
      << " M=" << c.microbatches;
}

class PlacementTest : public testing::TestWithParam<Case> {};

TEST_P(PlacementTest, EveryRankGetsTheValidatedClockAndItsBlocks) {
  const Case c = GetParam();
  const baton::v1::JobSpec spec = MlpSpec(c.schedule, c.stages, c.virtual_stages, c.microbatches);
  auto placement = PlaceJob(spec, "job-000007", 7, Workers(c.stages), absl::Seconds(42));
  ASSERT_TRUE(placement.ok()) << placement.status();

  ScheduleOptions o;
  o.kind = c.kind;
  o.num_ranks = c.stages;
  o.virtual_stages = c.virtual_stages;
  o.num_microbatches = c.microbatches;
  o.num_blocks = ModelBlockCount(spec.model());
  auto expected = BuildSchedule(o);
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto ranges = PartitionBlocks(DescribeBlocks(spec.model()), c.stages * c.virtual_stages);
  ASSERT_TRUE(ranges.ok());

  ASSERT_EQ(placement->plans.size(), static_cast<size_t>(c.stages));
  for (int r = 0; r < c.stages; ++r) {
    const baton::v1::JobPlan& plan = placement->plans[r];
    EXPECT_EQ(plan.job_id(), "job-000007");
    EXPECT_EQ(plan.job_key(), 7u);
    EXPECT_EQ(plan.rank(), r);
    EXPECT_EQ(plan.num_ranks(), c.stages);
    EXPECT_EQ(plan.schedule_kind(), ScheduleKindToProto(c.kind));
    EXPECT_EQ(plan.virtual_stages(), c.virtual_stages);
    EXPECT_EQ(plan.microbatches(), c.microbatches);
    baton::v1::JobSpec want = spec;  // the spec, with the device placement chose
    want.set_device(baton::v1::DEVICE_KIND_CPU);
    EXPECT_EQ(plan.spec().SerializeAsString(), want.SerializeAsString());
    EXPECT_EQ(FromProtoDuration(plan.recv_timeout()), absl::Seconds(42));
    // The clock reads back to exactly BuildSchedule's.
    std::vector<Action> clock;
    for (const baton::v1::PlanAction& p : plan.clock()) {
      auto a = ActionFromProto(p);
      ASSERT_TRUE(a.ok()) << a.status();
      clock.push_back(*a);
    }
    EXPECT_EQ(clock, expected->ranks[r]) << "rank " << r;
    EXPECT_EQ(clock.back().kind, ActionKind::kStep);
    ASSERT_EQ(plan.stage_to_rank_size(), c.stages * c.virtual_stages);
    for (int s = 0; s < plan.stage_to_rank_size(); ++s) {
      EXPECT_EQ(plan.stage_to_rank(s), expected->stage_to_rank[s]);
    }
    // Stages: contiguous, non-empty, covering every block, as PartitionBlocks splits them.
    ASSERT_EQ(plan.stages_size(), c.stages * c.virtual_stages);
    int next = 0;
    for (int s = 0; s < plan.stages_size(); ++s) {
      EXPECT_EQ(plan.stages(s).stage(), s);
      EXPECT_EQ(plan.stages(s).first_block(), next);
      EXPECT_GT(plan.stages(s).last_block(), plan.stages(s).first_block());
      EXPECT_EQ(plan.stages(s).first_block(), (*ranges)[s].first);
      EXPECT_EQ(plan.stages(s).last_block(), (*ranges)[s].last);
      next = plan.stages(s).last_block();
    }
    EXPECT_EQ(next, ModelBlockCount(spec.model()));
    ASSERT_EQ(plan.peers_size(), c.stages);
    for (int p = 0; p < c.stages; ++p) {
      EXPECT_EQ(plan.peers(p).rank(), p);
      EXPECT_EQ(plan.peers(p).worker_id(), absl::StrCat("w-", p + 1));
      EXPECT_EQ(plan.peers(p).address(), absl::StrCat("127.0.0.1:", 6000 + p));
    }
  }
  const PipelineLayout& layout = placement->layout;
  EXPECT_EQ(layout.last_rank, expected->stage_to_rank.back());
  int owned = 0;
  for (const auto& blocks : layout.rank_blocks) owned += static_cast<int>(blocks.size());
  EXPECT_EQ(owned, ModelBlockCount(spec.model()));
  EXPECT_EQ(placement->report.schedule(), ScheduleKindName(c.kind));
  EXPECT_EQ(placement->report.stage_blocks_size(), c.stages * c.virtual_stages);
  EXPECT_EQ(placement->report.stage_blocks(0), absl::StrCat("0-", (*ranges)[0].last - 1));
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PlacementTest,
    testing::Values(Case{baton::v1::SCHEDULE_GPIPE, ScheduleKind::kGpipe, 2, 1, 4},
                    Case{baton::v1::SCHEDULE_1F1B, ScheduleKind::k1F1B, 4, 1, 8},
                    Case{baton::v1::SCHEDULE_1F1B, ScheduleKind::k1F1B, 1, 1, 2},
                    Case{baton::v1::SCHEDULE_INTERLEAVED_1F1B, ScheduleKind::kInterleaved1F1B, 2, 2,
                         4},
                    Case{baton::v1::SCHEDULE_ZB_H1, ScheduleKind::kZbH1, 3, 1, 6}),
    [](const testing::TestParamInfo<Case>& info) {
      std::string name = ScheduleKindName(info.param.kind);
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return absl::StrCat(name, "_S", info.param.stages, "_V", info.param.virtual_stages, "_M",
                          info.param.microbatches);
    });

TEST(PlacementErrors, ImpossiblePipelinesNameTheField) {
  // 1F1B with two chunks per rank.
  auto spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 4);
  spec.mutable_pipeline()->set_virtual_stages(2);
  auto layout = BuildPipelineLayout(spec);
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.status().message().rfind("pipeline: ", 0), 0u) << layout.status();
  EXPECT_NE(layout.status().message().find("pipeline.virtual_stages"), std::string::npos);

  // Interleaved with M not a multiple of S.
  spec = MlpSpec(baton::v1::SCHEDULE_INTERLEAVED_1F1B, 2, 2, 4);
  spec.mutable_pipeline()->set_microbatches(3);
  layout = BuildPipelineLayout(spec);
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find("microbatches"), std::string::npos);

  // The wrong number of workers.
  spec = MlpSpec(baton::v1::SCHEDULE_1F1B, 2, 1, 4);
  auto placement = PlaceJob(spec, "job-1", 1, Workers(3), absl::Seconds(1));
  ASSERT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(placement.status().message().find("pipeline.stages"), std::string::npos);
}

TEST(PlacementCost, SplitsByForwardFlopsAsPartitionBlocksDoes) {
  // GPT: the embedding has many parameters but few FLOPs; the split follows FLOPs.
  baton::v1::JobSpec spec;
  baton::v1::GptSpec* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_vocab_size(512);
  gpt->set_context(16);
  gpt->set_d_model(32);
  gpt->set_heads(4);
  gpt->set_layers(4);
  spec.mutable_data()->mutable_text()->set_inline_text("hello world");
  spec.mutable_data()->set_batch_size(4);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(1);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  auto layout = BuildPipelineLayout(spec);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const auto blocks = DescribeBlocks(spec.model());
  auto by_flops = PartitionBlocks(blocks, 2);
  ASSERT_TRUE(by_flops.ok());
  ASSERT_EQ(layout->stage_blocks.size(), 2u);
  EXPECT_EQ(layout->stage_blocks[0].last, (*by_flops)[0].last);
}

}  // namespace
}  // namespace baton
