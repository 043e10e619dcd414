#include "coordinator/coordinator.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/hf.h"
#include "common/core/digest.h"
#include "common/core/mutex.h"
#include "common/nn/model.h"
#include "common/plan/clock_proto.h"
#include "common/plan/partition.h"
#include "common/plan/planner.h"
#include "common/rpc/rpc.h"
#include "common/spec/spec.h"
#include "coordinator/fake_clock_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace baton {
namespace {

using baton::v1::Job;
using baton::v1::JobState;

using ::testing::HasSubstr;

using testing_util::FakeClock;

// Records every call; StartJob fails for addresses in fail_start.
class FakeWorkerClient final : public WorkerClient {
 public:
  struct Call {
    std::string kind;  // "start" or "abort"
    std::string address;
    std::string job_id;
    int rank = -1;
  };
  absl::Status StartJob(const WorkerEndpoint& worker, const baton::v1::JobPlan& plan,
                        absl::Duration) override {
    const std::string& address = worker.address;
    std::function<void(const baton::v1::JobPlan&)> hook;
    {
      MutexLock lock(mu_);
      calls_.push_back({"start", address, plan.job_id(), plan.rank()});
      plans_.push_back(plan);
      if (fail_start_.count(address) > 0) return absl::UnavailableError("connection refused");
      if (busy_[address] > 0) {
        --busy_[address];
        return absl::FailedPreconditionError("worker already runs job job-old");
      }
      hook = on_started_;
    }
    // What the worker does at once, before its answer reaches the coordinator.
    if (hook) hook(plan);
    return absl::OkStatus();
  }
  // Runs after each successful StartJob, before it returns (no lock of the coordinator's
  // is held then: the calls are made outside it).
  void OnStarted(std::function<void(const baton::v1::JobPlan&)> hook) {
    MutexLock lock(mu_);
    on_started_ = std::move(hook);
  }
  // The next `n` StartJob calls to `address` find the worker still busy.
  void BusyFor(const std::string& address, int n) {
    MutexLock lock(mu_);
    busy_[address] = n;
  }
  absl::StatusOr<AbortAnswer> AbortJob(const WorkerEndpoint& worker, const std::string& job_id,
                                       const std::string&, absl::Duration) override {
    const std::string& address = worker.address;
    MutexLock lock(mu_);
    calls_.push_back({"abort", address, job_id, -1});
    if (unreachable_.count(address) > 0) return absl::UnavailableError("connection refused");
    if (still_stopping_.count(address) > 0) return AbortAnswer::kStopping;
    return AbortAnswer::kStopped;
  }
  // The worker at `address` answers AbortJob that its job is still stopping.
  void StillStopping(const std::string& address) {
    MutexLock lock(mu_);
    still_stopping_.insert(address);
  }
  void Unreachable(const std::string& address) {
    MutexLock lock(mu_);
    unreachable_.insert(address);
  }
  // StartJob calls to `address` fail (UNAVAILABLE) from now on, or no more.
  void FailStart(const std::string& address, bool fail = true) {
    MutexLock lock(mu_);
    if (fail) {
      fail_start_.insert(address);
    } else {
      fail_start_.erase(address);
    }
  }
  std::vector<Call> Calls(const std::string& kind, const std::string& job_id) {
    MutexLock lock(mu_);
    std::vector<Call> out;
    for (const Call& c : calls_) {
      if (c.kind == kind && c.job_id == job_id) out.push_back(c);
    }
    return out;
  }
  std::vector<baton::v1::JobPlan> Plans(const std::string& job_id) {
    MutexLock lock(mu_);
    std::vector<baton::v1::JobPlan> out;
    for (const auto& p : plans_) {
      if (p.job_id() == job_id) out.push_back(p);
    }
    return out;
  }

 private:
  Mutex mu_;
  std::vector<Call> calls_;
  std::vector<baton::v1::JobPlan> plans_;
  std::set<std::string> fail_start_;
  std::set<std::string> unreachable_;
  std::set<std::string> still_stopping_;
  std::map<std::string, int> busy_;
  std::function<void(const baton::v1::JobPlan&)> on_started_;
};

baton::v1::JobSpec Spec(int stages, int steps = 2) {
  baton::v1::JobSpec spec;
  spec.set_name("test");
  baton::v1::MlpSpec* mlp = spec.mutable_model()->mutable_mlp();
  mlp->set_input_dim(4);
  mlp->set_width(8);
  mlp->set_depth(3);  // 4 blocks
  mlp->set_output_dim(2);
  spec.mutable_data()->mutable_synthetic();
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(steps);
  spec.set_seed(3);
  return spec;
}

// Spec() with a checkpoint every 2 steps in /shared/ckpt and one recovery, onto 2 stages
// or more.
baton::v1::JobSpec RecoverableSpec(int stages, int steps) {
  baton::v1::JobSpec spec = Spec(stages, steps);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  spec.mutable_restart()->set_max_restarts(1);
  spec.mutable_restart()->set_min_stages(2);
  return spec;
}

std::string Address(int i) { return absl::StrCat("10.0.0.", i, ":7000"); }

Digest FakeBlockDigest(int block) {
  Sha256 h;
  h.Update(&block, sizeof(block));
  return h.Finish();
}

class CoordinatorTest : public testing::Test {
 protected:
  void SetUp() override { Start(":memory:"); }

  // Every scenario's state changes follow the job life's table.
  void TearDown() override {
    if (core_ != nullptr) {
      EXPECT_EQ(core_->InvalidTransitions(), 0);
    }
    core_.reset();  // closes the job database before its directory goes
    if (!db_dir_.empty()) std::filesystem::remove_all(db_dir_);
  }

  // A job database in a temp directory of this test's own (removed at TearDown), for tests
  // that restart the coordinator on it.
  std::string TempDb() {
    if (db_dir_.empty()) {
      std::string tmpl = testing::TempDir() + "/coordinator_test.XXXXXX";
      EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
      db_dir_ = tmpl;
    }
    return db_dir_ + "/jobs.db";
  }

  void Start(const std::string& db) {
    if (core_ != nullptr) {
      EXPECT_EQ(core_->InvalidTransitions(), 0);
    }
    CoordinatorOptions o;
    o.db_path = db;
    o.clock = clock_.fn();
    o.sleep = [this](absl::Duration d) { clock_.Advance(d); };
    o.worker_client = client_;
    o.background = false;
    o.busy_retry = absl::Milliseconds(500);
    o.log = false;
    o.metrics = &metrics_;
    o.trace_steps = 2;
    o.quotas = quotas_.get();
    // Preemption's protection of a job just started or resumed is off unless a test sets
    // it (the fake clock does not move by itself).
    o.preempt_min_run = preempt_min_run_;
    o.preempt_min_steps = preempt_min_steps_;
    auto c = Coordinator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
  }

  std::string Register(int i) {
    baton::v1::RegisterWorkerRequest r;
    r.set_address(Address(i));
    auto resp = core_->RegisterWorker(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(FromProtoDuration(resp->lease_ttl()), absl::Seconds(5));
    EXPECT_EQ(FromProtoDuration(resp->heartbeat_interval()), absl::Seconds(1));
    return resp->worker_id();
  }

  baton::v1::HeartbeatResponse Beat(const std::string& worker, const std::string& job = "") {
    baton::v1::HeartbeatRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    auto resp = core_->Heartbeat(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return *resp;
  }

  // 6 s pass (more than the 5 s lease) in which only `alive` heartbeat, running `job`:
  // every other worker's lease expires at the next Tick.
  void OutliveLeases(const std::string& job, const std::vector<std::string>& alive) {
    for (int i = 0; i < 2; ++i) {
      clock_.Advance(absl::Seconds(3));
      for (const std::string& w : alive) Beat(w, job);
    }
  }

  Job Submit(const baton::v1::JobSpec& spec, const std::string& submission = "") {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = spec;
    r.set_submission_id(submission);
    auto job = core_->SubmitJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  Job Get(const std::string& id) {
    auto job = core_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  std::string Reason(const Job& job) {
    return job.history().empty() ? "" : job.history().rbegin()->reason();
  }

  baton::v1::WorkerState WorkerState(const std::string& id) {
    const baton::v1::ListWorkersResponse workers = core_->ListWorkers();
    for (const auto& w : workers.workers()) {
      if (w.worker_id() == id) return w.state();
    }
    return baton::v1::WORKER_STATE_UNSPECIFIED;
  }

  // Reports a successful result for every rank of `job`, with each block's fake digest.
  void FinishAllRanks(const Job& job) {
    const auto plans = client_->Plans(job.id());
    ASSERT_EQ(plans.size(), static_cast<size_t>(job.workers_size()));
    for (const auto& plan : plans) {
      baton::v1::ReportResultRequest r;
      r.set_job_id(job.id());
      r.set_rank(plan.rank());
      r.set_worker_id(job.workers(plan.rank()));
      for (const auto& stage : plan.stages()) {
        if (plan.stage_to_rank(stage.stage()) != plan.rank()) continue;
        for (int b = stage.first_block(); b < stage.last_block(); ++b) {
          auto* d = r.add_block_digests();
          d->set_index(b);
          d->mutable_digest()->set_sha256(DigestHex(FakeBlockDigest(b)));
        }
      }
      ASSERT_TRUE(core_->ReportResult(r).ok());
    }
  }

  // The registry's and the state collector's metrics in the text format.
  std::string MetricsText() {
    auto families = registry_.Collect();
    for (auto& f : metrics_.StateCollector()->Collect()) families.push_back(std::move(f));
    return prometheus::TextSerializer().Serialize(families);
  }

  FakeClock clock_;
  std::shared_ptr<FakeWorkerClient> client_ = std::make_shared<FakeWorkerClient>();
  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{registry_};
  std::unique_ptr<QuotaBook> quotas_;  // set before Start() to apply quotas
  absl::Duration preempt_min_run_ = absl::ZeroDuration();  // set before Start()
  int64_t preempt_min_steps_ = 1;
  std::unique_ptr<Coordinator> core_;
  std::string db_dir_;  // TempDb()
};

// A coordinator on a throw-away store, without a background loop or logs, for tests that
// need options the fixture does not set.
CoordinatorOptions QuietOptions() {
  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.background = false;
  o.log = false;
  o.worker_client = std::make_shared<FakeWorkerClient>();
  return o;
}

// Under mutual TLS a certificate of the cluster's CA is not enough to join as a worker: it
// must carry the worker URI SAN (make-certs.sh gives workers one, users' certificates none),
// and the join token still applies.
TEST(CoordinatorRegistrationTest, OnlyWorkerCertificatesRegisterUnderMutualTls) {
  CoordinatorOptions o = QuietOptions();
  o.require_worker_certificate = true;
  o.join_token = "join-token-0123456789abcdef";
  auto core = Coordinator::Create(o);
  ASSERT_TRUE(core.ok()) << core.status();
  baton::v1::RegisterWorkerRequest r;
  r.set_address(Address(1));
  r.set_session_token("session-0123456789abcdef");
  WorkerCaller user{"baton-client", o.join_token, "", {"spiffe://baton/user/baton-client"}};
  absl::StatusOr<baton::v1::RegisterWorkerResponse> refused = (*core)->RegisterWorker(r, user);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("the certificate of baton-client is not a worker's"));
  WorkerCaller bare{"baton-worker-0", o.join_token, "", {}};  // no URI at all
  EXPECT_EQ((*core)->RegisterWorker(r, bare).status().code(), absl::StatusCode::kPermissionDenied);
  WorkerCaller worker{"baton-worker-0", o.join_token, "",
                      {"spiffe://baton/worker/worker-0"}};
  absl::StatusOr<baton::v1::RegisterWorkerResponse> ok = (*core)->RegisterWorker(r, worker);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*core)->ListWorkers().workers(0).identity(), "baton-worker-0");
  worker.join_token = "";
  EXPECT_EQ((*core)->RegisterWorker(r, worker).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(CoordinatorTest, JobWaitsQueuedUntilEnoughWorkersRegister) {
  const std::string w1 = Register(1);
  Job job = Submit(Spec(2));
  EXPECT_EQ(job.id(), "job-000001");
  EXPECT_EQ(job.state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Reason(job), "submitted");
  core_->Tick();
  job = Get(job.id());
  EXPECT_EQ(job.state(), baton::v1::JOB_STATE_QUEUED);
  // One worker registered: the job cannot run yet, and says so.
  EXPECT_EQ(Reason(job),
            "cannot run on the workers registered now (it needs 2 registered workers (1 "
            "registered)); it waits for more to register and holds no one up");
  EXPECT_EQ(job.queue_position(), 1);
  EXPECT_EQ(job.wait_reason(), Reason(job));
  core_->Tick();  // nothing changed: no new history entry
  EXPECT_EQ(Get(job.id()).history_size(), job.history_size());
  EXPECT_TRUE(client_->Calls("start", job.id()).empty());

  const std::string w2 = Register(2);
  core_->Tick();
  job = Get(job.id());
  EXPECT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING) << Reason(job);
  EXPECT_EQ(job.queue_position(), 0);
  EXPECT_TRUE(job.wait_reason().empty());
  ASSERT_EQ(job.workers_size(), 2);
  EXPECT_EQ(job.workers(0), w1);
  EXPECT_EQ(job.workers(1), w2);
  std::vector<JobState> states;
  for (const auto& h : job.history()) states.push_back(h.state());
  EXPECT_EQ(states.back(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(states[states.size() - 2], baton::v1::JOB_STATE_PLACING);
  auto starts = client_->Calls("start", job.id());
  ASSERT_EQ(starts.size(), 2u);
  // Rank 0 last: the other ranks are ready before the first activation is sent.
  EXPECT_EQ(starts[0].address, Address(2));
  EXPECT_EQ(starts[0].rank, 1);
  EXPECT_EQ(starts[1].address, Address(1));
  EXPECT_EQ(starts[1].rank, 0);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_BUSY);
  EXPECT_EQ(job.pipeline().schedule(), "1f1b");
  EXPECT_EQ(job.pipeline().stage_blocks_size(), 2);
  // Heartbeats carrying the job are fine; the job is wanted.
  EXPECT_TRUE(Beat(w1, job.id()).abort_job_ids().empty());
}

// Equal priorities keep submission order, but a job that does not fit no longer blocks a
// smaller one behind it (backfill: queue_policy.h); a higher priority goes first.
TEST_F(CoordinatorTest, TheQueueGoesByPriorityThenOrderAndSmallJobsBackfill) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const Job a = Submit(Spec(2));
  const Job b = Submit(Spec(2));
  const Job c = Submit(Spec(1));
  core_->Tick();
  EXPECT_EQ(Get(a.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(b.id()).state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(b.id()).queue_position(), 1);
  EXPECT_EQ(Reason(Get(b.id())),
            "first in line: waiting for 2 idle workers (1 idle); jobs behind it may start on "
            "idle workers until it has waited 5m");
  // c fits on w-3 and starts though b is older: b could not have used w-3 alone.
  EXPECT_EQ(Get(c.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(c.id()).workers(0), w3);

  // A later job of higher priority goes before b.
  baton::v1::JobSpec urgent = Spec(2);
  urgent.set_priority(5);
  const Job d = Submit(urgent);
  core_->Tick();
  EXPECT_EQ(Get(d.id()).queue_position(), 1);
  EXPECT_EQ(Get(b.id()).queue_position(), 2);
  FinishAllRanks(Get(a.id()));
  core_->Tick();
  EXPECT_EQ(Get(d.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(d.id()).workers(0), w1);
  EXPECT_EQ(Get(d.id()).workers(1), w2);
  EXPECT_EQ(Get(b.id()).state(), baton::v1::JOB_STATE_QUEUED);
}

// A job behind the first in line that waited reserve_after does not start on the workers the
// first one could use; it does once the first one started.
TEST_F(CoordinatorTest, AHeadThatWaitedLongEnoughHoldsTheWorkersItCanUse) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job a = Submit(Spec(1));
  core_->Tick();
  ASSERT_EQ(Get(a.id()).state(), baton::v1::JOB_STATE_RUNNING);
  const std::string a_worker = Get(a.id()).workers(0);
  const Job head = Submit(Spec(2));
  core_->Tick();
  for (int i = 0; i < 121; ++i) {  // 6 minutes of heartbeats
    clock_.Advance(absl::Seconds(3));
    Beat(w1, a_worker == w1 ? a.id() : "");
    Beat(w2, a_worker == w2 ? a.id() : "");
  }
  const Job small = Submit(Spec(1));
  core_->Tick();
  EXPECT_EQ(Get(small.id()).state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_NE(Reason(Get(head.id())).find("first in line, holding workers"), std::string::npos)
      << Reason(Get(head.id()));
  EXPECT_NE(Get(small.id()).wait_reason().find("which holds 1 idle workers"), std::string::npos)
      << Get(small.id()).wait_reason();
  FinishAllRanks(Get(a.id()));
  core_->Tick();
  EXPECT_EQ(Get(head.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(small.id()).state(), baton::v1::JOB_STATE_QUEUED);
}

// Quotas at submission: the priority a role may ask for, and the jobs a user may queue;
// at placement: the workers a user may hold.
TEST_F(CoordinatorTest, QuotasBoundPriorityQueuedJobsAndHeldWorkers) {
  const std::string path = ::testing::TempDir() + "/coordinator-quotas.txt";
  std::ofstream(path) << "role submitter 2 2 1\nuser carol - - 3\n";
  auto book = QuotaBook::FromFile(path);
  ASSERT_TRUE(book.ok()) << book.status();
  quotas_ = *std::move(book);
  Start(":memory:");
  for (int i = 1; i <= 3; ++i) Register(i);
  auto submit = [&](const std::string& who, int stages, int priority) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = Spec(stages);
    r.mutable_spec()->set_priority(priority);
    return core_->SubmitJob(r, who, /*admin=*/false);
  };
  auto too_high = submit("bob", 1, 2);
  ASSERT_EQ(too_high.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(too_high.status().message().find("at most 1, got 2 (quota max_priority)"),
            std::string::npos)
      << too_high.status();
  EXPECT_TRUE(submit("carol", 1, 3).ok());  // her own line: up to 3
  // bob holds at most 2 workers: his second 2-stage job waits, saying so, while carol's
  // job starts on the worker left.
  auto b1 = submit("bob", 2, 0);
  ASSERT_TRUE(b1.ok()) << b1.status();
  core_->Tick();
  auto b2 = submit("bob", 2, 0);
  auto b3 = submit("bob", 1, 0);
  ASSERT_TRUE(b2.ok() && b3.ok());
  auto b4 = submit("bob", 1, 0);  // two queued already: refused
  ASSERT_EQ(b4.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b4.status().message().find("bob has 2 jobs queued, its limit (quota max_queued 2)"),
            std::string::npos)
      << b4.status();
  core_->Tick();
  EXPECT_EQ(Get(b1->id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(b2->id()).state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(b2->id()).wait_reason(),
            "user bob holds 2 of its 2 workers and this job needs 2 (quota max_workers)");
  EXPECT_EQ(Get(b2->id()).history().rbegin()->reason(), Get(b2->id()).wait_reason());
  std::remove(path.c_str());
}

TEST_F(CoordinatorTest, AQueuedJobsPriorityChangesAndTheQueueReorders) {
  Register(1);
  const Job a = Submit(Spec(2));
  const Job b = Submit(Spec(2));
  core_->Tick();
  EXPECT_EQ(Get(a.id()).queue_position(), 1);
  EXPECT_EQ(Get(b.id()).queue_position(), 2);
  auto changed = core_->SetJobPriority(b.id(), 7);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->spec().priority(), 7);
  EXPECT_EQ(Reason(*changed), "priority 0 -> 7");
  core_->Tick();
  EXPECT_EQ(Get(b.id()).queue_position(), 1);
  EXPECT_EQ(Get(a.id()).queue_position(), 2);
  Register(2);
  core_->Tick();
  EXPECT_EQ(Get(b.id()).state(), baton::v1::JOB_STATE_RUNNING);
  // Not once it runs, nor for a job that does not exist.
  EXPECT_EQ(core_->SetJobPriority(b.id(), 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_->SetJobPriority("job-999999", 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, QueuedJobsHistoryRecordsWhatTheyWaitForNotEveryQueueMove) {
  Register(1);
  std::vector<Job> jobs;
  for (int i = 0; i < 200; ++i) jobs.push_back(Submit(Spec(1)));
  core_->Tick();
  for (int i = 0; i < 199; ++i) {
    FinishAllRanks(Get(jobs[i].id()));
    core_->Tick();
  }
  // submitted, behind older jobs, first in line waiting for the worker, PLACING, RUNNING:
  // the queue moved 199 times meanwhile.
  const Job last = Get(jobs[199].id());
  ASSERT_EQ(last.state(), baton::v1::JOB_STATE_RUNNING) << Reason(last);
  std::vector<std::string> reasons;
  for (const auto& h : last.history()) reasons.push_back(h.reason());
  ASSERT_EQ(last.history_size(), 5) << testing::PrintToString(reasons);
  EXPECT_EQ(reasons[1],
            "behind the first in line: waiting for 1 idle worker (0 idle); the first is job-000002");
  EXPECT_EQ(reasons[2],
            "first in line: waiting for 1 idle worker (0 idle); jobs behind it may start on "
            "idle workers until it has waited 5m");
}

TEST_F(CoordinatorTest, CancelQueuedJobAtOnce) {
  const Job job = Submit(Spec(2));
  core_->Tick();
  baton::v1::CancelJobRequest r;
  r.set_job_id(job.id());
  r.set_reason("changed my mind");
  auto cancelled = core_->CancelJob(r);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), baton::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Reason(*cancelled), "cancelled: changed my mind");
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_CANCELLED);
  Register(1);
  Register(2);
  core_->Tick();
  EXPECT_TRUE(client_->Calls("start", job.id()).empty());
}

TEST_F(CoordinatorTest, CancelRunningJobAbortsAndFreesEveryWorker) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2));
  const Job next = Submit(Spec(2));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  baton::v1::CancelJobRequest r;
  r.set_job_id(job.id());
  auto cancelled = core_->CancelJob(r);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), baton::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Reason(*cancelled), "cancelled by request");
  auto aborts = client_->Calls("abort", job.id());
  ASSERT_EQ(aborts.size(), 2u);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_IDLE);
  // Cancelling again returns the job unchanged.
  auto again = core_->CancelJob(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->history_size(), cancelled->history_size());
  EXPECT_EQ(client_->Calls("abort", job.id()).size(), 2u);
  // A worker still heartbeating the cancelled job is told to abort it.
  auto beat = Beat(w1, job.id());
  ASSERT_EQ(beat.abort_job_ids_size(), 1);
  EXPECT_EQ(beat.abort_job_ids(0), job.id());
  Beat(w1);
  // The freed workers take the next job.
  core_->Tick();
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, ExpiredLeaseFailsTheJobNamingTheWorkerAndFreesTheOthers) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const Job job = Submit(Spec(2));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(3));
  Beat(w1, job.id());
  Beat(w3);
  core_->Tick();
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(3));  // w-2: 6 s without a heartbeat
  Beat(w1, job.id());
  Beat(w3);
  core_->Tick();
  const Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(failed),
            absl::StrCat("worker ", w2, " (", Address(2), ") lease expired (no heartbeat for 5s)"));
  auto aborts = client_->Calls("abort", job.id());
  ASSERT_EQ(aborts.size(), 1u);  // the dead worker is not contacted
  EXPECT_EQ(aborts[0].address, Address(1));
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_DEAD);
  EXPECT_FALSE(Beat(w2).known());
  // The survivors run the next job.
  const Job next = Submit(Spec(2));
  Beat(w1);
  core_->Tick();
  const Job n = Get(next.id());
  EXPECT_EQ(n.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(n.workers(0), w1);
  EXPECT_EQ(n.workers(1), w3);
}

TEST_F(CoordinatorTest, ResultsFromEveryRankSucceedWithTheCombinedDigest) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2, /*steps=*/2));
  auto watch = core_->WatchJob(job.id());
  ASSERT_TRUE(watch.ok());
  core_->Tick();
  Job running = Get(job.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);

  // Step 1: rank 0 first (no loss), then the last rank with the loss.
  baton::v1::ReportProgressRequest p;
  p.set_job_id(job.id());
  p.set_worker_id(w1);
  p.set_rank(0);
  p.set_step(1);
  *p.mutable_timing()->mutable_forward() = ToProtoDuration(absl::Milliseconds(30));
  *p.mutable_timing()->mutable_step() = ToProtoDuration(absl::Milliseconds(100));
  p.mutable_timing()->set_peak_inflight(2);
  auto keep = core_->ReportProgress(p);
  ASSERT_TRUE(keep.ok());
  EXPECT_TRUE(keep->keep_running());
  p.set_worker_id(w2);
  p.set_rank(1);
  p.set_loss(1.5f);
  p.mutable_timing()->set_peak_inflight(1);
  *p.mutable_timing()->mutable_step() = ToProtoDuration(absl::Milliseconds(200));
  ASSERT_TRUE(core_->ReportProgress(p).ok());
  running = Get(job.id());
  EXPECT_EQ(running.steps_done(), 1);
  EXPECT_FLOAT_EQ(running.last_loss(), 1.5f);
  // A worker reporting a rank it does not run is told to stop.
  p.set_worker_id(w1);
  EXPECT_FALSE(core_->ReportProgress(p)->keep_running());

  FinishAllRanks(running);
  const Job done = Get(job.id());
  ASSERT_EQ(done.state(), baton::v1::JOB_STATE_SUCCEEDED) << Reason(done);
  EXPECT_EQ(Reason(done), "all 2 ranks finished 2 steps");
  const auto blocks = DescribeBlocks(done.spec().model());
  ASSERT_EQ(done.block_digests_size(), static_cast<int>(blocks.size()));
  std::vector<Digest> digests;
  for (size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ(done.block_digests(b).block(), blocks[b].name);
    EXPECT_EQ(done.block_digests(b).sha256(), DigestHex(FakeBlockDigest(static_cast<int>(b))));
    digests.push_back(FakeBlockDigest(static_cast<int>(b)));
  }
  EXPECT_EQ(done.weights_digest(), DigestHex(CombineBlockDigests(digests)));
  EXPECT_EQ(done.steps_done(), 2);
  ASSERT_EQ(done.pipeline().peak_inflight_size(), 2);
  EXPECT_EQ(done.pipeline().peak_inflight(0), 2);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_IDLE);
  EXPECT_TRUE(client_->Calls("abort", job.id()).empty());

  // The watch saw: QUEUED (current at subscription), PLACING, RUNNING, step 1, SUCCEEDED.
  std::vector<baton::v1::JobEvent> events;
  bool done_flag = false;
  for (int i = 0; i < 10 && !done_flag; ++i) {
    auto batch = (*watch)->Next(absl::ZeroDuration(), &done_flag);
    ASSERT_TRUE(batch.ok());
    events.insert(events.end(), batch->begin(), batch->end());
  }
  ASSERT_TRUE(done_flag);
  std::vector<std::string> kinds;
  for (const auto& e : events) {
    EXPECT_EQ(e.job_id(), job.id());
    kinds.push_back(e.has_step() ? absl::StrCat("step", e.step().step())
                                 : baton::v1::JobState_Name(e.state_change().state()));
  }
  // The queue reason update between QUEUED and PLACING is absent: two workers were idle.
  EXPECT_EQ(kinds, (std::vector<std::string>{"JOB_STATE_QUEUED", "JOB_STATE_PLACING",
                                             "JOB_STATE_RUNNING", "step1", "JOB_STATE_SUCCEEDED"}));
  const baton::v1::StepProgress& step = events[3].step();
  EXPECT_FLOAT_EQ(step.loss(), 1.5f);
  EXPECT_EQ(step.total_steps(), 2);
  EXPECT_DOUBLE_EQ(step.samples_per_second(), 8 / 0.2);
  ASSERT_EQ(step.stages_size(), 2);
  EXPECT_EQ(step.stages(0).rank(), 0);
  EXPECT_EQ(step.stages(0).worker_id(), w1);
  EXPECT_EQ(FromProtoDuration(step.stages(0).forward()), absl::Milliseconds(30));
}

// Reports step `step` of rank `rank`, with its part of a checkpoint when `bytes` > 0.
absl::StatusOr<baton::v1::ReportProgressResponse> Progress(Coordinator& core, const Job& job,
                                                            int rank, int64_t step,
                                                            int64_t checkpoint_bytes,
                                                            int64_t resumed_from = 0) {
  baton::v1::ReportProgressRequest p;
  p.set_job_id(job.id());
  p.set_worker_id(job.workers(rank));
  p.set_rank(rank);
  p.set_step(step);
  if (checkpoint_bytes > 0) {
    baton::v1::CheckpointWrite* w = p.add_checkpoints();
    w->set_step(step);
    w->set_bytes(checkpoint_bytes);
    *w->mutable_duration() = ToProtoDuration(absl::Milliseconds(rank + 1));
  }
  if (resumed_from > 0) {
    p.set_resumed_from_step(resumed_from);
    p.add_checkpoints_skipped("step-6: DATA_LOSS: block.1.safetensors fails its SHA-256");
  }
  return core.ReportProgress(p);
}

TEST_F(CoordinatorTest, CheckpointIsCompleteOnlyWhenEveryRankWroteItAndOldOnesAreForgotten) {
  Register(1);
  Register(2);
  baton::v1::JobSpec spec = Spec(2, /*steps=*/6);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  spec.mutable_checkpoint()->set_keep(2);
  const Job submitted = Submit(spec);
  EXPECT_EQ(submitted.checkpoints().job_dir(), "/shared/ckpt/" + submitted.id());
  core_->Tick();
  const Job job = Get(submitted.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  for (int64_t step : {2, 4, 6}) {
    ASSERT_TRUE(Progress(*core_, job, 0, step, 100).ok());
    // One rank's part is not a checkpoint.
    EXPECT_TRUE(Get(job.id()).checkpoints().complete().empty() ||
                Get(job.id()).checkpoints().complete().rbegin()->step() < step);
    ASSERT_TRUE(Progress(*core_, job, 1, step, 50).ok());
    const Job now = Get(job.id());
    ASSERT_FALSE(now.checkpoints().complete().empty());
    const baton::v1::CheckpointRecord& last = *now.checkpoints().complete().rbegin();
    EXPECT_EQ(last.step(), step);
    EXPECT_EQ(last.bytes(), 150);
    EXPECT_EQ(FromProtoDuration(last.write_time()), absl::Milliseconds(2));  // the slowest
  }
  // keep 2: step 2 is forgotten (the workers delete its files by the same rule).
  const Job now = Get(job.id());
  ASSERT_EQ(now.checkpoints().complete_size(), 2);
  EXPECT_EQ(now.checkpoints().complete(0).step(), 4);
  EXPECT_EQ(now.checkpoints().complete(1).step(), 6);
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_checkpoint_write_seconds_count 3"));
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_checkpoint_bytes_total 450"));
}

// Another user's checkpoints hold that user's weights: resuming from them needs an admin,
// and so does writing into (or around) their checkpoint directory.
TEST_F(CoordinatorTest, OtherUsersCheckpointsNeedAnAdmin) {
  Start(TempDb());
  Register(1);
  Register(2);
  baton::v1::JobSpec spec = Spec(2, /*steps=*/4);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.mutable_checkpoint()->set_dir("/shared/ckpt/alice");
  baton::v1::SubmitJobRequest r;
  *r.mutable_spec() = spec;
  absl::StatusOr<Job> alices = core_->SubmitJob(r, "alice", /*admin=*/false);
  ASSERT_TRUE(alices.ok()) << alices.status();
  core_->Tick();
  const Job running = Get(alices->id());
  for (int rank : {0, 1}) ASSERT_TRUE(Progress(*core_, running, rank, 2, 10).ok());
  FinishAllRanks(running);
  ASSERT_EQ(Get(alices->id()).state(), baton::v1::JOB_STATE_SUCCEEDED);

  baton::v1::JobSpec resume = spec;
  resume.mutable_checkpoint()->set_dir("/shared/ckpt/bob");
  resume.mutable_resume_from()->set_job_id(alices->id());
  *r.mutable_spec() = resume;
  absl::StatusOr<Job> bobs = core_->SubmitJob(r, "bob", /*admin=*/false);
  ASSERT_EQ(bobs.status().code(), absl::StatusCode::kPermissionDenied) << bobs.status();
  EXPECT_THAT(std::string(bobs.status().message()),
              HasSubstr("resume_from.job_id: " + alices->id() + " was submitted by alice"));
  EXPECT_TRUE(core_->SubmitJob(r, "alice", /*admin=*/false).ok());  // the owner may
  EXPECT_TRUE(core_->SubmitJob(r, "root", /*admin=*/true).ok());    // and an admin

  // Bob's checkpoints may not go into Alice's directory, nor around it.
  for (const char* dir : {"/shared/ckpt/alice", "/shared/ckpt/alice/mine", "/shared/ckpt",
                          "/shared"}) {
    baton::v1::JobSpec into = spec;
    into.mutable_checkpoint()->set_dir(dir);
    *r.mutable_spec() = into;
    absl::StatusOr<Job> refused = core_->SubmitJob(r, "bob", /*admin=*/false);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << dir;
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("the checkpoint directory of " + alices->id() + " submitted by alice"));
  }
  baton::v1::JobSpec beside = spec;
  beside.mutable_checkpoint()->set_dir("/shared/ckpt/alice-2");  // a sibling, not inside
  *r.mutable_spec() = beside;
  EXPECT_TRUE(core_->SubmitJob(r, "bob", /*admin=*/false).ok());
  // Alice may reuse her own directory.
  *r.mutable_spec() = spec;
  EXPECT_TRUE(core_->SubmitJob(r, "alice", /*admin=*/false).ok());
  // Who owns which directory survives a restart on the same job store.
  Start(TempDb());
  *r.mutable_spec() = spec;
  EXPECT_EQ(core_->SubmitJob(r, "bob", /*admin=*/false).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// checkpoint.dir lies under the checkpoint root: relative ones are taken under it, escapes
// are refused naming the field, and the job records the resolved directory.
TEST(CoordinatorCheckpointRootTest, CheckpointDirsAreConfinedToTheRoot) {
  std::string tmpl = testing::TempDir() + "/ckpt_root.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string root = std::filesystem::canonical(tmpl).string();
  CoordinatorOptions o = QuietOptions();
  o.checkpoint_root = root;
  auto core = Coordinator::Create(o);
  ASSERT_TRUE(core.ok()) << core.status();
  baton::v1::JobSpec spec = Spec(1);
  spec.mutable_checkpoint()->set_every_steps(1);
  baton::v1::SubmitJobRequest r;
  for (const std::string& bad : {std::string("/etc/baton"), std::string("ckpt/../../.."),
                                 std::string("../elsewhere")}) {
    spec.mutable_checkpoint()->set_dir(bad);
    *r.mutable_spec() = spec;
    absl::StatusOr<Job> refused = (*core)->SubmitJob(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("checkpoint.dir: '" + bad));
  }
  spec.mutable_checkpoint()->set_dir("alice/run");
  *r.mutable_spec() = spec;
  absl::StatusOr<Job> ok = (*core)->SubmitJob(r);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->spec().checkpoint().dir(), root + "/alice/run");
  EXPECT_EQ(ok->checkpoints().job_dir(), root + "/alice/run/" + ok->id());
  std::filesystem::remove_all(root);
}

// A 2-step job of carol's naming "." (the root itself) once made her the owner of every
// directory under the root, and every other user's job was refused, across restarts. The
// root and users/ are no job's; a spec naming no directory gets its user's own.
TEST(CoordinatorCheckpointRootTest, NoUserCanLockTheOthersOutOfTheRoot) {
  std::string tmpl = testing::TempDir() + "/ckpt_root.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string root = std::filesystem::canonical(tmpl).string();
  CoordinatorOptions o = QuietOptions();
  o.checkpoint_root = root;
  o.db_path = root + "/jobs.db";
  baton::v1::JobSpec spec = Spec(1);
  spec.mutable_checkpoint()->set_every_steps(1);
  auto submit = [&](Coordinator& core, const std::string& dir, const std::string& user) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = spec;
    r.mutable_spec()->mutable_checkpoint()->set_dir(dir);
    return core.SubmitJob(r, user, /*admin=*/false);
  };
  {
    auto core = Coordinator::Create(o);
    ASSERT_TRUE(core.ok()) << core.status();
    for (const char* dir : {".", "users", "users/..", root.c_str()}) {
      absl::StatusOr<Job> refused = submit(**core, dir, "carol");
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << dir;
      EXPECT_THAT(std::string(refused.status().message()), HasSubstr("checkpoint.dir"));
    }
    absl::StatusOr<Job> carols = submit(**core, "", "carol");
    ASSERT_TRUE(carols.ok()) << carols.status();
    EXPECT_EQ(carols->spec().checkpoint().dir(), root + "/users/carol");
    EXPECT_EQ(carols->checkpoints().job_dir(), root + "/users/carol/" + carols->id());
    // Nobody else may write in carol's default directory, nor she in theirs.
    EXPECT_EQ(submit(**core, "users/carol/x", "dave").status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(submit(**core, "users/dave", "carol").status().code(),
              absl::StatusCode::kPermissionDenied);
    absl::StatusOr<Job> daves = submit(**core, "", "dave");
    ASSERT_TRUE(daves.ok()) << daves.status();
    EXPECT_EQ(daves->spec().checkpoint().dir(), root + "/users/dave");
    EXPECT_TRUE(submit(**core, "team-d", "dave").ok());
  }
  // The same after a restart on the same job store.
  auto core = Coordinator::Create(o);
  ASSERT_TRUE(core.ok()) << core.status();
  EXPECT_TRUE(submit(**core, "", "erin").ok());
  EXPECT_TRUE(submit(**core, "team-e", "erin").ok());
  EXPECT_EQ(submit(**core, "team-d/x", "erin").status().code(),
            absl::StatusCode::kPermissionDenied);
  core->reset();
  std::filesystem::remove_all(root);
}

TEST_F(CoordinatorTest, ResumeFromIsResolvedAgainstTheJobItNamesAndTravelsInThePlans) {
  Register(1);
  Register(2);
  baton::v1::JobSpec spec = Spec(2, /*steps=*/8);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  const Job plain = Submit(Spec(2, 2));
  core_->Tick();
  FinishAllRanks(Get(plain.id()));
  const Job first = Submit(spec);
  core_->Tick();
  const Job running = Get(first.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);
  for (int64_t step : {2, 4}) {
    for (int rank : {0, 1}) ASSERT_TRUE(Progress(*core_, running, rank, step, 10).ok());
  }

  auto resume = [&](const std::string& from, int64_t step, baton::v1::JobSpec s) {
    s.mutable_resume_from()->set_job_id(from);
    s.mutable_resume_from()->set_step(step);
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = s;
    return core_->SubmitJob(r);
  };
  auto refused = [&](absl::StatusOr<Job> got, const std::string& prefix) {
    ASSERT_FALSE(got.ok()) << "accepted, want " << prefix;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got.status().message().substr(0, prefix.size()), prefix) << got.status();
  };
  refused(resume(first.id(), 0, spec), "resume_from.job_id: " + first.id() + " is still RUNNING");
  FinishAllRanks(running);
  ASSERT_EQ(Get(first.id()).state(), baton::v1::JOB_STATE_SUCCEEDED);
  refused(resume("job-999999", 0, spec), "resume_from.job_id: there is no job job-999999");
  refused(resume(plain.id(), 0, spec),
          "resume_from.job_id: " + plain.id() + " has no complete checkpoint (its spec asks");
  refused(resume(first.id(), 3, spec),
          "resume_from.step: " + first.id() + " has no complete checkpoint after step 3 (it "
          "keeps steps 2, 4)");
  baton::v1::JobSpec wider = spec;
  wider.mutable_model()->mutable_mlp()->set_width(16);
  refused(resume(first.id(), 0, wider), "resume_from: the spec's model differs");
  baton::v1::JobSpec adam = spec;
  adam.mutable_optimizer()->mutable_adamw()->set_learning_rate(0.1f);
  refused(resume(first.id(), 0, adam), "resume_from: the spec's optimizer differs");

  // A named step travels as it is.
  absl::StatusOr<Job> at_two = resume(first.id(), 2, spec);
  ASSERT_TRUE(at_two.ok()) << at_two.status();
  core_->Tick();
  for (const auto& plan : client_->Plans(at_two->id())) EXPECT_EQ(plan.resume_step(), 2);
  baton::v1::CancelJobRequest cancel;
  cancel.set_job_id(at_two->id());
  ASSERT_TRUE(core_->CancelJob(cancel).ok());
  // The newest complete one (4 by the record), written under the first job's directory.
  absl::StatusOr<Job> resumed = resume(first.id(), 0, spec);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->checkpoints().resumed_from_job(), first.id());
  EXPECT_EQ(resumed->checkpoints().resumed_from_step(), 4);
  EXPECT_EQ(resumed->checkpoints().resumed_from_dir(), "/shared/ckpt/" + first.id());
  EXPECT_EQ(resumed->checkpoints().job_dir(), "/shared/ckpt/" + resumed->id());
  EXPECT_EQ(resumed->steps_done(), 4);
  core_->Tick();
  const auto plans = client_->Plans(resumed->id());
  ASSERT_EQ(plans.size(), 2u);
  for (const auto& plan : plans) {
    EXPECT_EQ(plan.resume_job_dir(), "/shared/ckpt/" + first.id());
    // 0: the newest complete one the ranks find (the record may lag the files).
    EXPECT_EQ(plan.resume_step(), 0);
  }
  // The ranks found a newer step damaged and loaded 2: the history says so.
  const Job r2 = Get(resumed->id());
  ASSERT_TRUE(Progress(*core_, r2, 0, 3, 0, /*resumed_from=*/2).ok());
  Job now = Get(resumed->id());
  EXPECT_EQ(now.checkpoints().resumed_from_step(), 2);
  EXPECT_THAT(Reason(now), testing::StartsWith("resumed from " + first.id() +
                                              " step 2 (the newest complete; skipped: step-6"));
  // A rank that loaded another checkpoint fails the job: the model would be a chimera.
  auto second = Progress(*core_, r2, 1, 5, 0, /*resumed_from=*/4);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->keep_running());
  now = Get(resumed->id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(now),
            "ranks resumed from different checkpoints: rank 0 from step 2, rank 1 from step 4");
}

TEST_F(CoordinatorTest, RankErrorFailsTheJobAndAbortsTheOthers) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2));
  core_->Tick();
  baton::v1::ReportResultRequest r;
  r.set_job_id(job.id());
  r.set_worker_id(w2);
  r.set_rank(1);
  r.set_error("RECV_F timed out after 60s");
  ASSERT_TRUE(core_->ReportResult(r).ok());
  const Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(failed), absl::StrCat("rank 1 on worker ", w2, ": RECV_F timed out after 60s"));
  auto aborts = client_->Calls("abort", job.id());
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].address, Address(1));
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_IDLE);
  // The other rank's echo is accepted and ignored.
  r.set_worker_id(w1);
  r.set_rank(0);
  r.set_error("aborted");
  EXPECT_TRUE(core_->ReportResult(r).ok());
  EXPECT_EQ(Get(job.id()).history_size(), failed.history_size());
}

TEST_F(CoordinatorTest, UnreachableWorkerIsNotFreedUntilItsLeaseDecides) {
  // Rank 0 fails because its neighbour died; the dead neighbour cannot be told to abort.
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  client_->Unreachable(Address(2));
  const Job job = Submit(Spec(2));
  core_->Tick();
  baton::v1::ReportResultRequest r;
  r.set_job_id(job.id());
  r.set_worker_id(w1);
  r.set_rank(0);
  r.set_error("RECV_B from rank 1 (" + Address(2) + "): connection refused");
  ASSERT_TRUE(core_->ReportResult(r).ok());
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_BUSY);  // not offered to the next job
  // The next job needing two workers waits rather than landing on the dead one.
  const Job next = Submit(Spec(2));
  core_->Tick();
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(next.id()).workers(1), w3);
  // Its lease runs out: DEAD.
  clock_.Advance(absl::Seconds(3));
  Beat(w1, next.id());
  Beat(w3, next.id());
  clock_.Advance(absl::Seconds(3));
  Beat(w1, next.id());
  Beat(w3, next.id());
  core_->Tick();
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_DEAD);
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, UnreachableButAliveWorkerIsFreedByItsHeartbeat) {
  const std::string w1 = Register(1);
  client_->Unreachable(Address(1));
  const Job job = Submit(Spec(1));
  core_->Tick();
  baton::v1::CancelJobRequest c;
  c.set_job_id(job.id());
  ASSERT_TRUE(core_->CancelJob(c).ok());
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_BUSY);
  Beat(w1, job.id());  // still running it: told to abort, still busy
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_BUSY);
  Beat(w1);  // runs nothing now
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
}

// A worker that answers the abort but whose job thread has not ended yet (an evaluation
// between two micro-batches, a checkpoint write) is not listed IDLE, nor handed the next
// job, until its heartbeat says it runs nothing.
TEST_F(CoordinatorTest, WorkerStillStoppingStaysBusyUntilItsHeartbeatSaysFree) {
  const std::string w1 = Register(1), w2 = Register(2);
  client_->StillStopping(Address(2));
  const Job job = Submit(Spec(2));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  const Job next = Submit(Spec(2));
  baton::v1::CancelJobRequest c;
  c.set_job_id(job.id());
  ASSERT_TRUE(core_->CancelJob(c).ok());
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_BUSY);
  core_->Tick();
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(client_->Calls("start", next.id()).empty());
  // Still running the cancelled job: told again, still busy.
  const baton::v1::HeartbeatResponse beat = Beat(w2, job.id());
  ASSERT_EQ(beat.abort_job_ids_size(), 1);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_BUSY);
  core_->Tick();
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_QUEUED);
  // Its job thread ended: free, and the next job starts on both workers.
  Beat(w2);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_IDLE);
  core_->Tick();
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, AbortedEchoesWaitForTheRootCause) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const Job job = Submit(Spec(3));
  core_->Tick();
  // The kind of failure travels typed (ReportResultRequest.cause), not in the message.
  auto report = [&](int rank, const std::string& worker, const std::string& error,
                    baton::v1::FailureCause cause) {
    baton::v1::ReportResultRequest r;
    r.set_job_id(job.id());
    r.set_worker_id(worker);
    r.set_rank(rank);
    r.set_error(error);
    r.set_cause(cause);
    ASSERT_TRUE(core_->ReportResult(r).ok());
  };
  report(2, w3, "rank 2 at 2RECV_F0: rank 1 aborted", baton::v1::FAILURE_CAUSE_ABORTED);
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(WorkerState(w3), baton::v1::WORKER_STATE_IDLE);
  // A broken link may be a dead peer or one that stopped for its own neighbour: it waits
  // too.
  report(1, w2, "UNAVAILABLE: the stream to rank 0 failed", baton::v1::FAILURE_CAUSE_PEER);
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  // The root cause: rank 0's own error.
  report(0, w1, "INTERNAL: out of memory in 0F1", baton::v1::FAILURE_CAUSE_INTERNAL);
  Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(failed), absl::StrCat("rank 0 on worker ", w1, ": INTERNAL: out of memory in 0F1"));

  // ABORTED echoes and a PEER error, nobody silent: the PEER error stands, after waiting.
  const Job linked = Submit(Spec(3));
  core_->Tick();
  ASSERT_EQ(Get(linked.id()).state(), baton::v1::JOB_STATE_RUNNING);
  const Job placed = Get(linked.id());
  auto report_on = [&](const Job& j, int rank, const std::string& error,
                       baton::v1::FailureCause cause) {
    baton::v1::ReportResultRequest r;
    r.set_job_id(j.id());
    r.set_worker_id(j.workers(rank));
    r.set_rank(rank);
    r.set_error(error);
    r.set_cause(cause);
    ASSERT_TRUE(core_->ReportResult(r).ok());
  };
  report_on(placed, 2, "ABORTED: an echo", baton::v1::FAILURE_CAUSE_ABORTED);
  report_on(placed, 1, "UNAVAILABLE: lost a member of the group",
            baton::v1::FAILURE_CAUSE_PEER);
  report_on(placed, 0, "ABORTED: another echo", baton::v1::FAILURE_CAUSE_ABORTED);
  failed = Get(linked.id());  // every rank reported: nothing more to wait for
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(failed), absl::StrCat("rank 1 on worker ", placed.workers(1),
                                         ": UNAVAILABLE: lost a member of the group"));
  EXPECT_EQ(failed.history(failed.history_size() - 1).state(), baton::v1::JOB_STATE_FAILED);

  // With only echoes, the first one stands after root_cause_wait.
  const Job other = Submit(Spec(3));
  core_->Tick();
  ASSERT_EQ(Get(other.id()).state(), baton::v1::JOB_STATE_RUNNING);
  baton::v1::ReportResultRequest r;
  r.set_job_id(other.id());
  r.set_worker_id(Get(other.id()).workers(2));
  r.set_rank(2);
  r.set_error("ABORTED: first echo");
  r.set_cause(baton::v1::FAILURE_CAUSE_ABORTED);
  ASSERT_TRUE(core_->ReportResult(r).ok());
  core_->Tick();
  EXPECT_EQ(Get(other.id()).state(), baton::v1::JOB_STATE_RUNNING);
  auto beat_all = [&](const Job& j) {  // the ranks still running (0 and 1)
    const Job now = Get(j.id());
    Beat(now.workers(0), j.id());
    Beat(now.workers(1), j.id());
  };
  clock_.Advance(absl::Milliseconds(600));
  beat_all(other);
  core_->Tick();
  // Every worker heartbeats: it waits half a lease and half an interval (3 s) for one to
  // fall silent.
  EXPECT_EQ(Get(other.id()).state(), baton::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1500));
  beat_all(other);
  core_->Tick();
  EXPECT_EQ(Get(other.id()).state(), baton::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1000));
  beat_all(other);
  core_->Tick();
  failed = Get(other.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_NE(Reason(failed).find("ABORTED: first echo"), std::string::npos);

  // A worker of the job that stopped heartbeating is named as the likely root cause.
  const Job third = Submit(Spec(3));
  core_->Tick();
  const Job running = Get(third.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING) << Reason(running);
  r.set_job_id(third.id());
  r.set_worker_id(running.workers(2));
  ASSERT_TRUE(core_->ReportResult(r).ok());
  // Rank 1's worker is silent past half its lease (2.5 s); rank 0's heartbeats are late, but
  // not that late.
  clock_.Advance(absl::Milliseconds(1300));
  Beat(running.workers(0), third.id());
  core_->Tick();
  EXPECT_EQ(Get(third.id()).state(), baton::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1300));
  Beat(running.workers(0), third.id());
  core_->Tick();
  failed = Get(third.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Reason(failed),
              testing::StartsWith(absl::StrCat("worker ", running.workers(1), " (")));
  EXPECT_THAT(Reason(failed), testing::HasSubstr("silent for 2.6s (no heartbeat; presumed lost); "
                                                 "first report: rank 2 on worker "));
}

// Under load, ranks report before the coordinator has counted the answers to its StartJob
// calls. Their link reports are notes under PLACING, not a change the answers misread as
// the job having ended ("aborted: the job ended while it was being started").
TEST_F(CoordinatorTest, ReportsBeforeTheStartAnswersAreCountedDoNotEndTheJob) {
  Register(1);
  Register(2);
  client_->OnStarted([this](const baton::v1::JobPlan& plan) {
    if (plan.rank() != 0) return;  // rank 0 starts last: every rank runs now
    for (int rank : {0, 1}) {
      baton::v1::ReportProgressRequest p;
      p.set_job_id(plan.job_id());
      p.set_worker_id(plan.peers(rank).worker_id());
      p.set_rank(rank);
      p.set_step(1);
      baton::v1::LinkReport* l = p.add_links();
      l->set_rank(0);
      l->set_peer(1);
      l->set_transport("grpc");
      l->set_reason("grpc: the job computes on the CPU");
      ASSERT_TRUE(core_->ReportProgress(p).ok());
    }
  });
  const Job job = Submit(Spec(2, /*steps=*/2));
  core_->Tick();
  const Job now = Get(job.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING) << now.DebugString();
  EXPECT_TRUE(client_->Calls("abort", job.id()).empty());
  ASSERT_GE(now.history_size(), 4);
  const baton::v1::StateChange& links = now.history(now.history_size() - 2);
  EXPECT_EQ(links.state(), baton::v1::JOB_STATE_PLACING);
  EXPECT_THAT(links.reason(), HasSubstr("links: ranks 0-1 grpc"));
  EXPECT_EQ(now.history(now.history_size() - 1).reason(), "all 2 ranks started");
  FinishAllRanks(now);
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_SUCCEEDED);
}

// A short job can even finish before the answers are counted: it succeeds, and its
// workers are free afterwards.
TEST_F(CoordinatorTest, AJobThatFinishesBeforeItsStartAnswersAreCountedSucceeds) {
  const std::string w1 = Register(1), w2 = Register(2);
  client_->OnStarted([this](const baton::v1::JobPlan& plan) {
    if (plan.rank() != 0) return;
    Job placed = Get(plan.job_id());
    ASSERT_EQ(placed.state(), baton::v1::JOB_STATE_PLACING);
    FinishAllRanks(placed);
  });
  const Job job = Submit(Spec(2, /*steps=*/2));
  core_->Tick();
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_IDLE);
}

// A worker that shuts down says so with its last heartbeat: it is out of service at once
// (no job is placed on its address while its lease would still run), and a job it held a
// rank of fails naming it.
TEST_F(CoordinatorTest, AWorkerThatLeavesIsOutOfServiceAtOnce) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  baton::v1::HeartbeatRequest bye;
  bye.set_worker_id(w2);
  bye.set_leaving(true);
  absl::StatusOr<baton::v1::HeartbeatResponse> r = core_->Heartbeat(bye);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->known());
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_DEAD);
  const Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.history().rbegin()->reason(), HasSubstr("shut down while running the job"));
  // A new job waits for a second worker instead of going to the one that left.
  const Job next = Submit(Spec(2));
  core_->Tick();
  EXPECT_EQ(Get(next.id()).state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(client_->Calls("start", next.id()).empty());
}

TEST_F(CoordinatorTest, FailedStartJobFailsTheJobNamingTheWorker) {
  const std::string w1 = Register(1), w2 = Register(2);
  client_->FailStart(Address(2));
  const Job job = Submit(Spec(2));
  core_->Tick();
  const Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(failed), absl::StrCat("StartJob on worker ", w2, " (", Address(2),
                                         ") for rank 1 failed: UNAVAILABLE: connection refused"));
  EXPECT_EQ(client_->Calls("start", job.id()).size(), 1u);  // rank 0 was never started
  EXPECT_EQ(client_->Calls("abort", job.id()).size(), 2u);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2), baton::v1::WORKER_STATE_IDLE);
}

TEST_F(CoordinatorTest, StartJobIsRetriedWhileAWorkerWindsDownItsLastJob) {
  const std::string w1 = Register(1), w2 = Register(2);
  client_->BusyFor(Address(2), 2);
  const Job job = Submit(Spec(2));
  core_->Tick();
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING) << Reason(Get(job.id()));
  EXPECT_EQ(client_->Calls("start", job.id()).size(), 4u);  // w-2 three times, then w-1

  // A worker that stays busy fails the job once busy_retry (500 ms here) has passed.
  client_->BusyFor(Address(3), 1000);
  Register(3);
  const Job stuck = Submit(Spec(1));
  // The retries wait on the injected clock (the fake advances as they sleep): no real time.
  const absl::Time start = clock_.fn()();
  core_->Tick();
  const Job failed = Get(stuck.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_NE(Reason(failed).find("FAILED_PRECONDITION"), std::string::npos) << Reason(failed);
  const absl::Duration waited = clock_.fn()() - start;
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LE(waited, absl::Milliseconds(500));
  // Backoff 20, 40, 80, 160, 200 ms: 6 calls before the next wait would pass busy_retry.
  EXPECT_EQ(client_->Calls("start", stuck.id()).size(), 6u);
}

TEST_F(CoordinatorTest, BadSpecsAreInvalidArgumentNamingTheField) {
  baton::v1::SubmitJobRequest r;
  *r.mutable_spec() = Spec(2);
  r.mutable_spec()->mutable_model()->mutable_mlp()->set_width(0);
  auto job = core_->SubmitJob(r);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message().rfind("model.mlp.width", 0), 0u) << job.status();

  *r.mutable_spec() = Spec(2);
  r.mutable_spec()->mutable_data()->set_batch_size(7);
  job = core_->SubmitJob(r);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message().rfind("data.batch_size", 0), 0u) << job.status();

  *r.mutable_spec() = Spec(5);  // 5 stages, 4 blocks
  job = core_->SubmitJob(r);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("pipeline.stages"), std::string::npos) << job.status();

  *r.mutable_spec() = Spec(2);
  r.mutable_spec()->mutable_pipeline()->set_virtual_stages(2);  // 1F1B runs one chunk per rank
  job = core_->SubmitJob(r);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("pipeline.virtual_stages"), std::string::npos)
      << job.status();

  // Inline text with more distinct characters than the vocabulary holds.
  baton::v1::JobSpec gpt;
  gpt.mutable_model()->mutable_gpt()->set_vocab_size(4);
  gpt.mutable_model()->mutable_gpt()->set_context(4);
  gpt.mutable_model()->mutable_gpt()->set_d_model(8);
  gpt.mutable_model()->mutable_gpt()->set_heads(2);
  gpt.mutable_model()->mutable_gpt()->set_layers(1);
  gpt.mutable_data()->mutable_text()->set_inline_text("abcdefghijklmnop");
  gpt.mutable_data()->set_batch_size(2);
  gpt.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  gpt.set_steps(1);
  *r.mutable_spec() = gpt;
  job = core_->SubmitJob(r);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("vocab_size"), std::string::npos) << job.status();
  r.mutable_spec()->mutable_model()->mutable_gpt()->set_vocab_size(16);
  EXPECT_TRUE(core_->SubmitJob(r).ok());

  r.clear_spec();
  EXPECT_EQ(core_->SubmitJob(r).status().code(), absl::StatusCode::kInvalidArgument);

  // Nothing was stored; the coordinator keeps serving.
  auto list = core_->ListJobs({});
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 1);  // the good gpt job
  EXPECT_EQ(Submit(Spec(2)).id(), "job-000002");
}

TEST_F(CoordinatorTest, UnknownJobIdsAreNotFound) {
  EXPECT_EQ(core_->GetJob("job-404").status().code(), absl::StatusCode::kNotFound);
  baton::v1::CancelJobRequest c;
  c.set_job_id("job-404");
  EXPECT_EQ(core_->CancelJob(c).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->WatchJob("job-404").status().code(), absl::StatusCode::kNotFound);
  baton::v1::ReportResultRequest r;
  r.set_job_id("job-404");
  EXPECT_EQ(core_->ReportResult(r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->GetJob("").status().code(), absl::StatusCode::kInvalidArgument);
  // Unknown workers must register again.
  EXPECT_FALSE(Beat("w-404").known());
}

TEST_F(CoordinatorTest, SubmissionIdMakesSubmitIdempotent) {
  const Job first = Submit(Spec(2), "client-42");
  const Job again = Submit(Spec(2), "client-42");
  EXPECT_EQ(again.id(), first.id());
  baton::v1::SubmitJobRequest r;
  *r.mutable_spec() = Spec(2, /*steps=*/99);
  r.set_submission_id("client-42");
  auto other = core_->SubmitJob(r);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(other.status().message().find("submission_id"), std::string::npos);
  EXPECT_NE(Submit(Spec(2), "client-43").id(), first.id());
  EXPECT_NE(Submit(Spec(2)).id(), first.id());
  EXPECT_EQ(core_->ListJobs({})->jobs_size(), 3);
}

TEST_F(CoordinatorTest, ListJobsPagesNewestFirst) {
  for (int i = 0; i < 5; ++i) Submit(Spec(1));
  baton::v1::ListJobsRequest r;
  r.set_page_size(2);
  std::vector<std::string> ids;
  for (int page = 0; page < 5; ++page) {
    auto resp = core_->ListJobs(r);
    ASSERT_TRUE(resp.ok()) << resp.status();
    for (const auto& j : resp->jobs()) ids.push_back(j.id());
    if (resp->next_page_token().empty()) break;
    r.set_page_token(resp->next_page_token());
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"job-000005", "job-000004", "job-000003", "job-000002",
                                           "job-000001"}));
  r.set_page_size(-1);
  EXPECT_EQ(core_->ListJobs(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, ReRegisteringBusyWorkerFailsItsJob) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  // The process at Address(2) restarted and registers afresh.
  const std::string w2b = Register(2);
  EXPECT_NE(w2b, w2);
  const Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(failed), absl::StrCat("worker ", w2, " (", Address(2),
                                         ") registered again while running rank 1"));
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w2b), baton::v1::WORKER_STATE_IDLE);
}

// A recovering job whose surviving worker answers the abort "still stopping" (its job
// thread has not ended yet) waits for that worker rather than recovering at once on fewer
// stages; for stop_grace at most.
TEST_F(CoordinatorTest, ARecoveryWaitsForItsWorkersStillStopping) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  client_->StillStopping(Address(3));
  baton::v1::JobSpec spec = RecoverableSpec(3, /*steps=*/10);
  spec.mutable_restart()->set_max_restarts(2);
  spec.mutable_restart()->set_min_stages(1);
  const Job submitted = Submit(spec);
  core_->Tick();
  const Job job = Get(submitted.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  for (int64_t step = 1; step <= 2; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(Progress(*core_, job, rank, step, step == 2 ? 10 : 0).ok());
    }
  }
  // w-2 (rank 1) is lost; w-1 stops at once, w-3 is still stopping.
  OutliveLeases(job.id(), {w1, w3});
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(WorkerState(w1), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerState(w3), baton::v1::WORKER_STATE_BUSY);
  core_->Tick();
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RECOVERING) << "placed on 1 stage";
  // w-3's job thread ended: its heartbeat frees it, and the job recovers on 2 stages.
  Beat(w1);
  Beat(w3);
  core_->Tick();
  Job now = Get(job.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(now.workers_size(), 2);
  EXPECT_EQ(now.recoveries(0).stages_after(), 2);

  // The same again, but w-3 never lets go: after stop_grace (30 s) the job recovers on the
  // one worker left.
  const Job again = now;
  for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(Progress(*core_, again, rank, 3, 0).ok());
  baton::v1::ReportResultRequest failed;
  failed.set_job_id(job.id());
  failed.set_worker_id(again.workers(0));
  failed.set_rank(0);
  failed.set_attempt(1);
  failed.set_error("INTERNAL: a bug of rank 0's");
  failed.set_cause(baton::v1::FAILURE_CAUSE_INTERNAL);
  ASSERT_TRUE(core_->ReportResult(failed).ok());
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RECOVERING);
  core_->Tick();
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RECOVERING);
  for (int i = 0; i < 16; ++i) {
    clock_.Advance(absl::Seconds(2));
    Beat(w1);
    Beat(w3, job.id());  // still running the old attempt
  }
  core_->Tick();
  now = Get(job.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING) << Reason(now);
  EXPECT_EQ(now.workers_size(), 1);
  EXPECT_EQ(now.recoveries(1).stages_after(), 1);
}

TEST_F(CoordinatorTest, LostWorkerRecoversTheJobOnFewerStagesFromItsLastCheckpoint) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const Job submitted = Submit(RecoverableSpec(3, /*steps=*/10));
  core_->Tick();
  const Job job = Get(submitted.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  const auto first_plans = client_->Plans(job.id());
  ASSERT_EQ(first_plans.size(), 3u);
  // Steps 1..3 done everywhere, checkpoint 2 complete.
  for (int64_t step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(Progress(*core_, job, rank, step, step == 2 ? 10 : 0).ok());
    }
  }
  ASSERT_EQ(Get(job.id()).steps_done(), 3);
  // w-2 (rank 1) goes silent past its lease.
  OutliveLeases(job.id(), {w1, w3});
  core_->Tick();  // RECOVERING; w-1 and w-3 aborted (and freed when the calls return)
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RECOVERING);
  core_->Tick();  // placed again on them
  Job now = Get(job.id());
  ASSERT_EQ(now.recoveries_size(), 1);
  const baton::v1::Recovery& r = now.recoveries(0);
  EXPECT_EQ(r.reason(), absl::StrCat("worker ", w2, " (", Address(2),
                                     ") lease expired (no heartbeat for 5s)"));
  EXPECT_EQ(r.cause(), baton::v1::FAILURE_CAUSE_WORKER_LOST);
  EXPECT_EQ(r.from_step(), 2);
  EXPECT_EQ(r.lost_steps(), 1);
  EXPECT_EQ(r.stages_before(), 3);
  EXPECT_EQ(r.stages_after(), 2);
  std::vector<std::string> states;
  for (const auto& h : now.history()) states.push_back(baton::v1::JobState_Name(h.state()));
  ASSERT_GE(states.size(), 3u);
  EXPECT_EQ(states[states.size() - 4], "JOB_STATE_RECOVERING");
  EXPECT_THAT(now.history(now.history_size() - 4).reason(),
              testing::HasSubstr("; recovering (1 of 1) from step 2, 1 step to train again"));
  EXPECT_EQ(now.history(now.history_size() - 3).reason(), "stopping the job's other workers");
  EXPECT_THAT(now.history(now.history_size() - 2).reason(),
              testing::HasSubstr("(recovery 1: 3 -> 2 stages, from the newest checkpoint; "));
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(now.steps_done(), 2);
  EXPECT_EQ(now.workers_size(), 2);
  auto aborts = client_->Calls("abort", job.id());
  EXPECT_EQ(aborts.size(), 2u);  // w-1 and w-3, not the dead w-2
  // The new attempt's plans: 2 stages, attempt 1, another tensor key, resume from the
  // newest complete checkpoint the ranks find (step 0: the coordinator's record may lag).
  auto plans = client_->Plans(job.id());
  ASSERT_EQ(plans.size(), 5u);
  for (size_t i = 3; i < 5; ++i) {
    EXPECT_EQ(plans[i].attempt(), 1);
    EXPECT_EQ(plans[i].num_ranks(), 2);
    EXPECT_NE(plans[i].job_key(), first_plans[0].job_key());
    EXPECT_EQ(plans[i].resume_job_dir(), "/shared/ckpt/" + job.id());
    EXPECT_EQ(plans[i].resume_step(), 0);
    EXPECT_EQ(plans[i].spec().pipeline().stages(), 2);
  }
  EXPECT_EQ(now.spec().pipeline().stages(), 3) << "the spec stays as submitted";
  // The old attempt's late reports are refused; the new attempt's count.
  baton::v1::ReportProgressRequest late;
  late.set_job_id(job.id());
  late.set_worker_id(now.workers(0));
  late.set_rank(0);
  late.set_step(4);
  late.set_attempt(0);
  EXPECT_FALSE(core_->ReportProgress(late)->keep_running());
  late.set_attempt(1);
  late.set_resumed_from_step(2);
  EXPECT_TRUE(core_->ReportProgress(late)->keep_running());
  now = Get(job.id());
  EXPECT_TRUE(now.recoveries(0).has_resumed());
  EXPECT_EQ(Reason(now), "resumed from its own checkpoint step 2");
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_recoveries_total 1"));
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_recovery_seconds_count 1"));
  // A second loss: no restarts left.
  baton::v1::ReportResultRequest fail;
  fail.set_job_id(job.id());
  fail.set_worker_id(now.workers(1));
  fail.set_rank(1);
  fail.set_attempt(1);
  fail.set_error("UNAVAILABLE: the stream to rank 0 failed");
  fail.set_cause(baton::v1::FAILURE_CAUSE_PEER);
  ASSERT_TRUE(core_->ReportResult(fail).ok());
  // A broken link waits for a root cause (rank 0's error or silence); none comes.
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(3));  // half a lease and half a heartbeat interval
  Beat(now.workers(0), job.id());
  core_->Tick();
  now = Get(job.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Reason(now), testing::HasSubstr("UNAVAILABLE: the stream to rank 0 failed"));
  EXPECT_THAT(Reason(now), testing::HasSubstr("(no restarts left (1 of 1 used))"));
}

// A step report of `rank` of `job`'s current attempt.
absl::StatusOr<baton::v1::ReportProgressResponse> StepReport(Coordinator& core, const Job& job,
                                                             int rank, int64_t step,
                                                             int attempt = 0) {
  baton::v1::ReportProgressRequest p;
  p.set_job_id(job.id());
  p.set_worker_id(job.workers(rank));
  p.set_rank(rank);
  p.set_step(step);
  p.set_attempt(attempt);
  return core.ReportProgress(p);
}

// Preemption end to end in the core: a higher-priority job that does not fit stops the
// running lower-priority job at the step after the newest reported, every rank writes that
// step's checkpoint and stops; the low job goes PREEMPTED, the urgent one runs on its
// workers, and the low one resumes from that checkpoint afterwards, recorded in both jobs'
// histories and the metrics. A job without checkpoints is never preempted.
TEST_F(CoordinatorTest, AHigherPriorityJobPreemptsACheckpointingJobWhichResumesLater) {
  Register(1);
  Register(2);
  baton::v1::JobSpec low_spec = Spec(2, /*steps=*/20);
  low_spec.mutable_checkpoint()->set_every_steps(5);
  low_spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  const Job low = Submit(low_spec);
  core_->Tick();
  const Job running = Get(low.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(StepReport(*core_, running, 0, 1).ok());
  ASSERT_TRUE(StepReport(*core_, running, 0, 2).ok());
  ASSERT_TRUE(StepReport(*core_, running, 0, 3).ok());
  ASSERT_TRUE(StepReport(*core_, running, 1, 1).ok());
  ASSERT_TRUE(StepReport(*core_, running, 1, 2).ok());

  baton::v1::JobSpec urgent_spec = Spec(2, /*steps=*/2);
  urgent_spec.set_priority(5);
  const Job urgent = Submit(urgent_spec);
  core_->Tick();
  // Rank 0 reported step 3 and may be running step 4, no further: every rank stops after 4.
  Job now = Get(low.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Reason(now), absl::StrCat("preempting for ", urgent.id(),
                                      " (priority 5 > 0): every rank stops after step 4 with "
                                      "its checkpoint, then gives its worker to it"));
  Job waiting = Get(urgent.id());
  EXPECT_EQ(waiting.state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(waiting.wait_reason(),
              testing::HasSubstr(absl::StrCat("preempting lower-priority jobs: ", low.id())));
  bool noted = false;
  for (const auto& h : waiting.history()) {
    noted |= h.reason() == absl::StrCat("preempting ", low.id(),
                                        " (priority 0, 2 workers): it stops after step 4 with "
                                        "its checkpoint");
  }
  EXPECT_TRUE(noted) << waiting.DebugString();
  core_->Tick();  // no second preemption while this one is under way
  int preempting = 0;
  const Job after = Get(urgent.id());
  for (const auto& h : after.history()) {
    preempting += absl::StartsWith(h.reason(), absl::StrCat("preempting ", low.id())) ? 1 : 0;
  }
  EXPECT_EQ(preempting, 1);
  EXPECT_EQ(client_->Calls("abort", low.id()).size(), 0u);  // it stops itself, unaborted

  // Steps before 4 go on; step 4's answer tells each rank to checkpoint and stop.
  auto r = StepReport(*core_, running, 1, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->keep_running());
  EXPECT_FALSE(r->checkpoint_and_stop());
  for (int rank = 0; rank < 2; ++rank) {
    r = StepReport(*core_, running, rank, 4);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->keep_running());
    EXPECT_TRUE(r->checkpoint_and_stop()) << "rank " << rank;
  }
  // A rank past the step asked is stopped outright (it cannot be: it waits for the answer).
  r = StepReport(*core_, running, 0, 5);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->keep_running());

  for (int rank = 0; rank < 2; ++rank) {
    baton::v1::ReportResultRequest stopped;
    stopped.set_job_id(low.id());
    stopped.set_worker_id(running.workers(rank));
    stopped.set_rank(rank);
    stopped.set_stopped_after_step(4);
    baton::v1::CheckpointWrite* w = stopped.add_checkpoints();
    w->set_step(4);
    w->set_bytes(100);
    ASSERT_TRUE(core_->ReportResult(stopped).ok());
    if (rank == 0) {
      EXPECT_EQ(Get(low.id()).state(), baton::v1::JOB_STATE_RUNNING);
    }
  }
  now = Get(low.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_PREEMPTED);
  EXPECT_EQ(Reason(now), absl::StrCat("preempted by ", urgent.id(),
                                      ": stopped after step 4 with its checkpoint written; "
                                      "waits to resume from it"));
  ASSERT_EQ(now.recoveries_size(), 1);
  EXPECT_EQ(now.recoveries(0).preempted_by(), urgent.id());
  EXPECT_EQ(now.recoveries(0).from_step(), 4);
  EXPECT_EQ(now.recoveries(0).lost_steps(), 0);
  EXPECT_EQ(now.steps_done(), 4);
  ASSERT_EQ(now.checkpoints().complete_size(), 1);
  EXPECT_EQ(now.checkpoints().complete(0).step(), 4);
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_preemptions_total 1"));
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_recoveries_total 0"));
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_jobs{state=\"preempted\"} 1"));

  core_->Tick();  // the urgent job takes the workers; the preempted one waits behind it
  EXPECT_EQ(Get(urgent.id()).state(), baton::v1::JOB_STATE_RUNNING);
  now = Get(low.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_PREEMPTED);
  EXPECT_EQ(now.queue_position(), 1);
  FinishAllRanks(Get(urgent.id()));
  EXPECT_EQ(Get(urgent.id()).state(), baton::v1::JOB_STATE_SUCCEEDED);

  core_->Tick();  // placed again, resuming from its own newest checkpoint
  now = Get(low.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING);
  bool placed_again = false;
  for (const auto& h : now.history()) {
    placed_again |= h.reason().find("(resuming after preemption 1: 2 -> 2 stages, from the "
                                    "newest checkpoint; ") != std::string::npos;
  }
  EXPECT_TRUE(placed_again);
  const auto plans = client_->Plans(low.id());
  ASSERT_EQ(plans.size(), 4u);
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(plans[i].attempt(), 1);
    EXPECT_EQ(plans[i].resume_job_dir(), "/shared/ckpt/" + low.id());
    EXPECT_EQ(plans[i].resume_step(), 0);
  }
  baton::v1::ReportProgressRequest resumed;
  resumed.set_job_id(low.id());
  resumed.set_worker_id(now.workers(0));
  resumed.set_rank(0);
  resumed.set_step(5);
  resumed.set_attempt(1);
  resumed.set_resumed_from_step(4);
  ASSERT_TRUE(core_->ReportProgress(resumed)->keep_running());
  now = Get(low.id());
  EXPECT_EQ(Reason(now), "resumed from its own checkpoint step 4");
  EXPECT_TRUE(now.recoveries(0).has_resumed());
  EXPECT_THAT(MetricsText(), testing::HasSubstr("baton_coordinator_recovery_seconds_count 0"));

  // A job that writes no checkpoints keeps its workers, whatever waits.
  baton::v1::CancelJobRequest cancel;
  cancel.set_job_id(low.id());
  ASSERT_TRUE(core_->CancelJob(cancel).ok());
  const Job plain = Submit(urgent_spec);
  core_->Tick();
  const Job plain_running = Get(plain.id());
  ASSERT_EQ(plain_running.state(), baton::v1::JOB_STATE_RUNNING);
  for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(StepReport(*core_, plain_running, rank, 1).ok());
  baton::v1::JobSpec top_spec = Spec(2, 2);
  top_spec.set_priority(9);
  const Job top = Submit(top_spec);
  core_->Tick();
  EXPECT_EQ(Get(plain.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Get(top.id()).wait_reason(), testing::HasSubstr("first in line"));
}

// A rank that fails while its job stops for a preemption (its answer was lost, and the peers
// it waited for had stopped) does not cost the job its life: PREEMPTED all the same, its
// still-running ranks stopped first, resuming from the newest complete checkpoint.
TEST_F(CoordinatorTest, AFailureWhileStoppingForAPreemptionStillRequeuesTheJob) {
  Register(1);
  Register(2);
  baton::v1::JobSpec low_spec = Spec(2, /*steps=*/20);
  low_spec.mutable_checkpoint()->set_every_steps(2);
  low_spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  const Job low = Submit(low_spec);
  core_->Tick();
  const Job running = Get(low.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);
  for (int64_t step = 1; step <= 2; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(Progress(*core_, running, rank, step, step == 2 ? 10 : 0).ok());
    }
  }
  baton::v1::JobSpec urgent_spec = Spec(2, /*steps=*/2);
  urgent_spec.set_priority(5);
  const Job urgent = Submit(urgent_spec);
  core_->Tick();  // low stops after step 3
  auto r = StepReport(*core_, running, 0, 3);
  ASSERT_TRUE(r.ok() && r->checkpoint_and_stop());
  baton::v1::ReportResultRequest stopped;
  stopped.set_job_id(low.id());
  stopped.set_worker_id(running.workers(0));
  stopped.set_rank(0);
  stopped.set_stopped_after_step(3);
  ASSERT_TRUE(core_->ReportResult(stopped).ok());
  // Rank 1 never got its answer: a root-cause error of its own.
  baton::v1::ReportResultRequest failed;
  failed.set_job_id(low.id());
  failed.set_worker_id(running.workers(1));
  failed.set_rank(1);
  failed.set_error("INTERNAL: the step 4 receive from rank 0 failed");
  failed.set_cause(baton::v1::FAILURE_CAUSE_INTERNAL);
  ASSERT_TRUE(core_->ReportResult(failed).ok());
  Job now = Get(low.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_PREEMPTED);
  EXPECT_THAT(Reason(now), testing::HasSubstr(absl::StrCat(
                               "preempted by ", urgent.id(), " while it stopped: waits to resume "
                               "from step 2 (its newest complete checkpoint), 0 steps to train "
                               "again")));  // the last rank had not reported step 3
  ASSERT_EQ(now.recoveries_size(), 1);
  EXPECT_EQ(now.recoveries(0).preempted_by(), urgent.id());
  EXPECT_EQ(now.recoveries(0).from_step(), 2);
  EXPECT_EQ(now.recoveries(0).lost_steps(), 0);
  core_->Tick();
  EXPECT_EQ(Get(urgent.id()).state(), baton::v1::JOB_STATE_RUNNING);
  FinishAllRanks(Get(urgent.id()));
  core_->Tick();
  now = Get(low.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING);
  const auto plans = client_->Plans(low.id());
  ASSERT_EQ(plans.size(), 4u);
  EXPECT_EQ(plans[3].resume_job_dir(), "/shared/ckpt/" + low.id());
}

// A user allowed priority 5 once preempted bob's job 8 times with 8 jobs that never trained
// (half failed at start, half were cancelled while preempting), once 0.15 s after it
// resumed. Now a job is protected until it has run a minute and 2 steps since it started or
// resumed; a preemptor cancelled before any rank stopped withdraws its preemption; and a
// preemptor that ends without training a step bars its user from preempting for 10
// minutes. Bob's job is preempted once, and `get` can say by whom.
TEST_F(CoordinatorTest, PreemptionChurnIsBounded) {
  preempt_min_run_ = absl::Minutes(1);
  preempt_min_steps_ = 2;
  Start(":memory:");
  const std::string w1 = Register(1), w2 = Register(2);
  // Time passes with both workers heartbeating what they run (their leases are 5 s).
  auto pass = [&](absl::Duration d, const Job& job) {
    for (absl::Duration left = d; left > absl::ZeroDuration(); left -= absl::Seconds(2)) {
      clock_.Advance(std::min(left, absl::Seconds(2)));
      Beat(w1, job.id());
      Beat(w2, job.id());
    }
  };
  auto submit = [&](const baton::v1::JobSpec& spec, const std::string& user, bool admin) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = spec;
    absl::StatusOr<Job> job = core_->SubmitJob(r, user, admin);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  };
  auto cancel = [&](const Job& job) {
    baton::v1::CancelJobRequest c;
    c.set_job_id(job.id());
    ASSERT_TRUE(core_->CancelJob(c).ok());
  };
  auto steps = [&](const Job& job, int64_t step, int attempt = 0) {
    for (int rank = 0; rank < 2; ++rank) {
      auto r = StepReport(*core_, job, rank, step, attempt);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->keep_running()) << "step " << step << " rank " << rank;
    }
  };
  auto notes = [&](const Job& job, const std::string& start) {
    int n = 0;
    const Job now = Get(job.id());
    for (const auto& h : now.history()) n += absl::StartsWith(h.reason(), start);
    return n;
  };
  baton::v1::JobSpec low_spec = Spec(2, /*steps=*/40);
  low_spec.mutable_checkpoint()->set_every_steps(5);
  low_spec.mutable_checkpoint()->set_dir("/shared/ckpt/bob");
  const Job low = submit(low_spec, "bob", /*admin=*/false);
  core_->Tick();
  const Job running = Get(low.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);
  steps(running, 1);
  baton::v1::JobSpec urgent_spec = Spec(2, /*steps=*/2);
  urgent_spec.set_priority(5);

  // Just started: protected.
  const Job first = submit(urgent_spec, "alice", /*admin=*/true);
  core_->Tick();
  EXPECT_EQ(notes(low, "preempting for"), 0);
  EXPECT_THAT(Get(first.id()).wait_reason(),
              HasSubstr("not preempting, still protected: " + low.id() +
                        " (started 0s ago and trained 1 step"));
  // A minute and a step later it may be preempted; cancelling the preemptor before any rank
  // stopped withdraws the preemption, and bars alice.
  pass(absl::Seconds(61), running);
  steps(running, 2);
  core_->Tick();
  ASSERT_EQ(notes(low, "preempting for " + first.id()), 1);
  cancel(first);
  EXPECT_EQ(notes(low, "preemption withdrawn: " + first.id() + " ended (CANCELLED)"), 1);
  steps(running, 3);  // not told to stop
  const Job second = submit(urgent_spec, "alice", /*admin=*/true);
  core_->Tick();
  EXPECT_EQ(notes(low, "preempting for"), 1);
  EXPECT_THAT(Get(second.id()).wait_reason(),
              HasSubstr("it preempts nothing: alice's " + first.id() +
                        " preempted other jobs and ended without training a step"));
  cancel(second);  // it preempted nothing: no penalty of its own

  // Ten minutes on, alice may preempt again; her job fails to start on the freed workers.
  pass(absl::Minutes(10), running);
  steps(running, 4);
  const Job third = submit(urgent_spec, "alice", /*admin=*/true);
  core_->Tick();
  ASSERT_EQ(notes(low, "preempting for " + third.id()), 1);
  for (int rank = 0; rank < 2; ++rank) {
    auto r = StepReport(*core_, running, rank, 5);
    ASSERT_TRUE(r.ok() && r->checkpoint_and_stop());
    baton::v1::ReportResultRequest stopped;
    stopped.set_job_id(low.id());
    stopped.set_worker_id(running.workers(rank));
    stopped.set_rank(rank);
    stopped.set_stopped_after_step(5);
    stopped.add_checkpoints()->set_step(5);
    ASSERT_TRUE(core_->ReportResult(stopped).ok());
  }
  ASSERT_EQ(Get(low.id()).state(), baton::v1::JOB_STATE_PREEMPTED);
  client_->FailStart(Address(1));
  core_->Tick();
  EXPECT_EQ(Get(third.id()).state(), baton::v1::JOB_STATE_FAILED);
  client_->FailStart(Address(1), false);
  core_->Tick();  // bob's job resumes on its workers
  const Job resumed = Get(low.id());
  ASSERT_EQ(resumed.state(), baton::v1::JOB_STATE_RUNNING);
  steps(resumed, 6, /*attempt=*/1);

  // Alice is barred again; an admin's more urgent job finds bob's job protected (resumed
  // just now), and the reason says so.
  const Job fourth = submit(urgent_spec, "alice", /*admin=*/true);
  baton::v1::JobSpec top_spec = urgent_spec;
  top_spec.set_priority(9);
  const Job top = submit(top_spec, "root", /*admin=*/true);
  core_->Tick();
  EXPECT_EQ(Get(low.id()).state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(notes(low, "preempting for"), 2);
  EXPECT_THAT(Get(top.id()).wait_reason(),
              HasSubstr("still protected: " + low.id() + " (resumed 0s ago and trained 1 step"));
  EXPECT_THAT(Get(fourth.id()).wait_reason(),
              HasSubstr("behind the first in line"));  // the top job is first in line
  const Job now = Get(low.id());
  ASSERT_EQ(now.recoveries_size(), 1);
  EXPECT_EQ(now.recoveries(0).preempted_by(), third.id());
  EXPECT_EQ(now.recoveries(0).preempted_by_user(), "alice");
}

// A rank that stops after another step than the one asked fails the job, naming both.
TEST_F(CoordinatorTest, ARankStoppingAfterAnUnaskedStepFailsTheJob) {
  Register(1);
  baton::v1::JobSpec spec = Spec(1, /*steps=*/10);
  spec.mutable_checkpoint()->set_every_steps(5);
  spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  const Job job = Submit(spec);
  core_->Tick();
  const Job running = Get(job.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);
  baton::v1::ReportResultRequest stopped;
  stopped.set_job_id(job.id());
  stopped.set_worker_id(running.workers(0));
  stopped.set_rank(0);
  stopped.set_stopped_after_step(3);
  ASSERT_TRUE(core_->ReportResult(stopped).ok());
  const Job now = Get(job.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Reason(now), testing::HasSubstr("stopped after step 3 unasked"));
}

TEST_F(CoordinatorTest, RecoveryWaitsForMinStagesAndAConfigErrorNeverRecovers) {
  const std::string w1 = Register(1), w2 = Register(2);
  baton::v1::JobSpec spec = Spec(2, /*steps=*/10);
  spec.mutable_restart()->set_max_restarts(3);  // min_stages: 2 (never fewer)
  const Job job = Submit(spec);
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  OutliveLeases(job.id(), {w1});
  core_->Tick();
  core_->Tick();
  Job now = Get(job.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(Reason(now), "waiting for 2 idle workers to recover on (1 idle)");
  EXPECT_EQ(now.recoveries(0).from_step(), 0) << "no checkpoint: from the start";
  // A new worker comes: placed again on 2 stages.
  const std::string w3 = Register(3);
  core_->Tick();
  now = Get(job.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING) << Reason(now);
  EXPECT_EQ(now.workers_size(), 2);
  for (const auto& plan : client_->Plans(job.id())) {
    if (plan.attempt() == 1) {
      EXPECT_TRUE(plan.resume_job_dir().empty());
    }
  }
  // A configuration error fails at once, restarts or not.
  baton::v1::ReportResultRequest fail;
  fail.set_job_id(job.id());
  fail.set_worker_id(now.workers(0));
  fail.set_rank(0);
  fail.set_attempt(1);
  fail.set_error("INVALID_ARGUMENT: data.text.path: no such file");
  fail.set_cause(baton::v1::FAILURE_CAUSE_CONFIG);
  ASSERT_TRUE(core_->ReportResult(fail).ok());
  now = Get(job.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Reason(now), testing::HasSubstr("a configuration error would fail again"));
}

TEST_F(CoordinatorTest, RestartedCoordinatorRecoversRunningJobsThatAskForIt) {
  const std::string db = TempDb();
  Start(db);
  Register(1);
  Register(2);
  baton::v1::JobSpec spec = Spec(2, /*steps=*/10);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  spec.mutable_restart()->set_max_restarts(1);
  const Job job = Submit(spec);
  core_->Tick();
  const Job running = Get(job.id());
  ASSERT_EQ(running.state(), baton::v1::JOB_STATE_RUNNING);
  for (int rank : {0, 1}) ASSERT_TRUE(Progress(*core_, running, rank, 2, 10).ok());

  EXPECT_EQ(core_->InvalidTransitions(), 0);
  core_.reset();  // the coordinator dies mid-job
  Start(db);
  Job now = Get(job.id());
  ASSERT_EQ(now.state(), baton::v1::JOB_STATE_RECOVERING) << Reason(now);
  ASSERT_EQ(now.recoveries_size(), 1);
  EXPECT_EQ(now.recoveries(0).reason(), "coordinator restarted while the job was running");
  EXPECT_EQ(now.recoveries(0).from_step(), 2);
  // The workers register again (their old job is dropped on their side); it is placed again.
  Register(1);
  Register(2);
  core_->Tick();
  now = Get(job.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING) << Reason(now);
  int attempt1 = 0;
  for (const auto& plan : client_->Plans(job.id())) {
    if (plan.attempt() != 1) continue;
    ++attempt1;
    EXPECT_EQ(plan.resume_job_dir(), "/shared/ckpt/" + job.id());
  }
  EXPECT_EQ(attempt1, 2);
  EXPECT_EQ(core_->InvalidTransitions(), 0);
}

TEST_F(CoordinatorTest, RestartKeepsHistoryAndFailsJobsInFlight) {
  const std::string db = TempDb();
  Start(db);
  const std::string w1 = Register(1), w2 = Register(2);
  const Job running = Submit(Spec(2));
  const Job queued = Submit(Spec(2));
  const Job cancelled = Submit(Spec(1));
  core_->Tick();
  baton::v1::CancelJobRequest c;
  c.set_job_id(cancelled.id());
  ASSERT_TRUE(core_->CancelJob(c).ok());
  ASSERT_EQ(Get(running.id()).state(), baton::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Get(queued.id()).state(), baton::v1::JOB_STATE_QUEUED);

  EXPECT_EQ(core_->InvalidTransitions(), 0);
  core_.reset();  // the coordinator goes away
  Start(db);
  auto list = core_->ListJobs({});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->jobs_size(), 3);
  const Job was_running = Get(running.id());
  EXPECT_EQ(was_running.state(), baton::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Reason(was_running), "coordinator restarted while the job was running");
  EXPECT_EQ(Get(cancelled.id()).state(), baton::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Get(queued.id()).state(), baton::v1::JOB_STATE_QUEUED);
  // The workers come back: unknown, they register again, and the old job is aborted.
  EXPECT_FALSE(Beat(w1, running.id()).known());
  const std::string n1 = Register(1), n2 = Register(2);
  auto beat = Beat(n1, running.id());
  ASSERT_EQ(beat.abort_job_ids_size(), 1);
  EXPECT_EQ(beat.abort_job_ids(0), running.id());
  Beat(n1);
  core_->Tick();
  EXPECT_EQ(Get(queued.id()).state(), baton::v1::JOB_STATE_RUNNING);
  // New ids continue after the old ones.
  EXPECT_EQ(Submit(Spec(1)).id(), "job-000004");
  EXPECT_EQ(core_->InvalidTransitions(), 0);
}

TEST_F(CoordinatorTest, MetricsCountStatesQueueWaitAndMissedHeartbeats) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2, /*steps=*/2));
  Submit(Spec(3, /*steps=*/2));  // waits: only two workers
  clock_.Advance(absl::Seconds(3));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  Beat(w1, job.id());  // 3 s after registering: 2 heartbeats missed by each worker
  Beat(w2, job.id());
  clock_.Advance(absl::Milliseconds(3500));  // w1 misses 2 more (3 whole intervals pass)
  Beat(w1, job.id());

  const StateCounts counts = core_->CountStates();
  EXPECT_EQ(counts.workers.at("busy"), 2);
  EXPECT_EQ(counts.workers.at("idle"), 0);
  EXPECT_EQ(counts.jobs.at("running"), 1);
  EXPECT_EQ(counts.jobs.at("queued"), 1);
  EXPECT_EQ(counts.jobs.at("succeeded"), 0);
  const std::string text = MetricsText();
  EXPECT_THAT(text, HasSubstr("baton_coordinator_workers{state=\"busy\"} 2"));
  EXPECT_THAT(text, HasSubstr("baton_coordinator_jobs{state=\"queued\"} 1"));
  EXPECT_THAT(text, HasSubstr("baton_coordinator_queue_wait_seconds_count 1"));
  EXPECT_THAT(text, HasSubstr("baton_coordinator_queue_wait_seconds_sum 3"));
  EXPECT_THAT(text, HasSubstr("baton_coordinator_heartbeats_missed_total 6"));
  EXPECT_THAT(text, HasSubstr("baton_coordinator_lease_expirations_total 0"));
  // Every Tick ran a placement round, each observed once.
  EXPECT_THAT(text, HasSubstr("baton_coordinator_placement_round_seconds_count "));
  EXPECT_THAT(text, testing::Not(HasSubstr("baton_coordinator_placement_round_seconds_count 0\n")));

  // w2 stays silent past its lease: one expiration, and its missed heartbeats counted
  // (w1: 1 more after 2 s; w2: 4 more, 5.5 s after its last heartbeat).
  clock_.Advance(absl::Seconds(2));
  Beat(w1, job.id());
  core_->Tick();
  EXPECT_THAT(MetricsText(), HasSubstr("baton_coordinator_lease_expirations_total 1"));
  EXPECT_THAT(MetricsText(), HasSubstr("baton_coordinator_heartbeats_missed_total 11"));
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_FAILED);

  // A stopped coordinator no longer answers the state gauges.
  core_->Stop();
  EXPECT_TRUE(metrics_.StateCollector()->Collect().empty());
}

TEST_F(CoordinatorTest, TracesAreKeptForTheLatestStepsAndServedByStep) {
  const std::string w1 = Register(1), w2 = Register(2);
  const Job job = Submit(Spec(2, /*steps=*/5));
  core_->Tick();
  ASSERT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_RUNNING);
  auto report = [&](int rank, int64_t step) {
    baton::v1::ReportProgressRequest p;
    p.set_job_id(job.id());
    p.set_worker_id(rank == 0 ? w1 : w2);
    p.set_rank(rank);
    p.set_step(step);
    if (rank == 1) p.set_loss(1.0f);
    baton::v1::RankTrace* t = p.mutable_trace();
    t->set_rank(7);  // the coordinator trusts the request's rank, not the trace's
    t->set_start_unix_nanos(1000 * step);
    t->set_end_ns(500);
    baton::v1::ActionSpan* a = t->add_actions();
    a->set_action(absl::StrCat(rank, "F0"));
    a->set_end_ns(100 * step);
    ASSERT_TRUE(core_->ReportProgress(p).ok());
  };
  baton::v1::GetJobTraceRequest req;
  req.set_job_id(job.id());
  EXPECT_EQ(core_->GetJobTrace(req).status().code(), absl::StatusCode::kNotFound);
  for (int64_t step = 1; step <= 3; ++step) report(0, step), report(1, step);
  report(0, 4);  // rank 1 has not finished step 4 yet

  // Step 0: the latest step every rank reported.
  auto latest = core_->GetJobTrace(req);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step(), 3);
  EXPECT_EQ(latest->num_stages(), 2);
  EXPECT_EQ(latest->schedule(), "1f1b");
  ASSERT_EQ(latest->ranks_size(), 2);
  EXPECT_EQ(latest->ranks(1).rank(), 1);
  EXPECT_EQ(latest->ranks(1).worker_id(), w2);
  EXPECT_EQ(latest->ranks(1).actions(0).action(), "1F0");
  EXPECT_EQ(latest->ranks(1).actions(0).end_ns(), 300);
  // trace_steps = 2: steps 3 and 4 are kept, older ones are gone and named so.
  EXPECT_EQ(latest->first_kept_step(), 3);
  EXPECT_EQ(latest->last_kept_step(), 4);
  req.set_step(4);
  EXPECT_EQ(core_->GetJobTrace(req)->ranks_size(), 1);
  req.set_step(1);
  absl::StatusOr<baton::v1::JobTrace> gone = core_->GetJobTrace(req);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("steps 3 to 4 are kept"), std::string::npos)
      << gone.status();
  req.set_step(-1);
  EXPECT_EQ(core_->GetJobTrace(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_job_id("job-999999");
  req.set_step(0);
  EXPECT_EQ(core_->GetJobTrace(req).status().code(), absl::StatusCode::kNotFound);
}

// Reports step `step` of `rank` in `job`'s current attempt: the last rank's carries `loss`,
// every rank's a step time of `step_ms` (and its part of a checkpoint when `bytes` > 0).
absl::Status ReportStep(Coordinator& core, const Job& job, int rank, int64_t step, float loss,
                        int step_ms, int64_t resumed_from = 0, int64_t bytes = 0) {
  baton::v1::ReportProgressRequest p;
  p.set_job_id(job.id());
  p.set_worker_id(job.workers(rank));
  p.set_rank(rank);
  p.set_step(step);
  p.set_attempt(job.recoveries_size());
  if (rank == job.workers_size() - 1) p.set_loss(loss);
  *p.mutable_timing()->mutable_step() = ToProtoDuration(absl::Milliseconds(step_ms));
  p.set_resumed_from_step(resumed_from);
  if (bytes > 0) {
    baton::v1::CheckpointWrite* w = p.add_checkpoints();
    w->set_step(step);
    w->set_bytes(bytes);
  }
  absl::StatusOr<baton::v1::ReportProgressResponse> r = core.ReportProgress(p);
  if (!r.ok()) return r.status();
  if (!r->keep_running()) return absl::AbortedError("told to stop");
  return absl::OkStatus();
}

baton::v1::GetJobHistoryRequest HistoryRequest(const std::string& job_id, int64_t from_step = 0,
                                               int32_t page_size = 0) {
  baton::v1::GetJobHistoryRequest r;
  r.set_job_id(job_id);
  r.set_from_step(from_step);
  r.set_page_size(page_size);
  return r;
}

std::vector<int64_t> HistorySteps(const baton::v1::JobHistory& h) {
  std::vector<int64_t> out;
  for (const auto& s : h.steps()) out.push_back(s.step());
  return out;
}

TEST_F(CoordinatorTest, JobHistoryHasEveryStepInOrderAndOutlivesTheJobAndARestart) {
  const std::string db = TempDb();
  Start(db);
  Register(1);
  Register(2);
  const Job queued = Submit(Spec(2, /*steps=*/5));
  // Known but not run yet: an empty history, not an error.
  auto empty = core_->GetJobHistory(HistoryRequest(queued.id()));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->job_id(), queued.id());
  EXPECT_EQ(empty->steps_size(), 0);
  EXPECT_EQ(empty->next_from_step(), 0);
  core_->Tick();
  const Job job = Get(queued.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  for (int64_t step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(ReportStep(*core_, job, rank, step, 2.0f - 0.25f * step, 100 * step).ok());
    }
  }
  auto h = core_->GetJobHistory(HistoryRequest(job.id()));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(HistorySteps(*h), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(h->next_from_step(), 0);
  for (const baton::v1::StepProgress& s : h->steps()) {
    const double seconds = 0.1 * s.step();
    EXPECT_FLOAT_EQ(s.loss(), 2.0f - 0.25f * s.step());
    EXPECT_EQ(s.total_steps(), 5);
    EXPECT_DOUBLE_EQ(s.samples_per_second(), 8 / seconds);  // batch 8
    EXPECT_DOUBLE_EQ(s.tokens_per_second(), 8 / seconds);   // an MLP: a sample is a token
    EXPECT_EQ(FromProtoDuration(s.duration()), absl::Milliseconds(100 * s.step()));
    EXPECT_EQ(s.stages_size(), 0) << "the per-rank timings are WatchJob's only";
  }

  // Pages of 2: 1-2, 3-4, 5; from_step 0 is 1; a page ending on the last step says so.
  auto p1 = core_->GetJobHistory(HistoryRequest(job.id(), 0, 2));
  ASSERT_TRUE(p1.ok());
  EXPECT_EQ(HistorySteps(*p1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p1->next_from_step(), 3);
  auto p2 = core_->GetJobHistory(HistoryRequest(job.id(), p1->next_from_step(), 2));
  EXPECT_EQ(HistorySteps(*p2), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(p2->next_from_step(), 5);
  auto p3 = core_->GetJobHistory(HistoryRequest(job.id(), p2->next_from_step(), 2));
  EXPECT_EQ(HistorySteps(*p3), (std::vector<int64_t>{5}));
  EXPECT_EQ(p3->next_from_step(), 0);
  EXPECT_EQ(core_->GetJobHistory(HistoryRequest(job.id(), 4, 2))->next_from_step(), 0);
  EXPECT_TRUE(core_->GetJobHistory(HistoryRequest(job.id(), 6))->steps().empty());
  // Past the most a page holds: cut to it, not refused.
  EXPECT_EQ(core_->GetJobHistory(HistoryRequest(job.id(), 1, 1 << 30))->steps_size(), 5);

  // Bad requests name the field; unknown jobs are NOT_FOUND as GetJob says it.
  auto neg_from = core_->GetJobHistory(HistoryRequest(job.id(), -1));
  EXPECT_EQ(neg_from.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(neg_from.status().message(), "from_step:")) << neg_from.status();
  auto neg_size = core_->GetJobHistory(HistoryRequest(job.id(), 1, -5));
  EXPECT_EQ(neg_size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(neg_size.status().message(), "page_size:")) << neg_size.status();
  auto unknown = core_->GetJobHistory(HistoryRequest("job-999999"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(), core_->GetJob("job-999999").status().message());
  EXPECT_EQ(core_->GetJobHistory(HistoryRequest("")).status().code(),
            absl::StatusCode::kInvalidArgument);

  // The job ends; its history stays, the last row's loss being the job's last_loss, and it
  // survives a restart of the coordinator.
  FinishAllRanks(job);
  const Job done = Get(job.id());
  ASSERT_EQ(done.state(), baton::v1::JOB_STATE_SUCCEEDED) << Reason(done);
  h = core_->GetJobHistory(HistoryRequest(job.id()));
  ASSERT_EQ(h->steps_size(), 5);
  EXPECT_EQ(h->steps(4).loss(), done.last_loss());
  core_.reset();
  Start(db);
  auto after = core_->GetJobHistory(HistoryRequest(job.id()));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->SerializeAsString(), h->SerializeAsString());
}

TEST_F(CoordinatorTest, AHistoryTheStoreCannotTakeIsLoggedAndTheJobGoesOn) {
  const std::string db = TempDb();
  Start(db);
  Register(1);
  Register(2);
  const Job submitted = Submit(Spec(2, /*steps=*/3));
  core_->Tick();
  const Job job = Get(submitted.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  // Someone breaks the file under the coordinator: every step write fails from now on.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "DROP TABLE steps", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  for (int64_t step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(ReportStep(*core_, job, rank, step, 0.5f * step, 10).ok());
    }
  }
  Job now = Get(job.id());
  EXPECT_EQ(now.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(now.steps_done(), 3);
  EXPECT_FLOAT_EQ(now.last_loss(), 1.5f);
  EXPECT_FALSE(core_->GetJobHistory(HistoryRequest(job.id())).ok());  // the store's error
  FinishAllRanks(now);
  EXPECT_EQ(Get(job.id()).state(), baton::v1::JOB_STATE_SUCCEEDED) << Reason(Get(job.id()));
}

TEST_F(CoordinatorTest, JobHistoryKeepsTheLastRunOfAStepTrainedAgainAfterARecovery) {
  const std::string w1 = Register(1), w2 = Register(2), w3 = Register(3);
  const Job submitted = Submit(RecoverableSpec(3, /*steps=*/6));
  core_->Tick();
  const Job job = Get(submitted.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  // Steps 1..3 with losses 1, 2, 3; checkpoint 2 complete.
  for (int64_t step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(ReportStep(*core_, job, rank, step, 1.0f * step, 50, 0, step == 2 ? 10 : 0).ok());
    }
  }
  // w-2 goes silent: the job recovers on 2 stages from step 2 and trains step 3 again.
  OutliveLeases(job.id(), {w1, w3});
  core_->Tick();
  core_->Tick();
  const Job again = Get(job.id());
  ASSERT_EQ(again.state(), baton::v1::JOB_STATE_RUNNING) << Reason(again);
  ASSERT_EQ(again.recoveries_size(), 1);
  ASSERT_EQ(again.workers_size(), 2);
  for (int64_t step = 3; step <= 4; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(ReportStep(*core_, again, rank, step, 10.0f * step, 70, step == 3 ? 2 : 0).ok());
    }
  }
  auto h = core_->GetJobHistory(HistoryRequest(job.id()));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(HistorySteps(*h), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_FLOAT_EQ(h->steps(1).loss(), 2.0f);   // from the first attempt
  EXPECT_FLOAT_EQ(h->steps(2).loss(), 30.0f);  // trained again: its last run
  EXPECT_FLOAT_EQ(h->steps(3).loss(), 40.0f);
  EXPECT_EQ(FromProtoDuration(h->steps(2).duration()), absl::Milliseconds(70));
}

// SCHEDULE_AUTO on GPUs smaller than any candidate's balanced split needs: the planner
// moves blocks between ranks, the job's spec carries the split as pipeline.partition, and
// the stage plans follow it.
TEST_F(CoordinatorTest, AutoScheduleOnSmallGpusRunsTheMovedSplitItChose) {
  const int stages = 4;
  baton::v1::JobSpec spec = Spec(stages);
  baton::v1::GptSpec* gpt = spec.mutable_model()->mutable_gpt();  // 8 blocks
  gpt->set_vocab_size(32);
  gpt->set_context(16);
  gpt->set_d_model(32);
  gpt->set_heads(2);
  gpt->set_layers(6);
  spec.mutable_data()->mutable_text()->set_inline_text(
      "a planner should choose what a careful engineer would, and say why the others lost.");
  spec.mutable_data()->set_batch_size(32);
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_AUTO);
  spec.mutable_pipeline()->clear_microbatches();
  spec.set_device(baton::v1::DEVICE_KIND_CUDA);
  baton::v1::JobSpec valid = spec;
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&valid).ok());
  PlannerInput in = PlannerInputFor(valid, stages);
  in.keep = 1000;
  absl::StatusOr<Plan> free = PlanPipeline(in);
  ASSERT_TRUE(free.ok()) << free.status();
  // The first budget, among just under each candidate's balanced need (largest first),
  // whose pick the planner moved.
  std::set<int64_t> needs;
  for (const PlanCandidate& c : free->ranked) needs.insert(c.max_peak_bytes);
  std::vector<int> want;
  for (auto it = needs.rbegin(); it != needs.rend() && want.empty(); ++it) {
    in.memory_budget_bytes = *it - 1;
    absl::StatusOr<Plan> tight = PlanPipeline(in);
    if (tight.ok() && tight->ranked[0].split_moved) {
      want = PartitionSizes(tight->ranked[0].stage_blocks);
    }
  }
  ASSERT_FALSE(want.empty()) << "no budget makes the planner move blocks for this model";

  for (int i = 1; i <= stages; ++i) {
    baton::v1::RegisterWorkerRequest r;
    r.set_address(Address(i));
    r.mutable_device()->set_kind("cuda");
    r.mutable_device()->set_memory_bytes(in.memory_budget_bytes);
    ASSERT_TRUE(core_->RegisterWorker(r).ok());
  }
  Job job = Submit(spec);
  core_->Tick();
  job = Get(job.id());
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING) << Reason(job);
  EXPECT_EQ(std::vector<int>(job.spec().pipeline().partition().begin(),
                             job.spec().pipeline().partition().end()),
            want);
  std::string planned;
  for (const auto& h : job.history()) {
    if (absl::StartsWith(h.reason(), "auto-planner chose ")) planned = h.reason();
  }
  EXPECT_TRUE(absl::StrContains(planned, " split ")) << planned;
  // Each stage's blocks, as the workers are told them.
  std::map<int, int> blocks_of_stage;
  for (const auto& plan : client_->Plans(job.id())) {
    for (const auto& st : plan.stages()) {
      blocks_of_stage[st.stage()] = st.last_block() - st.first_block();
    }
  }
  ASSERT_EQ(blocks_of_stage.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) EXPECT_EQ(blocks_of_stage[s], want[s]) << s;
}

// SCHEDULE_AUTO: the planner chooses at placement and the history says what and why; the
// choice sticks in the job's spec and the plans carry it. A later job of the same name and
// model calibrates from the earlier one's trace.
TEST_F(CoordinatorTest, AutoScheduleIsChosenAtPlacementFromFlopsThenFromTheLastRunsCosts) {
  const std::string w1 = Register(1), w2 = Register(2);
  baton::v1::JobSpec spec = Spec(2, /*steps=*/3);
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_AUTO);
  spec.mutable_pipeline()->clear_microbatches();
  Job first = Submit(spec);
  ASSERT_EQ(first.state(), baton::v1::JOB_STATE_QUEUED);
  core_->Tick();
  first = Get(first.id());
  ASSERT_EQ(first.state(), baton::v1::JOB_STATE_RUNNING) << Reason(first);
  const baton::v1::PipelineSpec& chosen = first.spec().pipeline();
  EXPECT_NE(chosen.schedule(), baton::v1::SCHEDULE_AUTO);
  EXPECT_GE(chosen.microbatches(), 1);
  EXPECT_EQ(8 % chosen.microbatches(), 0);
  std::string planned;
  for (const auto& h : first.history()) {
    if (absl::StartsWith(h.reason(), "auto-planner chose ")) planned = h.reason();
  }
  EXPECT_TRUE(absl::StrContains(planned, "model FLOPs")) << planned;
  EXPECT_TRUE(absl::StrContains(planned, absl::StrCat(first.pipeline().schedule(), " V=")))
      << planned << " vs " << first.pipeline().schedule();
  for (const auto& plan : client_->Plans(first.id())) {
    EXPECT_EQ(plan.spec().pipeline().schedule(), chosen.schedule());
    EXPECT_EQ(plan.microbatches(), chosen.microbatches());
  }
  // The first job reports a traced step: every action of its clock, 1 ms each.
  for (const auto& plan : client_->Plans(first.id())) {
    baton::v1::ReportProgressRequest p;
    p.set_job_id(first.id());
    p.set_worker_id(first.workers(plan.rank()));
    p.set_rank(plan.rank());
    p.set_step(1);
    if (plan.rank() == 1) p.set_loss(1.0f);
    baton::v1::RankTrace* t = p.mutable_trace();
    int64_t at = 0;
    for (const baton::v1::PlanAction& action : plan.clock()) {
      baton::v1::ActionSpan* a = t->add_actions();
      a->set_action(ActionFromProto(action)->ToString());
      a->set_start_ns(at);
      at += 1'000'000;  // 1 ms each
      a->set_end_ns(at);
    }
    ASSERT_TRUE(core_->ReportProgress(p).ok());
  }
  baton::v1::JobSpec again = spec;
  Job second = Submit(again);
  FinishAllRanks(first);
  core_->Tick();
  second = Get(second.id());
  ASSERT_EQ(second.state(), baton::v1::JOB_STATE_RUNNING) << Reason(second);
  planned.clear();
  for (const auto& h : second.history()) {
    if (absl::StartsWith(h.reason(), "auto-planner chose ")) planned = h.reason();
  }
  EXPECT_TRUE(absl::StrContains(planned, absl::StrCat("costs: job ", first.id(), " step 1")))
      << planned;
  EXPECT_TRUE(absl::StrContains(planned, " ms/step")) << planned;

  // Submitting the same SCHEDULE_AUTO spec again under the same submission id is the same
  // job, although its stored spec now holds the choice.
  const Job keyed = Submit(spec, "auto-key");
  FinishAllRanks(second);
  core_->Tick();
  ASSERT_NE(Get(keyed.id()).spec().pipeline().schedule(), baton::v1::SCHEDULE_AUTO)
      << Reason(Get(keyed.id()));
  EXPECT_EQ(Submit(spec, "auto-key").id(), keyed.id());

  // A spec the planner can find nothing for is refused at submission, naming the field.
  baton::v1::JobSpec bad = spec;
  bad.mutable_pipeline()->set_stages(9);  // 4 blocks
  baton::v1::SubmitJobRequest r;
  *r.mutable_spec() = bad;
  absl::StatusOr<Job> refused = core_->SubmitJob(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "pipeline.stages")) << refused.status();
}

// A gpt spec reading `path` as its text (the data roots decide where that may be).
baton::v1::JobSpec TextSpec(const std::string& path) {
  baton::v1::JobSpec spec;
  baton::v1::GptSpec* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_vocab_size(64);
  gpt->set_context(4);
  gpt->set_d_model(8);
  gpt->set_heads(2);
  gpt->set_layers(1);
  spec.mutable_data()->mutable_text()->set_path(path);
  spec.mutable_data()->set_batch_size(2);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(1);
  return spec;
}

// A data file the coordinator sees is refused at submit when no worker would read it, as
// the workers would refuse it: a FIFO (looked at, never opened: with no writer an open
// would block the submit), a directory, a file over the workers' bound (sparse here). A
// file it cannot see goes to the workers; a regular one within the bound is accepted. The
// files of an init.from_hf directory are held to the same.
TEST(CoordinatorDataRootTest, FilesNoWorkerWouldReadAreRefusedAtSubmit) {
  std::string tmpl = testing::TempDir() + "/data_root.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string root = std::filesystem::canonical(tmpl).string();
  ASSERT_EQ(mkfifo((root + "/fifo").c_str(), 0600), 0);
  std::filesystem::create_directory(root + "/dir");
  std::ofstream(root + "/big.txt") << "x";
  std::filesystem::resize_file(root + "/big.txt", (uint64_t{1} << 20) + 1);
  std::ofstream(root + "/ok.txt") << "a small text corpus, longer than the context";
  CoordinatorOptions o = QuietOptions();
  o.data_roots = {root};
  o.max_data_file_bytes = int64_t{1} << 20;
  auto core = Coordinator::Create(o);
  ASSERT_TRUE(core.ok()) << core.status();
  baton::v1::SubmitJobRequest r;
  const std::pair<std::string, std::string> refusals[] = {
      {"fifo", "is a FIFO"},
      {"dir", "is a directory"},
      {"big.txt", "has 1048577 bytes, over the bound of 1048576"}};
  for (const auto& [file, what] : refusals) {
    *r.mutable_spec() = TextSpec(root + "/" + file);
    absl::StatusOr<Job> refused = (*core)->SubmitJob(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << file;
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("data.text.path: '" + root + "/" + file + "' " + what));
  }
  for (const std::string file : {"ok.txt", "only-on-the-workers.txt"}) {
    *r.mutable_spec() = TextSpec(root + "/" + file);
    EXPECT_TRUE((*core)->SubmitJob(r).ok()) << file;
  }

  std::filesystem::create_directory(root + "/hf");
  ASSERT_EQ(mkfifo((root + "/hf/config.json").c_str(), 0600), 0);
  for (const auto& [dir, what] :
       {std::pair<std::string, std::string>{"hf", "'" + root + "/hf/config.json' is a FIFO"},
        {"fifo", "'" + root + "/fifo' is not a directory"}}) {
    *r.mutable_spec() = TextSpec(root + "/ok.txt");
    r.mutable_spec()->mutable_init()->set_from_hf(dir);
    absl::StatusOr<Job> refused = (*core)->SubmitJob(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << dir;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("init.from_hf: " + what));
  }
  std::filesystem::remove_all(root);
}

// A Hugging Face model the coordinator sees is checked at submit as a worker checks it when
// it loads: the wrong model, another architecture and a truncated file are refused now, not
// when every worker of the job fails on them a second later.
TEST(CoordinatorDataRootTest, AHuggingFaceModelNoWorkerWouldLoadIsRefusedAtSubmit) {
  std::string tmpl = testing::TempDir() + "/data_root.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string root = std::filesystem::canonical(tmpl).string();
  std::ofstream(root + "/ok.txt") << "a small text corpus, longer than the context";
  const baton::v1::JobSpec spec = TextSpec(root + "/ok.txt");
  absl::StatusOr<std::unique_ptr<Sequential>> model = BuildBlocks(spec.model(), /*seed=*/1);
  ASSERT_TRUE(model.ok()) << model.status();
  std::map<std::string, const Tensor*> by_name;
  for (Parameter* p : (*model)->Parameters()) by_name[p->name] = &p->value;
  ASSERT_TRUE(WriteHfModel(spec.model(), by_name, root + "/gpt").ok());
  std::filesystem::create_directory(root + "/qwen");
  std::ofstream(root + "/qwen/config.json")
      << R"({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})";
  std::filesystem::copy(root + "/gpt", root + "/cut");
  std::filesystem::resize_file(root + "/cut/model.safetensors",
                               std::filesystem::file_size(root + "/cut/model.safetensors") - 64);
  CoordinatorOptions o = QuietOptions();
  o.data_roots = {root};
  auto core = Coordinator::Create(o);
  ASSERT_TRUE(core.ok()) << core.status();
  baton::v1::SubmitJobRequest r;
  *r.mutable_spec() = spec;
  r.mutable_spec()->mutable_init()->set_from_hf("gpt");
  EXPECT_TRUE((*core)->SubmitJob(r).ok());
  r.mutable_spec()->mutable_model()->mutable_gpt()->set_vocab_size(65);
  absl::Status s = (*core)->SubmitJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "init.from_hf: model.gpt.vocab_size is 65 but config.json vocab_size is 64");
  *r.mutable_spec() = spec;
  r.mutable_spec()->mutable_init()->set_from_hf("qwen");
  s = (*core)->SubmitJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("init.from_hf: config.json model_type is \"qwen2\""));
  r.mutable_spec()->mutable_init()->set_from_hf("cut");
  s = (*core)->SubmitJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors: safetensors: the file is truncated"));
  std::filesystem::remove_all(root);
}

// An evaluation-only job is one step, the evaluation, writes no checkpoint, and may start
// from any step of a checkpoint (it trains nothing after it).
TEST(CoordinatorDataRootTest, AnEvaluationOnlyJobIsOneStepWithoutCheckpoints) {
  auto core = Coordinator::Create(QuietOptions());
  ASSERT_TRUE(core.ok()) << core.status();
  baton::v1::SubmitJobRequest r;
  *r.mutable_spec() = TextSpec("/nonexistent/corpus.txt");
  baton::v1::JobSpec& spec = *r.mutable_spec();
  spec.mutable_data()->clear_text();
  spec.mutable_data()->mutable_tokens()->add_train("/nonexistent/train.bin");
  spec.mutable_data()->mutable_tokens()->add_val("/nonexistent/val.bin");
  spec.set_steps(500);
  spec.mutable_checkpoint()->set_dir("evals");
  spec.mutable_checkpoint()->set_every_steps(10);
  spec.mutable_eval()->set_only(true);
  absl::StatusOr<Job> job = (*core)->SubmitJob(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().steps(), 1);
  EXPECT_FALSE(job->spec().has_checkpoint());
  EXPECT_TRUE(job->spec().eval().only());
  // Without a validation split there is nothing to evaluate.
  spec.mutable_data()->mutable_tokens()->clear_val();
  absl::Status s = (*core)->SubmitJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("eval.only: evaluation needs a validation split"));
}

// What a client sends comes back in errors bounded and escaped: a megabyte-long path or id,
// control and non-UTF-8 bytes. The message still names the field.
TEST(CoordinatorDataRootTest, ErrorsQuoteClientTextBoundedAndEscaped) {
  CoordinatorOptions o = QuietOptions();
  o.data_roots = {"/nonexistent-data-root"};
  auto core = Coordinator::Create(o);
  ASSERT_TRUE(core.ok()) << core.status();
  auto expect_clean = [](const absl::Status& s, const std::string& field) {
    EXPECT_FALSE(s.ok());
    EXPECT_LT(s.message().size(), 1024u) << s.message().substr(0, 2048);
    EXPECT_TRUE(absl::StartsWith(s.message(), field)) << s.message().substr(0, 2048);
    for (const char c : s.message()) {
      const unsigned char u = static_cast<unsigned char>(c);
      EXPECT_TRUE(u >= 0x20 && u != 0x7f && u < 0x80) << "byte " << int{u} << " in " << s;
    }
  };
  const std::string huge = "/etc/" + std::string(1 << 20, 'p');
  const std::string forged = "/etc/x\ncoordinator: job-000009 SUCCEEDED\x1b[2J\xff\xfe";
  baton::v1::SubmitJobRequest r;
  for (const std::string& path : {huge, forged}) {
    *r.mutable_spec() = TextSpec(path);
    expect_clean((*core)->SubmitJob(r).status(), "data.text.path");
    *r.mutable_spec() = TextSpec("/nonexistent-data-root/ok.txt");
    r.mutable_spec()->mutable_init()->set_from_hf("../" + path);
    expect_clean((*core)->SubmitJob(r).status(), "init.from_hf");
    *r.mutable_spec() = Spec(1);
    r.mutable_spec()->mutable_resume_from()->set_job_id(path);
    expect_clean((*core)->SubmitJob(r).status(), "resume_from.job_id");
  }
  absl::Status s = (*core)->GetJob(huge).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  expect_clean(s, "job ");
  // A short value is still quoted as it is.
  *r.mutable_spec() = TextSpec("/etc/shadow");
  EXPECT_THAT(std::string((*core)->SubmitJob(r).status().message()),
              HasSubstr("data.text.path: '/etc/shadow' is outside"));
}

TEST(CoordinatorOptionsTest, BadDurationsNameTheFlag) {
  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.background = false;
  o.lease_ttl = absl::Milliseconds(500);
  auto c = Coordinator::Create(o);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("--lease_ttl"), std::string::npos);
}

}  // namespace
}  // namespace baton
