// The coordinator through its real gRPC services: a server on a free port, stub clients.
#include "coordinator/service.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint/block_stream.h"
#include "common/checkpoint/checkpoint_testing.h"
#include "common/core/check.h"
#include "common/core/digest.h"
#include "common/rpc/rpc.h"
#include "common/core/mutex.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/fake_clock_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

class NullWorkerClient final : public WorkerClient {
 public:
  absl::Status StartJob(const WorkerEndpoint&, const baton::v1::JobPlan&, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<AbortAnswer> AbortJob(const WorkerEndpoint&, const std::string&,
                                       const std::string&, absl::Duration) override {
    return AbortAnswer::kStopped;
  }
};

// The session secret the test's workers register with, and a context carrying it.
constexpr char kTestSession[] = "service-test-session-0123456789";
std::unique_ptr<grpc::ClientContext> WorkerContext(absl::Duration timeout) {
  auto ctx = ContextWithTimeout(timeout);
  ctx->AddMetadata(kSessionMetadata, kTestSession);
  return ctx;
}

baton::v1::JobSpec Spec(int stages) {
  baton::v1::JobSpec spec;
  baton::v1::MlpSpec* mlp = spec.mutable_model()->mutable_mlp();
  mlp->set_input_dim(4);
  mlp->set_width(8);
  mlp->set_depth(3);
  mlp->set_output_dim(2);
  spec.mutable_data()->mutable_synthetic();
  spec.mutable_data()->set_batch_size(4);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(1);
  return spec;
}

// A coordinator served over gRPC on a loopback port, with stubs of both client services:
// what every fixture below starts, from its own options.
class ServedCoordinatorTest : public testing::Test {
 protected:
  void Serve(const CoordinatorOptions& o, WatchLimits limits = WatchLimits(),
             Authenticator* auth = nullptr) {
    auto core = Coordinator::Create(o);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    jobs_service_ = std::make_unique<JobServiceImpl>(core_.get(), limits, auth);
    cluster_service_ = std::make_unique<ClusterServiceImpl>(core_.get());
    ServerOptions so;
    so.services = {jobs_service_.get(), cluster_service_.get()};
    std::string address;
    auto server = StartServer(so, &address);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = MakeChannel(address);
    jobs_ = baton::v1::JobService::NewStub(channel);
    cluster_ = baton::v1::ClusterService::NewStub(channel);
  }

  void TearDown() override {
    if (core_ != nullptr) core_->Stop();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    server_.reset();
    core_.reset();
  }

  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<JobServiceImpl> jobs_service_;
  std::unique_ptr<ClusterServiceImpl> cluster_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<baton::v1::JobService::Stub> jobs_;
  std::unique_ptr<baton::v1::ClusterService::Stub> cluster_;
};

class ServiceTest : public ServedCoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.db_path = ":memory:";
    o.heartbeat_interval = absl::Milliseconds(50);
    // The tests' workers do not heartbeat: a lease no test outlives keeps them alive however
    // slowly the test runs (lease expiry is ClusterTest's, on a fake clock).
    o.lease_ttl = absl::Minutes(10);
    o.worker_client = std::make_shared<NullWorkerClient>();
    Serve(o, WatchLimits{100, 2});
  }

  grpc::Status Submit(const baton::v1::JobSpec& spec, baton::v1::Job* job) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = spec;
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    return jobs_->SubmitJob(ctx.get(), r, job);
  }

  grpc::Status Get(const std::string& id, baton::v1::Job* job) {
    baton::v1::GetJobRequest r;
    r.set_job_id(id);
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    return jobs_->GetJob(ctx.get(), r, job);
  }

  // Polls the job until it is in `state` (a state it stays in until the test moves it on);
  // the job as last read. The bound only catches a hang.
  baton::v1::Job WaitForState(const std::string& id, baton::v1::JobState state) {
    baton::v1::Job job;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Get(id, &job).ok() && job.state() != state && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return job;
  }
};

TEST_F(ServiceTest, SubmitGetAndErrorsOverGrpc) {
  baton::v1::Job job;
  grpc::Status s = Submit(Spec(1), &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.id(), "job-000001");
  EXPECT_EQ(job.spec().pipeline().microbatches(), 1);  // defaulted

  baton::v1::Job got;
  s = Get(job.id(), &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.id(), job.id());

  s = Get("job-999999", &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  baton::v1::JobSpec bad = Spec(1);
  bad.mutable_optimizer()->mutable_sgd()->set_learning_rate(-1);
  s = Submit(bad, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("optimizer.sgd.learning_rate", 0), 0u) << s.error_message();

  // Still serving.
  s = Get(job.id(), &got);
  EXPECT_TRUE(s.ok());
}

TEST_F(ServiceTest, GetJobHistoryOverGrpc) {
  baton::v1::Job job;
  ASSERT_TRUE(Submit(Spec(1), &job).ok());
  baton::v1::GetJobHistoryRequest r;
  r.set_job_id(job.id());
  baton::v1::JobHistory history;
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    grpc::Status s = jobs_->GetJobHistory(ctx.get(), r, &history);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(history.job_id(), job.id());
  EXPECT_EQ(history.next_from_step(), 0);
  r.set_page_size(-1);
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    grpc::Status s = jobs_->GetJobHistory(ctx.get(), r, &history);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message().rfind("page_size", 0), 0u) << s.error_message();
  }
  r.set_page_size(0);
  r.set_job_id("job-999999");
  auto ctx = ContextWithTimeout(absl::Seconds(10));
  EXPECT_EQ(jobs_->GetJobHistory(ctx.get(), r, &history).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServiceTest, ListJobsPagesOverGrpc) {
  for (int i = 0; i < 5; ++i) {
    baton::v1::Job job;
    ASSERT_TRUE(Submit(Spec(1), &job).ok());
  }
  baton::v1::ListJobsRequest r;
  r.set_page_size(2);
  std::vector<std::string> ids;
  for (int page = 0; page < 5; ++page) {
    baton::v1::ListJobsResponse resp;
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    grpc::Status s = jobs_->ListJobs(ctx.get(), r, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    for (const auto& j : resp.jobs()) ids.push_back(j.id());
    if (resp.next_page_token().empty()) break;
    r.set_page_token(resp.next_page_token());
  }
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids.front(), "job-000005");
  EXPECT_EQ(ids.back(), "job-000001");

  r.set_page_token("garbage");
  baton::v1::ListJobsResponse resp;
  auto ctx = ContextWithTimeout(absl::Seconds(10));
  EXPECT_EQ(jobs_->ListJobs(ctx.get(), r, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceTest, WatchJobStreamsUntilTheTerminalState) {
  baton::v1::Job job;
  ASSERT_TRUE(Submit(Spec(1), &job).ok());

  std::vector<baton::v1::JobEvent> events;
  grpc::Status watch_status;
  std::promise<void> subscribed;
  std::thread watcher([&] {
    baton::v1::WatchJobRequest r;
    r.set_job_id(job.id());
    auto ctx = ContextWithTimeout(absl::Seconds(30));
    auto reader = jobs_->WatchJob(ctx.get(), r);
    baton::v1::JobEvent e;
    bool first = true;
    while (reader->Read(&e)) {
      events.push_back(e);
      if (first) subscribed.set_value();
      first = false;
    }
    if (first) subscribed.set_value();
    watch_status = reader->Finish();
  });
  // Only once the watch has its first event (the job is QUEUED: no worker yet) ...
  subscribed.get_future().wait();

  // A worker registers; the job is placed on it and runs.
  baton::v1::RegisterWorkerRequest reg;
  reg.set_address("127.0.0.1:1");
  reg.set_session_token(kTestSession);
  baton::v1::RegisterWorkerResponse reg_resp;
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    ASSERT_TRUE(cluster_->RegisterWorker(ctx.get(), reg, &reg_resp).ok());
  }
  baton::v1::Job got = WaitForState(job.id(), baton::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(got.state(), baton::v1::JOB_STATE_RUNNING);

  baton::v1::ReportProgressRequest p;
  p.set_worker_id(reg_resp.worker_id());
  p.set_job_id(job.id());
  p.set_rank(0);
  p.set_step(1);
  p.set_loss(0.25f);
  {
    baton::v1::ReportProgressResponse resp;
    auto ctx = WorkerContext(absl::Seconds(10));
    ASSERT_TRUE(cluster_->ReportProgress(ctx.get(), p, &resp).ok());
    EXPECT_TRUE(resp.keep_running());
  }
  baton::v1::ReportResultRequest result;
  result.set_worker_id(reg_resp.worker_id());
  result.set_job_id(job.id());
  result.set_rank(0);
  for (int b = 0; b < 4; ++b) {
    auto* d = result.add_block_digests();
    d->set_index(b);
    Sha256 h;
    h.Update(&b, sizeof(b));
    d->mutable_digest()->set_sha256(DigestHex(h.Finish()));
  }
  {
    baton::v1::ReportResultResponse resp;
    auto ctx = WorkerContext(absl::Seconds(10));
    grpc::Status s = cluster_->ReportResult(ctx.get(), result, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.front().state_change().state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(events.back().state_change().state(), baton::v1::JOB_STATE_SUCCEEDED);
  bool saw_step = false;
  for (const auto& e : events) {
    if (e.has_step()) {
      saw_step = true;
      EXPECT_FLOAT_EQ(e.step().loss(), 0.25f);
    }
  }
  EXPECT_TRUE(saw_step);

  ASSERT_TRUE(Get(job.id(), &got).ok());
  EXPECT_EQ(got.state(), baton::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(got.weights_digest().size(), 64u);

  // Watching a finished job sends its final state and ends.
  baton::v1::WatchJobRequest r;
  r.set_job_id(job.id());
  auto ctx = ContextWithTimeout(absl::Seconds(10));
  auto reader = jobs_->WatchJob(ctx.get(), r);
  std::vector<baton::v1::JobEvent> after;
  baton::v1::JobEvent e;
  while (reader->Read(&e)) after.push_back(e);
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].state_change().state(), baton::v1::JOB_STATE_SUCCEEDED);

  // Unknown jobs: NOT_FOUND on the stream.
  r.set_job_id("job-404");
  auto ctx2 = ContextWithTimeout(absl::Seconds(10));
  auto reader2 = jobs_->WatchJob(ctx2.get(), r);
  while (reader2->Read(&e)) {
  }
  EXPECT_EQ(reader2->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  baton::v1::ListWorkersResponse workers;
  auto ctx3 = ContextWithTimeout(absl::Seconds(10));
  ASSERT_TRUE(jobs_->ListWorkers(ctx3.get(), {}, &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).state(), baton::v1::WORKER_STATE_IDLE);
}

// Each watch stream holds a server thread: a client host (no tokens: everyone is
// anonymous) gets at most per_caller of them
// (2 here), the next is refused naming the limit, and a closed one frees its slot.
TEST_F(ServiceTest, WatchStreamsPerClientHostAreCapped) {
  baton::v1::JobSpec spec;
  spec.mutable_model()->mutable_mlp()->set_input_dim(2);
  spec.mutable_model()->mutable_mlp()->set_width(4);
  spec.mutable_model()->mutable_mlp()->set_depth(1);
  spec.mutable_model()->mutable_mlp()->set_output_dim(1);
  spec.mutable_data()->mutable_synthetic();
  spec.mutable_data()->set_batch_size(4);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(1);
  baton::v1::Job job;  // no workers: it stays QUEUED, so its watches stay open
  ASSERT_TRUE(Submit(spec, &job).ok());
  baton::v1::WatchJobRequest r;
  r.set_job_id(job.id());
  auto open = [&](std::unique_ptr<grpc::ClientContext>* ctx) {
    *ctx = ContextWithTimeout(absl::Seconds(10));
    auto reader = jobs_->WatchJob(ctx->get(), r);
    baton::v1::JobEvent first;
    const bool got = reader->Read(&first);  // the current state: the stream is open
    return std::make_pair(std::move(reader), got);
  };
  std::unique_ptr<grpc::ClientContext> c1, c2, c3, c4;
  auto [w1, got1] = open(&c1);
  auto [w2, got2] = open(&c2);
  EXPECT_TRUE(got1 && got2);
  auto [w3, got3] = open(&c3);
  EXPECT_FALSE(got3);
  const grpc::Status refused = w3->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("the limit per caller is 2"), std::string::npos)
      << refused.error_message();
  c1->TryCancel();
  w1->Finish();
  // The server sees the cancellation within its poll interval; then the slot is free.
  // (The bound only catches a hang.)
  bool reopened = false;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (!reopened && absl::Now() < until) {
    auto [w4, got4] = open(&c4);
    reopened = got4;
    if (!reopened) {
      w4->Finish();
      absl::SleepFor(absl::Milliseconds(100));
    } else {
      c4->TryCancel();
      w4->Finish();
    }
  }
  EXPECT_TRUE(reopened);
  c2->TryCancel();
  w2->Finish();
}

TEST_F(ServiceTest, CancelRunningJobOverGrpc) {
  baton::v1::RegisterWorkerRequest reg;
  reg.set_address("127.0.0.1:2");
  baton::v1::RegisterWorkerResponse reg_resp;
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    ASSERT_TRUE(cluster_->RegisterWorker(ctx.get(), reg, &reg_resp).ok());
  }
  baton::v1::Job job;
  ASSERT_TRUE(Submit(Spec(1), &job).ok());
  const baton::v1::Job got = WaitForState(job.id(), baton::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(got.state(), baton::v1::JOB_STATE_RUNNING);
  baton::v1::CancelJobRequest c;
  c.set_job_id(job.id());
  auto ctx = ContextWithTimeout(absl::Seconds(10));
  baton::v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(ctx.get(), c, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), baton::v1::JOB_STATE_CANCELLED);
  baton::v1::ListWorkersResponse workers;
  auto ctx2 = ContextWithTimeout(absl::Seconds(10));
  ASSERT_TRUE(jobs_->ListWorkers(ctx2.get(), {}, &workers).ok());
  EXPECT_EQ(workers.workers(0).state(), baton::v1::WORKER_STATE_IDLE);
}

// A stand-in worker: a real WorkerService server that records what it is asked.
class RecordingWorker final : public baton::v1::WorkerService::Service {
 public:
  grpc::Status StartJob(grpc::ServerContext*, const baton::v1::StartJobRequest* request,
                        baton::v1::StartJobResponse*) override {
    MutexLock lock(mu_);
    started_.push_back(request->plan());
    job_id_ = request->plan().job_id();
    return grpc::Status::OK;
  }
  grpc::Status AbortJob(grpc::ServerContext*, const baton::v1::AbortJobRequest* request,
                        baton::v1::AbortJobResponse* response) override {
    MutexLock lock(mu_);
    aborted_.push_back(request->job_id());
    if (job_id_ == request->job_id()) job_id_.clear();
    response->set_stopped(true);
    return grpc::Status::OK;
  }
  std::vector<baton::v1::JobPlan> started() {
    MutexLock lock(mu_);
    return started_;
  }
  std::vector<std::string> aborted() {
    MutexLock lock(mu_);
    return aborted_;
  }
  std::string job_id() {
    MutexLock lock(mu_);
    return job_id_;
  }

 private:
  Mutex mu_;
  std::vector<baton::v1::JobPlan> started_;
  std::vector<std::string> aborted_;
  std::string job_id_;
};

// Registers a RecordingWorker with the coordinator and heartbeats until stopped.
class WorkerProcess {
 public:
  WorkerProcess(baton::v1::ClusterService::Stub* cluster, absl::Duration interval)
      : cluster_(cluster) {
    ServerOptions so;
    so.services = {&service_};
    auto server = StartServer(so, &address_);
    BATON_CHECK(server.ok());
    server_ = *std::move(server);
    baton::v1::RegisterWorkerRequest reg;
    reg.set_address(address_);
    reg.set_session_token(kTestSession);
    baton::v1::RegisterWorkerResponse resp;
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    BATON_CHECK(cluster_->RegisterWorker(ctx.get(), reg, &resp).ok());
    id_ = resp.worker_id();
    beating_ = std::thread([this, interval] {
      while (!stop_.load()) {
        baton::v1::HeartbeatRequest hb;
        hb.set_worker_id(id_);
        hb.set_job_id(service_.job_id());
        baton::v1::HeartbeatResponse r;
        auto c = WorkerContext(absl::Seconds(1));
        if (cluster_->Heartbeat(c.get(), hb, &r).ok()) ++beats_;
        std::this_thread::sleep_for(absl::ToChronoNanoseconds(interval));
      }
    });
  }
  ~WorkerProcess() {
    Kill();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  // Stops heartbeating, as a killed process would.
  void Kill() {
    stop_ = true;
    if (beating_.joinable()) beating_.join();
  }
  const std::string& id() const { return id_; }
  const std::string& address() const { return address_; }
  RecordingWorker& service() { return service_; }
  // Heartbeats the coordinator answered so far.
  int64_t beats() const { return beats_.load(); }

 private:
  baton::v1::ClusterService::Stub* cluster_;
  RecordingWorker service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::string id_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> beats_{0};
  std::thread beating_;
};

using testing_util::FakeClock;

class ClusterTest : public ServedCoordinatorTest {
 protected:
  static constexpr absl::Duration kLeaseTtl = absl::Milliseconds(500);

  void SetUp() override {
    CoordinatorOptions o;
    o.db_path = ":memory:";
    o.heartbeat_interval = absl::Milliseconds(50);
    o.lease_ttl = kLeaseTtl;
    // Leases run on a clock only the test moves: a live worker's heartbeats, however late
    // load makes them, never let its lease run out.
    o.clock = clock_.fn();
    Serve(o);  // with the real gRPC worker client
  }

  baton::v1::Job WaitFor(const std::string& id, baton::v1::JobState state, absl::Duration limit) {
    baton::v1::Job job;
    const absl::Time deadline = absl::Now() + limit;
    while (absl::Now() < deadline) {
      baton::v1::GetJobRequest r;
      r.set_job_id(id);
      auto ctx = ContextWithTimeout(absl::Seconds(30));
      EXPECT_TRUE(jobs_->GetJob(ctx.get(), r, &job).ok());
      if (job.state() == state) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return job;
  }

  FakeClock clock_;
};

// Waits until `cond` holds; false if it does not within a bound that only catches a hang.
template <typename F>
bool Eventually(F cond) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!cond()) {
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST_F(ClusterTest, KilledWorkerFailsTheJobWithinTheLeaseAndFreesTheOther) {
  WorkerProcess a(cluster_.get(), absl::Milliseconds(50));
  WorkerProcess b(cluster_.get(), absl::Milliseconds(50));
  baton::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = Spec(2);
  baton::v1::Job job;
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    ASSERT_TRUE(jobs_->SubmitJob(ctx.get(), submit, &job).ok());
  }
  job = WaitFor(job.id(), baton::v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(a.service().started().size(), 1u);
  ASSERT_EQ(b.service().started().size(), 1u);
  EXPECT_EQ(a.service().started()[0].rank(), 0);
  EXPECT_EQ(b.service().started()[0].rank(), 1);
  EXPECT_EQ(a.service().started()[0].peers(1).address(), b.address());

  b.Kill();
  // Time passes by 1.5 leases since b's last heartbeat, in half-lease steps, each only once
  // `a` has heartbeaten at the new time (the second beat after a step was sent after it):
  // b's lease runs out and a's never does.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(kLeaseTtl / 2);
    const int64_t seen = a.beats();
    ASSERT_TRUE(Eventually([&] { return a.beats() >= seen + 2; }));
  }
  // The job fails without the clock moving again: within 1.5 leases of the kill.
  job = WaitFor(job.id(), baton::v1::JOB_STATE_FAILED, absl::Seconds(60));
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_FAILED);
  const std::string reason = job.history().rbegin()->reason();
  EXPECT_NE(reason.find(absl::StrCat("worker ", b.id(), " (", b.address(), ") lease expired")),
            std::string::npos)
      << reason;
  // The survivor was told to abort, and is idle again.
  ASSERT_TRUE(Eventually([&] { return !a.service().aborted().empty(); }));
  ASSERT_EQ(a.service().aborted().size(), 1u);
  EXPECT_EQ(a.service().aborted()[0], job.id());
  baton::v1::ListWorkersResponse workers;
  ASSERT_TRUE(Eventually([&] {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    return jobs_->ListWorkers(ctx.get(), {}, &workers).ok() && workers.workers_size() > 0 &&
           workers.workers(0).state() == baton::v1::WORKER_STATE_IDLE;
  }));
  ASSERT_EQ(workers.workers_size(), 2);
  EXPECT_EQ(workers.workers(0).worker_id(), a.id());
  EXPECT_EQ(workers.workers(0).state(), baton::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(workers.workers(1).state(), baton::v1::WORKER_STATE_DEAD);

  // The next job needing one worker runs on the survivor.
  *submit.mutable_spec() = Spec(1);
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    ASSERT_TRUE(jobs_->SubmitJob(ctx.get(), submit, &job).ok());
  }
  job = WaitFor(job.id(), baton::v1::JOB_STATE_RUNNING, absl::Seconds(60));
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.workers(0), a.id());

  // Cancelling it reaches the worker before CancelJob returns.
  baton::v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  auto ctx = ContextWithTimeout(absl::Seconds(10));
  ASSERT_TRUE(jobs_->CancelJob(ctx.get(), cancel, &job).ok());
  EXPECT_EQ(a.service().aborted().back(), job.id());
}


// The services with tokens (auth.h) and a join token, over gRPC.
class SecureServiceTest : public ServedCoordinatorTest {
 protected:
  static constexpr char kViewer[] = "viewer-token-0123456789abcdef";
  static constexpr char kAlice[] = "alice-token-0123456789abcdef";
  static constexpr char kBob[] = "bob-token-0123456789abcdef00";
  static constexpr char kAdmin[] = "admin-token-0123456789abcdef";
  static constexpr char kJoin[] = "join-token-0123456789abcdef";

  void SetUp() override {
    const std::string tokens =
        (std::filesystem::temp_directory_path() / absl::StrCat("secure-svc-", getpid()))
            .string();
    std::ofstream(tokens, std::ios::trunc)
        << kViewer << " vera viewer\n" << kAlice << " alice submitter\n" << kBob
        << " bob submitter\n" << kAdmin << " root admin\n";
    auto auth = Authenticator::FromFile(tokens);
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<CoordinatorMetrics>(*registry_);
    CoordinatorOptions o;
    o.db_path = ":memory:";
    o.worker_client = std::make_shared<NullWorkerClient>();
    o.join_token = kJoin;
    o.metrics = metrics_.get();
    o.lease_ttl = absl::Minutes(10);  // the tests' workers do not heartbeat
    Serve(o, WatchLimits{100, 2}, auth_.get());
  }

  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return ctx;
  }

  grpc::Status Submit(const std::string& token, baton::v1::Job* job) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = Spec(1);
    return jobs_->SubmitJob(As(token).get(), r, job);
  }

  grpc::Status Cancel(const std::string& token, const std::string& id) {
    baton::v1::CancelJobRequest r;
    r.set_job_id(id);
    baton::v1::Job out;
    return jobs_->CancelJob(As(token).get(), r, &out);
  }

  double Refusals(const std::string& service, const std::string& code) {
    for (const auto& family : registry_->Collect()) {
      if (family.name != "baton_coordinator_auth_refusals_total") continue;
      for (const auto& m : family.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& l : m.label) labels[l.name] = l.value;
        if (labels["service"] == service && labels["code"] == code) return m.counter.value;
      }
    }
    return -1;
  }

  std::unique_ptr<Authenticator> auth_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
};

TEST_F(SecureServiceTest, TokensDecideWhoMaySubmitReadAndCancel) {
  baton::v1::Job job;
  // No token, or an unknown one: UNAUTHENTICATED, for reads too.
  EXPECT_EQ(Submit("", &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit("forged-token-0123456789abcdef", &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  baton::v1::ListJobsResponse list;
  EXPECT_EQ(jobs_->ListJobs(As("").get(), {}, &list).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A viewer reads but does not submit.
  EXPECT_TRUE(jobs_->ListJobs(As(kViewer).get(), {}, &list).ok());
  grpc::Status denied = Submit(kViewer, &job);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("vera (viewer) may not submit jobs"));
  // alice submits; the job records her.
  ASSERT_TRUE(Submit(kAlice, &job).ok());
  EXPECT_EQ(job.submitted_by(), "alice");
  baton::v1::Job second;
  ASSERT_TRUE(Submit(kAlice, &second).ok());
  // bob, another submitter, may not cancel it; a viewer neither; alice and an admin may.
  grpc::Status bob = Cancel(kBob, job.id());
  EXPECT_EQ(bob.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(bob.error_message(), HasSubstr("submitted by alice"));
  EXPECT_EQ(Cancel(kViewer, job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Cancel(kAlice, job.id()).ok());
  EXPECT_TRUE(Cancel(kAdmin, second.id()).ok());
  baton::v1::Job got;
  baton::v1::GetJobRequest g;
  g.set_job_id(second.id());
  ASSERT_TRUE(jobs_->GetJob(As(kViewer).get(), g, &got).ok());
  EXPECT_EQ(got.state(), baton::v1::JOB_STATE_CANCELLED);
  // Every refusal counted by code; none of the successes.
  EXPECT_EQ(Refusals("jobs", "unauthenticated"), 3);
  EXPECT_EQ(Refusals("jobs", "permission_denied"), 3);
}

// Only admins change a queued job's priority, even the submitter's own job's.
TEST_F(SecureServiceTest, OnlyAnAdminChangesAQueuedJobsPriority) {
  baton::v1::Job job;  // no workers: it stays QUEUED
  ASSERT_TRUE(Submit(kAlice, &job).ok());
  baton::v1::SetJobPriorityRequest r;
  r.set_job_id(job.id());
  r.set_priority(9);
  baton::v1::Job got;
  grpc::Status alice = jobs_->SetJobPriority(As(kAlice).get(), r, &got);
  EXPECT_EQ(alice.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(alice.error_message(), HasSubstr("may not change a job's priority"));
  ASSERT_TRUE(jobs_->SetJobPriority(As(kAdmin).get(), r, &got).ok());
  EXPECT_EQ(got.spec().priority(), 9);
}

// Watch streams are capped per caller (2 here): a viewer at its cap does not lock out a
// submitter on the same host.
TEST_F(SecureServiceTest, WatchStreamsAreCappedPerCallerNotPerHost) {
  baton::v1::Job job;  // no workers: it stays QUEUED, so its watches stay open
  ASSERT_TRUE(Submit(kAlice, &job).ok());
  baton::v1::WatchJobRequest r;
  r.set_job_id(job.id());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<baton::v1::JobEvent>>> readers;
  auto open = [&](const std::string& token) {
    contexts.push_back(As(token));
    readers.push_back(jobs_->WatchJob(contexts.back().get(), r));
    baton::v1::JobEvent first;
    return readers.back()->Read(&first);  // the current state: the stream is open
  };
  EXPECT_TRUE(open(kViewer));
  EXPECT_TRUE(open(kViewer));
  EXPECT_FALSE(open(kViewer));
  const grpc::Status refused = readers.back()->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("too many watch streams for caller vera"));
  EXPECT_TRUE(open(kAlice));  // same host, another caller
  for (size_t i = 0; i < readers.size(); ++i) {
    contexts[i]->TryCancel();
    if (i != 2) readers[i]->Finish();
  }
}

// A job's weights are its submitter's: exporting them needs the submitter or an admin.
TEST_F(SecureServiceTest, OnlyTheSubmitterOrAnAdminExportsAJob) {
  baton::v1::Job job;
  ASSERT_TRUE(Submit(kAlice, &job).ok());
  auto exported = [&](const std::string& token) {
    baton::v1::ExportJobRequest r;
    r.set_job_id(job.id());
    auto ctx = As(token);
    auto reader = jobs_->ExportJob(ctx.get(), r);
    baton::v1::ExportChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  const grpc::Status bobs = exported(kBob);
  EXPECT_EQ(bobs.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(bobs.error_message(), HasSubstr("export " + job.id() + ", submitted by alice"));
  EXPECT_EQ(exported(kViewer).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(exported("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Alice and an admin pass; the job has no checkpoints to export.
  for (const char* token : {kAlice, kAdmin}) {
    const grpc::Status s = exported(token);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("has no checkpoints"));
  }
}

TEST_F(SecureServiceTest, AViewerReadsJobHistoriesAndNoTokenDoesNot) {
  baton::v1::Job job;
  ASSERT_TRUE(Submit(kAlice, &job).ok());
  baton::v1::GetJobHistoryRequest r;
  r.set_job_id(job.id());
  baton::v1::JobHistory history;
  grpc::Status s = jobs_->GetJobHistory(As(kViewer).get(), r, &history);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(history.job_id(), job.id());
  EXPECT_EQ(history.steps_size(), 0);  // queued: no steps yet
  EXPECT_EQ(jobs_->GetJobHistory(As("").get(), r, &history).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Refusals("jobs", "unauthenticated"), 1);
}

TEST_F(SecureServiceTest, WorkersNeedTheJoinTokenAndTheirSessionForEveryCall) {
  baton::v1::RegisterWorkerRequest reg;
  reg.set_address("127.0.0.1:7");
  reg.set_worker_id("w-real");
  reg.set_session_token(kTestSession);
  baton::v1::RegisterWorkerResponse resp;
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    EXPECT_EQ(cluster_->RegisterWorker(ctx.get(), reg, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    ctx->AddMetadata(kJoinTokenMetadata, "wrong-join-token-0123456789");
    EXPECT_EQ(cluster_->RegisterWorker(ctx.get(), reg, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    auto ctx = ContextWithTimeout(absl::Seconds(10));
    ctx->AddMetadata(kJoinTokenMetadata, kJoin);
    ASSERT_TRUE(cluster_->RegisterWorker(ctx.get(), reg, &resp).ok());
  }
  // The job runs on it.
  baton::v1::Job job;
  ASSERT_TRUE(Submit(kAlice, &job).ok());
  baton::v1::GetJobRequest g;
  g.set_job_id(job.id());
  const absl::Time until = absl::Now() + absl::Seconds(60);  // only bounds a hang
  while (job.state() != baton::v1::JOB_STATE_RUNNING && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(jobs_->GetJob(As(kViewer).get(), g, &job).ok());
  }
  ASSERT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  // A stranger naming the worker, without or with a made-up session: refused, and the job
  // neither advances nor ends.
  baton::v1::ReportProgressRequest p;
  p.set_worker_id("w-real");
  p.set_job_id(job.id());
  p.set_rank(0);
  p.set_step(999999);
  baton::v1::ReportResultRequest result;
  result.set_worker_id("w-real");
  result.set_job_id(job.id());
  result.set_rank(0);
  for (const std::string session : {"", "made-up-session-0123456789"}) {
    auto c1 = ContextWithTimeout(absl::Seconds(10));
    auto c2 = ContextWithTimeout(absl::Seconds(10));
    auto c3 = ContextWithTimeout(absl::Seconds(10));
    if (!session.empty()) {
      for (auto* c : {c1.get(), c2.get(), c3.get()}) c->AddMetadata(kSessionMetadata, session);
    }
    const grpc::StatusCode want = session.empty() ? grpc::StatusCode::UNAUTHENTICATED
                                                  : grpc::StatusCode::PERMISSION_DENIED;
    baton::v1::ReportProgressResponse pr;
    EXPECT_EQ(cluster_->ReportProgress(c1.get(), p, &pr).error_code(), want);
    baton::v1::ReportResultResponse rr;
    EXPECT_EQ(cluster_->ReportResult(c2.get(), result, &rr).error_code(), want);
    baton::v1::HeartbeatRequest hb;
    hb.set_worker_id("w-real");
    baton::v1::HeartbeatResponse hr;
    EXPECT_EQ(cluster_->Heartbeat(c3.get(), hb, &hr).error_code(), want);
  }
  ASSERT_TRUE(jobs_->GetJob(As(kViewer).get(), g, &job).ok());
  EXPECT_EQ(job.state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.steps_done(), 0);
  // The worker itself, with its session, reports.
  p.set_step(1);
  baton::v1::ReportProgressResponse pr;
  ASSERT_TRUE(cluster_->ReportProgress(WorkerContext(absl::Seconds(10)).get(), p, &pr).ok());
  ASSERT_TRUE(jobs_->GetJob(As(kViewer).get(), g, &job).ok());
  EXPECT_EQ(job.steps_done(), 1);
  EXPECT_EQ(Refusals("cluster", "unauthenticated"), 4);
  EXPECT_EQ(Refusals("cluster", "permission_denied"), 4);
}


// ---- ExportJob: streamed in pieces, capped, every place given back ----

// A spec whose checkpoints go under `dir`.
baton::v1::JobSpec CheckpointedSpec(const std::string& dir) {
  baton::v1::JobSpec spec = Spec(1);
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every_steps(1);
  return spec;
}

// Writes step 2 of `job`'s checkpoints: an embedding of `rows` x 1024 float32 (4 KiB a row)
// and a head, with AdamW state; returns the step directory.
std::string WriteJobCheckpoint(const baton::v1::Job& job, int64_t rows) {
  absl::StatusOr<std::string> step_dir = testing_checkpoint::WriteCheckpoint(
      job.checkpoints().job_dir(), job.id(), 2,
      {{"embed", {{"embed.weight", {rows, 1024}}}, 0}, {"head", {{"head.weight", {1000}}}, 1}});
  EXPECT_TRUE(step_dir.ok()) << step_dir.status();
  return step_dir.ok() ? *step_dir : "";
}

// A directory for a test's checkpoints, removed with it.
class TempDir {
 public:
  TempDir()
      : path_((std::filesystem::path(::testing::TempDir()) /
               absl::StrCat("export-",
                            ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                            getpid()))
                  .string()) {
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Every chunk of an export over gRPC: the file, the first chunk's fields, and the status.
struct Received {
  std::string bytes;
  baton::v1::ExportChunk first;
  size_t chunks = 0;
  size_t largest = 0;
  grpc::Status status;
};
Received ReceiveExport(baton::v1::JobService::Stub& jobs, grpc::ClientContext* ctx,
                       const std::string& job_id) {
  baton::v1::ExportJobRequest r;
  r.set_job_id(job_id);
  auto reader = jobs.ExportJob(ctx, r);
  Received got;
  baton::v1::ExportChunk chunk;
  while (reader->Read(&chunk)) {
    if (got.chunks++ == 0) got.first = chunk;
    got.largest = std::max(got.largest, chunk.data().size());
    got.bytes += chunk.data();
  }
  got.status = reader->Finish();
  return got;
}

TEST_F(ServiceTest, ExportJobStreamsTheExportInPiecesOfAtMostOneMiB) {
  TempDir dir;
  baton::v1::Job job;
  ASSERT_TRUE(Submit(CheckpointedSpec(dir.path()), &job).ok());
  const std::string step_dir = WriteJobCheckpoint(job, 700);  // 2.7 MiB of weights
  auto ctx = ContextWithTimeout(absl::Seconds(30));
  const Received got = ReceiveExport(*jobs_, ctx.get(), job.id());
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.first.step(), 2);
  EXPECT_EQ(got.first.checkpoint_dir(), step_dir);
  EXPECT_EQ(got.first.total_bytes(), static_cast<int64_t>(got.bytes.size()));
  EXPECT_GE(got.chunks, 3u);
  EXPECT_LE(got.largest, kBlockStreamChunkBytes);
  absl::StatusOr<std::string> whole = ExportWeights(step_dir);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(got.bytes == *whole) << "the streamed export differs from ExportWeights";
  EXPECT_EQ(core_->ExportsInFlight(), 0);
}

// Each export holds its place until it ends, however it ends: streamed to the end, refused
// for its checkpoint, failed on a file changed since it was checked, or cancelled.
TEST_F(ServiceTest, AnExportGivesItsPlaceBackHoweverItEnds) {
  TempDir dir;
  baton::v1::Job job;
  ASSERT_TRUE(Submit(CheckpointedSpec(dir.path()), &job).ok());
  const std::string step_dir = WriteJobCheckpoint(job, 2048);  // 8 MiB of weights
  baton::v1::ExportJobRequest r;
  r.set_job_id(job.id());
  r.set_step(7);  // not a checkpoint
  {
    auto ctx = ContextWithTimeout(absl::Seconds(30));
    auto reader = jobs_->ExportJob(ctx.get(), r);
    baton::v1::ExportChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(core_->ExportsInFlight(), 0);
  }
  // A file changed after the check: the stream ends with DATA_LOSS naming it.
  r.set_step(0);
  absl::StatusOr<std::unique_ptr<Coordinator::Export>> held = core_->ExportJob(r);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(core_->ExportsInFlight(), 1);
  const std::string head = step_dir + "/head.safetensors";
  testing_checkpoint::FlipByte(head, std::filesystem::file_size(head) / 2);
  std::string piece;
  absl::Status s;
  do {
    s = (*held)->weights->Next(&piece);
  } while (s.ok() && !piece.empty());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(head + " has SHA-256"));
  held->reset();
  EXPECT_EQ(core_->ExportsInFlight(), 0);
  testing_checkpoint::FlipByte(head, std::filesystem::file_size(head) / 2);  // back
  // Cancelled by the client after its first piece: the handler's write fails and it returns.
  auto ctx = ContextWithTimeout(absl::Seconds(30));
  auto reader = jobs_->ExportJob(ctx.get(), r);
  baton::v1::ExportChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  ctx->TryCancel();
  reader->Finish();
  // The handler returns on its own time; the deadline only bounds a hang.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (core_->ExportsInFlight() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(core_->ExportsInFlight(), 0);
}

TEST(ExportOptions, CapsBelowOneAreRefusedNamingTheFlags) {
  CoordinatorOptions o;
  o.db_path = ":memory:";
  o.worker_client = std::make_shared<NullWorkerClient>();
  o.max_exports_per_caller = 0;
  const absl::Status s = Coordinator::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--max_exports_per_caller"));
}

// Exports are capped per caller (its token's name) and in all (4 and 2 by default); a call
// past a cap is refused at once, naming it, and one more fits once a place is given back.
TEST_F(SecureServiceTest, ExportsAreCappedPerCallerAndInAll) {
  TempDir dir;
  // Each user's checkpoints in a directory of their own (another user's is refused).
  auto submit = [&](const std::string& token, const std::string& sub, baton::v1::Job* job) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = CheckpointedSpec(dir.path() + "/" + sub);
    return jobs_->SubmitJob(As(token).get(), r, job);
  };
  baton::v1::Job alices, bobs;
  ASSERT_TRUE(submit(kAlice, "alice", &alices).ok());
  ASSERT_TRUE(submit(kBob, "bob", &bobs).ok());
  WriteJobCheckpoint(alices, 16);
  const std::string bobs_step = WriteJobCheckpoint(bobs, 16);
  // Exports under way, held here through the core as the service names their callers.
  baton::v1::ExportJobRequest of_alices;
  of_alices.set_job_id(alices.id());
  std::vector<std::unique_ptr<Coordinator::Export>> held;
  auto hold = [&](const std::string& caller) {
    absl::StatusOr<std::unique_ptr<Coordinator::Export>> e = core_->ExportJob(of_alices, caller);
    ASSERT_TRUE(e.ok()) << e.status();
    held.push_back(*std::move(e));
  };
  hold("caller alice");
  hold("caller alice");
  Received alice = ReceiveExport(*jobs_, As(kAlice).get(), alices.id());
  EXPECT_EQ(alice.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(alice.status.error_message(),
              HasSubstr("too many exports for caller alice (2 at once; the limit per caller "
                        "is 2): retry later"));
  EXPECT_EQ(alice.chunks, 0u);
  hold("caller root");
  hold("caller root");
  Received bob = ReceiveExport(*jobs_, As(kBob).get(), bobs.id());
  EXPECT_EQ(bob.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(bob.status.error_message(),
              HasSubstr("too many exports at once (4; the limit is 4): retry later"));
  EXPECT_EQ(core_->ExportsInFlight(), 4);
  held.pop_back();
  bob = ReceiveExport(*jobs_, As(kBob).get(), bobs.id());
  ASSERT_TRUE(bob.status.ok()) << bob.status.error_message();
  EXPECT_TRUE(bob.bytes == *ExportWeights(bobs_step));
  EXPECT_EQ(core_->ExportsInFlight(), 3);
}

}  // namespace
}  // namespace baton
