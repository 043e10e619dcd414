// The queue policy (queue_policy.h), table by table: order, backfill, jobs that can never
// run, quotas, reservations, recovery, preemption.
#include "coordinator/queue_policy.h"

#include <string>
#include <vector>

#include "common/spec/spec.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

baton::v1::WorkerInfo Worker(const std::string& id, bool gpu = false, int64_t memory = 0) {
  baton::v1::WorkerInfo w;
  w.set_worker_id(id);
  w.set_address(id + ":1");
  w.mutable_device()->set_kind(gpu ? "cuda" : "cpu");
  w.mutable_device()->set_memory_bytes(memory);
  return w;
}

std::vector<baton::v1::WorkerInfo> Workers(int n, bool gpu = false) {
  std::vector<baton::v1::WorkerInfo> out;
  for (int i = 0; i < n; ++i) out.push_back(Worker("w-" + std::to_string(i + 1), gpu));
  return out;
}

// A job of `stages` stages (an mlp deep enough for 70), submitted as number `seq`, queued
// `waited` ago.
QueuedJob Job(const std::string& id, int stages, int priority = 0, int64_t seq = 0,
              absl::Duration waited = absl::Seconds(1), const std::string& user = "alice") {
  absl::StatusOr<baton::v1::JobSpec> spec = ParseJobSpecJson(R"({
    "model": {"mlp": {"inputDim": 4, "width": 8, "depth": 70, "outputDim": 2}},
    "data": {"synthetic": {}, "batchSize": 8},
    "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": 1})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  const absl::Status valid = ValidateAndDefaultJobSpec(&*spec);
  EXPECT_TRUE(valid.ok()) << valid;
  SetPipelineStages(&*spec, stages);
  spec->set_priority(priority);
  QueuedJob j;
  j.id = id;
  j.spec = std::make_shared<baton::v1::JobSpec>(*spec);
  j.seq = seq;
  j.queued_since = kNow - waited;
  j.user = user;
  return j;
}

std::shared_ptr<const baton::v1::JobSpec> WithDevice(const QueuedJob& j,
                                                     baton::v1::DeviceKind device) {
  auto spec = std::make_shared<baton::v1::JobSpec>(*j.spec);
  spec->set_device(device);
  return spec;
}

std::vector<std::string> Started(const QueueRound& r) {
  std::vector<std::string> out;
  for (const auto& s : r.starts) out.push_back(s.id);
  return out;
}

const QueueRound::Wait* WaitOf(const QueueRound& r, const std::string& id) {
  for (const auto& w : r.waits) {
    if (w.id == id) return &w;
  }
  return nullptr;
}

QueueRoundInput Input(std::vector<QueuedJob> queue, int idle, int busy = 0) {
  QueueRoundInput in;
  in.queue = std::move(queue);
  in.idle = Workers(idle);
  in.registered = in.idle;
  for (int i = 0; i < busy; ++i) in.registered.push_back(Worker("busy-" + std::to_string(i)));
  in.now = kNow;
  in.reserve_after = absl::Minutes(5);
  return in;
}

TEST(QueuePolicyTest, HigherPriorityFirstThenSubmissionOrder) {
  QueueRound r = PlanQueueRound(
      Input({Job("a", 2, 0, 1), Job("b", 2, 5, 2), Job("c", 2, 5, 3), Job("d", 2, -1, 0)}, 4));
  EXPECT_EQ(Started(r), (std::vector<std::string>{"b", "c"}));
  ASSERT_EQ(r.waits.size(), 2u);
  EXPECT_EQ(r.waits[0].id, "a");
  EXPECT_EQ(r.waits[0].position, 1);  // the started ones are not counted
  EXPECT_EQ(r.waits[1].id, "d");
  EXPECT_EQ(r.waits[1].position, 2);
  EXPECT_NE(r.waits[1].reason.find("behind the first in line: waiting for 2 idle workers"),
            std::string::npos)
      << r.waits[1].reason;
  EXPECT_NE(r.waits[1].reason.find("the first is a"), std::string::npos) << r.waits[1].reason;
}

// The 65-stage job on 2 workers waits saying it cannot run, and holds no one up.
TEST(QueuePolicyTest, AJobNoRegisteredWorkersCanRunBlocksNoOne) {
  QueueRound r = PlanQueueRound(Input({Job("huge", 65, 0, 1), Job("small", 2, 0, 2)}, 2));
  EXPECT_EQ(Started(r), (std::vector<std::string>{"small"}));
  const QueueRound::Wait* w = WaitOf(r, "huge");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->position, 1);
  EXPECT_NE(w->reason.find("cannot run on the workers registered now"), std::string::npos)
      << w->reason;
  EXPECT_NE(w->reason.find("65"), std::string::npos) << w->reason;
  EXPECT_TRUE(r.reserved_for.empty());
}

TEST(QueuePolicyTest, AJobAskingForAGpuNoWorkerHasBlocksNoOne) {
  QueuedJob gpu = Job("gpu", 1, 0, 1);
  gpu.spec = WithDevice(gpu, baton::v1::DEVICE_KIND_CUDA);
  QueueRound r = PlanQueueRound(Input({gpu, Job("cpu", 1, 0, 2)}, 2));
  EXPECT_EQ(Started(r), (std::vector<std::string>{"cpu"}));
  EXPECT_NE(WaitOf(r, "gpu")->reason.find("GPU"), std::string::npos) << WaitOf(r, "gpu")->reason;
}

// A head job that fits later (2 of 4 workers busy) lets smaller jobs start on idle workers
// until it has waited reserve_after; then it holds the idle workers it can use.
TEST(QueuePolicyTest, BackfillUntilTheHeadHasWaitedThenAReservation) {
  QueueRoundInput young = Input({Job("head", 4, 0, 1, absl::Minutes(1)), Job("small", 1, 0, 2)},
                                2, /*busy=*/2);
  QueueRound r = PlanQueueRound(young);
  EXPECT_EQ(Started(r), (std::vector<std::string>{"small"}));
  EXPECT_TRUE(r.reserved_for.empty());
  EXPECT_NE(WaitOf(r, "head")->reason.find("first in line"), std::string::npos);

  QueueRoundInput old = young;
  old.queue[0].queued_since = kNow - absl::Minutes(6);
  r = PlanQueueRound(old);
  EXPECT_TRUE(r.starts.empty());
  EXPECT_EQ(r.reserved_for, "head");
  EXPECT_EQ(r.reserved_workers, 2);
  EXPECT_NE(WaitOf(r, "head")->reason.find("holds the 2 idle workers"), std::string::npos)
      << WaitOf(r, "head")->reason;
  EXPECT_NE(WaitOf(r, "small")->reason.find("the first is head, which holds 2 idle workers"),
            std::string::npos)
      << WaitOf(r, "small")->reason;
}

// A reservation keeps only what the head can use: a CPU job behind a reserved GPU head still
// starts on the CPU workers, which cannot delay it.
TEST(QueuePolicyTest, AReservationLeavesWorkersTheHeadCannotUse) {
  QueuedJob head = Job("gpu-head", 2, 0, 1, absl::Minutes(10));
  head.spec = WithDevice(head, baton::v1::DEVICE_KIND_CUDA);
  QueuedJob cpu_job = Job("cpu-job", 2, 0, 2);
  cpu_job.spec = WithDevice(cpu_job, baton::v1::DEVICE_KIND_CPU);
  QueueRoundInput in = Input({head, cpu_job}, 0);
  in.idle = {Worker("g-1", true), Worker("c-1"), Worker("c-2")};
  in.registered = in.idle;
  in.registered.push_back(Worker("g-2", true));  // busy
  QueueRound r = PlanQueueRound(in);
  EXPECT_EQ(r.reserved_for, "gpu-head");
  EXPECT_EQ(r.reserved_workers, 1);
  ASSERT_EQ(Started(r), (std::vector<std::string>{"cpu-job"}));
  EXPECT_EQ(r.starts[0].choice.indices, (std::vector<size_t>{1, 2}));
}

TEST(QueuePolicyTest, AUserOverItsWorkerQuotaWaitsAndOthersStart) {
  QueuedJob a = Job("alice-2", 2, 0, 1, absl::Seconds(1), "alice");
  a.limits.max_workers = 3;
  QueuedJob b = Job("bob-2", 2, 0, 2, absl::Seconds(1), "bob");
  QueueRoundInput in = Input({a, b}, 4);
  in.held_by_user["alice"] = 2;
  QueueRound r = PlanQueueRound(in);
  EXPECT_EQ(Started(r), (std::vector<std::string>{"bob-2"}));
  EXPECT_NE(WaitOf(r, "alice-2")->reason.find("user alice holds 2 of its 3 workers"),
            std::string::npos)
      << WaitOf(r, "alice-2")->reason;
  // Within the quota, two of alice's jobs start as long as they fit it together.
  QueuedJob a1 = Job("a1", 1, 0, 1), a2 = Job("a2", 1, 0, 2), a3 = Job("a3", 1, 0, 3);
  for (QueuedJob* j : {&a1, &a2, &a3}) j->limits.max_workers = 2;
  r = PlanQueueRound(Input({a1, a2, a3}, 4));
  EXPECT_EQ(Started(r), (std::vector<std::string>{"a1", "a2"}));
  EXPECT_NE(WaitOf(r, "a3")->reason.find("quota"), std::string::npos);
  // A job larger than the quota itself says it waits for the quota, not for workers.
  QueuedJob big = Job("big", 3, 0, 1);
  big.limits.max_workers = 2;
  r = PlanQueueRound(Input({big}, 4));
  EXPECT_EQ(WaitOf(r, "big")->reason,
            "user alice may hold 2 workers and this job needs 3 (quota max_workers); it runs "
            "once the quota is raised");
}

// A recovering job goes first, on fewer stages if it must; one still stopping its old
// workers waits without holding anyone up.
TEST(QueuePolicyTest, RecoveringJobsFirstOnFewerStagesAndStoppingOnesHoldNoOneUp) {
  QueuedJob rec = Job("rec", 4, -5, 9);
  rec.recovering = true;
  auto restart = std::make_shared<baton::v1::JobSpec>(*rec.spec);
  restart->mutable_restart()->set_max_restarts(1);
  restart->mutable_restart()->set_min_stages(2);
  rec.spec = restart;
  QueuedJob stopping = Job("stopping", 2, 0, 8);
  stopping.recovering = true;
  stopping.stopping = true;
  QueueRound r = PlanQueueRound(Input({Job("queued", 1, 10, 1), stopping, rec}, 3));
  // rec (priority -5) still goes before queued (priority 10), on the 3 workers there are.
  ASSERT_EQ(Started(r), (std::vector<std::string>{"rec"}));
  EXPECT_EQ(r.starts[0].spec.pipeline().stages(), 3);
  EXPECT_EQ(WaitOf(r, "queued")->position, 2);
  EXPECT_EQ(WaitOf(r, "stopping")->reason, "stopping the job's other workers");
}

TEST(QueuePolicyTest, ARoundStopsAtMaxStartsAndSaysThereIsMore) {
  QueueRoundInput in = Input({Job("a", 1, 0, 1), Job("b", 1, 0, 2), Job("c", 1, 0, 3)}, 3);
  in.max_starts = 2;
  QueueRound r = PlanQueueRound(in);
  EXPECT_EQ(Started(r), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.more);
  EXPECT_TRUE(r.waits.empty());  // c: the next round
  in.max_starts = 3;
  EXPECT_FALSE(PlanQueueRound(in).more);
}

// A running job as a preemption candidate: `n` workers named id-1.., started `ago`.
RunningJob Running(const std::string& id, int n, int priority, absl::Duration ago,
                   bool preemptible = true) {
  RunningJob r;
  r.id = id;
  r.priority = priority;
  for (int i = 0; i < n; ++i) r.workers.push_back(Worker(id + "-" + std::to_string(i + 1)));
  r.started = kNow - ago;
  r.preemptible = preemptible;
  return r;
}

QueueRoundInput WithRunning(QueueRoundInput in, std::vector<RunningJob> running) {
  for (const RunningJob& r : running) {
    for (const auto& w : r.workers) in.registered.push_back(w);
  }
  in.running = std::move(running);
  return in;
}

// The head preempts the newest lower-priority jobs, just enough of them, and holds the
// idle workers meanwhile; the jobs behind it do not take them.
TEST(QueuePolicyTest, AHigherPriorityHeadPreemptsTheNewestJobsJustEnough) {
  QueueRoundInput in = WithRunning(
      Input({Job("urgent", 4, 5, 1), Job("small", 1, 0, 2)}, 1),
      {Running("old", 2, 0, absl::Hours(2)), Running("new", 2, 0, absl::Minutes(5)),
       Running("newest", 1, 0, absl::Minutes(1))});
  QueueRound r = PlanQueueRound(in);
  ASSERT_TRUE(r.preemption.has_value());
  EXPECT_EQ(r.preemption->for_job, "urgent");
  // 1 idle + newest (1) + new (2) = 4: "old" keeps running.
  EXPECT_EQ(r.preemption->victims, (std::vector<std::string>{"newest", "new"}));
  EXPECT_EQ(r.reserved_for, "urgent");
  EXPECT_EQ(r.reserved_workers, 1);
  EXPECT_TRUE(r.starts.empty());  // "small" may not take the idle worker
  EXPECT_NE(WaitOf(r, "urgent")->reason.find("preempting lower-priority jobs: newest, new"),
            std::string::npos)
      << WaitOf(r, "urgent")->reason;

  // While they stop, it preempts no more and still holds the idle workers.
  in.queue[0].preempting = true;
  r = PlanQueueRound(in);
  EXPECT_FALSE(r.preemption.has_value());
  EXPECT_EQ(r.reserved_for, "urgent");
  EXPECT_TRUE(r.starts.empty());
  EXPECT_NE(WaitOf(r, "urgent")->reason.find("waiting for preempted jobs to stop"),
            std::string::npos);
}

// Among jobs started together, the one with the fewest workers goes first; a larger one
// that covers the need alone spares the smaller (no job stops for nothing).
TEST(QueuePolicyTest, PreemptionSparesJobsItDoesNotNeed) {
  const absl::Duration same = absl::Minutes(3);
  QueueRound r = PlanQueueRound(WithRunning(Input({Job("urgent", 3, 1, 1)}, 0),
                                            {Running("one", 1, 0, same), Running("three", 3, 0, same)}));
  ASSERT_TRUE(r.preemption.has_value());
  EXPECT_EQ(r.preemption->victims, (std::vector<std::string>{"three"}));
}

// Never preempted: a job of equal or higher priority, one not preemptible (no checkpoints,
// already stopping, nothing left to run), and nothing at all when even every candidate
// would not make room.
TEST(QueuePolicyTest, PreemptionOnlyOfLowerPriorityCheckpointingJobsAndOnlyIfItHelps) {
  QueueRound r = PlanQueueRound(WithRunning(
      Input({Job("urgent", 2, 5, 1)}, 0),
      {Running("same", 2, 5, absl::Minutes(1)), Running("higher", 2, 9, absl::Minutes(1)),
       Running("no-ckpt", 2, 0, absl::Minutes(1), /*preemptible=*/false)}));
  EXPECT_FALSE(r.preemption.has_value());
  EXPECT_TRUE(r.reserved_for.empty());
  EXPECT_NE(WaitOf(r, "urgent")->reason.find("first in line"), std::string::npos);

  r = PlanQueueRound(WithRunning(Input({Job("big", 4, 5, 1)}, 1),
                                 {Running("low", 2, 0, absl::Minutes(1))}));
  EXPECT_FALSE(r.preemption.has_value()) << "1 idle + 2 preempted cannot hold 4 stages";

  QueueRoundInput off = WithRunning(Input({Job("urgent", 2, 5, 1)}, 0),
                                    {Running("low", 2, 0, absl::Minutes(1))});
  off.preempt = false;
  EXPECT_FALSE(PlanQueueRound(off).preemption.has_value());
}

// Only workers the head can use count: preempting a CPU job frees nothing for a GPU job.
TEST(QueuePolicyTest, PreemptionFreesOnlyWorkersTheHeadCanUse) {
  QueuedJob gpu = Job("gpu", 1, 5, 1);
  gpu.spec = WithDevice(gpu, baton::v1::DEVICE_KIND_CUDA);
  RunningJob on_gpu = Running("on-gpu", 1, 0, absl::Minutes(1));
  on_gpu.workers[0] = Worker("g-1", /*gpu=*/true);
  QueueRound r = PlanQueueRound(
      WithRunning(Input({gpu}, 0), {Running("on-cpu", 1, 0, absl::Seconds(1)), on_gpu}));
  ASSERT_TRUE(r.preemption.has_value());
  EXPECT_EQ(r.preemption->victims, (std::vector<std::string>{"on-gpu"}));
}

TEST(QueuePolicyTest, AnEmptyQueueStartsNothing) {
  const QueueRound r = PlanQueueRound(Input({}, 3));
  EXPECT_TRUE(r.starts.empty());
  EXPECT_TRUE(r.waits.empty());
}

}  // namespace
}  // namespace baton
