#include "coordinator/effects_runner.h"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "common/core/mutex.h"

namespace baton {
namespace {

// Answers every call with what the test set for the address; records the calls in order.
class ScriptedClient final : public WorkerClient {
 public:
  absl::Status StartJob(const WorkerEndpoint& worker, const baton::v1::JobPlan& plan,
                        absl::Duration) override {
    MutexLock lock(mu_);
    calls_.push_back("start " + worker.address + " rank " + std::to_string(plan.rank()));
    if (busy_[worker.address] > 0) {
      --busy_[worker.address];
      return absl::FailedPreconditionError("still busy");
    }
    auto it = start_.find(worker.address);
    return it == start_.end() ? absl::OkStatus() : it->second;
  }
  absl::StatusOr<AbortAnswer> AbortJob(const WorkerEndpoint& worker, const std::string& job_id,
                                       const std::string& reason, absl::Duration) override {
    MutexLock lock(mu_);
    calls_.push_back("abort " + worker.address + " " + job_id + ": " + reason);
    auto it = abort_.find(worker.address);
    return it == abort_.end() ? absl::StatusOr<AbortAnswer>(AbortAnswer::kStopped) : it->second;
  }
  void SetStart(const std::string& address, absl::Status s) {
    MutexLock lock(mu_);
    start_[address] = std::move(s);
  }
  void SetAbort(const std::string& address, absl::StatusOr<AbortAnswer> s) {
    MutexLock lock(mu_);
    abort_[address] = std::move(s);
  }
  void BusyFor(const std::string& address, int n) {
    MutexLock lock(mu_);
    busy_[address] = n;
  }
  std::vector<std::string> Calls() {
    MutexLock lock(mu_);
    return calls_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> calls_;
  std::map<std::string, absl::Status> start_;
  std::map<std::string, absl::StatusOr<AbortAnswer>> abort_;
  std::map<std::string, int> busy_;
};

PlacedWorker Worker(const std::string& address) {
  PlacedWorker w;
  w.worker_id = "w-" + address;
  w.address = address;
  return w;
}

StartCall Start(const std::vector<std::string>& addresses) {
  StartCall s;
  s.job_id = "job-000001";
  for (size_t r = 0; r < addresses.size(); ++r) {
    s.workers.push_back(Worker(addresses[r]));
    baton::v1::JobPlan plan;
    plan.set_job_id(s.job_id);
    plan.set_rank(static_cast<int>(r));
    s.plans.push_back(plan);
  }
  return s;
}

class EffectsRunnerTest : public ::testing::Test {
 protected:
  EffectsRunner::Options Options(bool background = false) {
    EffectsRunner::Options o;
    o.client = client_;
    o.busy_retry = absl::Seconds(1);
    o.clock = [this] {
      MutexLock lock(mu_);
      return now_;
    };
    o.sleep = [this](absl::Duration d) {
      MutexLock lock(mu_);
      now_ += d;
      slept_ += d;
    };
    o.background = background;
    return o;
  }
  EffectsRunner::Callbacks Callbacks() {
    EffectsRunner::Callbacks c;
    c.aborted = [this](const AbortCall& call, std::vector<PlacedWorker> stopped) {
      MutexLock lock(mu_);
      std::string s = "aborted " + call.job_id + ":";
      for (const PlacedWorker& w : stopped) s += " " + w.address;
      events_.push_back(s);
    };
    c.started = [this](const StartCall& call, const std::vector<absl::Status>& results) {
      MutexLock lock(mu_);
      results_[call.job_id] = results;
      events_.push_back("started " + call.job_id);
    };
    c.still_placing = [this](const std::string&) {
      MutexLock lock(mu_);
      return placing_;
    };
    c.log = [this](const std::string& m) {
      MutexLock lock(mu_);
      logged_.push_back(m);
    };
    return c;
  }

  std::shared_ptr<ScriptedClient> client_ = std::make_shared<ScriptedClient>();
  Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  absl::Duration slept_;
  bool placing_ = true;
  std::vector<std::string> events_;
  std::vector<std::string> logged_;
  std::map<std::string, std::vector<absl::Status>> results_;
};

TEST_F(EffectsRunnerTest, AbortsFirstThenTheOtherRanksThenRankZero) {
  EffectsRunner runner(Options(), Callbacks());
  Effects e;
  e.starts.push_back(Start({"a", "b", "c"}));
  AbortCall abort;
  abort.job_id = "job-000000";
  abort.reason = "cancelled";
  abort.workers = {Worker("x")};
  e.aborts.push_back(abort);
  runner.Run(std::move(e), /*wait=*/false);  // no background: on this thread
  EXPECT_EQ(client_->Calls(),
            (std::vector<std::string>{"abort x job-000000: cancelled", "start b rank 1",
                                      "start c rank 2", "start a rank 0"}));
  EXPECT_EQ(events_, (std::vector<std::string>{"aborted job-000000: x", "started job-000001"}));
  ASSERT_EQ(results_["job-000001"].size(), 3u);
  for (const absl::Status& s : results_["job-000001"]) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(EffectsRunnerTest, RankZeroIsNotStartedWhenAnotherRankFailed) {
  client_->SetStart("b", absl::UnavailableError("connection refused"));
  EffectsRunner runner(Options(), Callbacks());
  Effects e;
  e.starts.push_back(Start({"a", "b", "c"}));
  runner.RunNow(std::move(e));
  EXPECT_EQ(client_->Calls(), (std::vector<std::string>{"start b rank 1", "start c rank 2"}));
  const std::vector<absl::Status>& r = results_["job-000001"];
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(r[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(r[2].ok());
}

TEST_F(EffectsRunnerTest, ABusyWorkerIsRetriedWithBackoffUntilBusyRetryRunsOut) {
  client_->BusyFor("a", 3);
  {
    EffectsRunner runner(Options(), Callbacks());
    Effects e;
    e.starts.push_back(Start({"a"}));
    runner.RunNow(std::move(e));
    EXPECT_TRUE(results_["job-000001"][0].ok());
    EXPECT_EQ(slept_, absl::Milliseconds(20 + 40 + 80));
  }
  // Busy for longer than busy_retry (1s): the refusal stands.
  client_->BusyFor("a", 1000);
  slept_ = absl::ZeroDuration();
  EffectsRunner runner(Options(), Callbacks());
  Effects e;
  e.starts.push_back(Start({"a"}));
  runner.RunNow(std::move(e));
  EXPECT_EQ(results_["job-000001"][0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LE(slept_, absl::Seconds(1));
  EXPECT_GT(slept_, absl::Milliseconds(500));
}

TEST_F(EffectsRunnerTest, NoRetryOnceTheJobIsNoLongerPlacing) {
  client_->BusyFor("a", 3);
  placing_ = false;
  EffectsRunner runner(Options(), Callbacks());
  Effects e;
  e.starts.push_back(Start({"a"}));
  runner.RunNow(std::move(e));
  EXPECT_EQ(results_["job-000001"][0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->Calls().size(), 1u);
  EXPECT_EQ(slept_, absl::ZeroDuration());
}

// A worker is free once it says the job no longer runs there; one still stopping (its
// evaluation, say, has not reached a micro-batch boundary yet), one that failed the call and
// one unreachable stay busy (a heartbeat reporting no job frees them later).
TEST_F(EffectsRunnerTest, OnlyStoppedWorkersAreReportedAndOnlyWhenAsked) {
  client_->SetAbort("b", absl::UnavailableError("connection refused"));
  client_->SetAbort("c", absl::DeadlineExceededError("slow"));
  client_->SetAbort("d", absl::NotFoundError("no such job"));
  client_->SetAbort("e", AbortAnswer::kStopping);
  EffectsRunner runner(Options(), Callbacks());
  Effects e;
  AbortCall a;
  a.job_id = "job-000001";
  a.workers = {Worker("a"), Worker("b"), Worker("c"), Worker("d"), Worker("e")};
  e.aborts.push_back(a);
  AbortCall quiet = a;
  quiet.job_id = "job-000002";
  quiet.free_after = false;
  e.aborts.push_back(quiet);
  runner.RunNow(std::move(e));
  EXPECT_EQ(events_, (std::vector<std::string>{"aborted job-000001: a"}));
  EXPECT_EQ(client_->Calls().size(), 10u);
  EXPECT_EQ(logged_.size(), 8u);  // b, c and d failed and e still stops, for each call
}

TEST_F(EffectsRunnerTest, BackgroundRunsAreJoinedByClose) {
  EffectsRunner runner(Options(/*background=*/true), Callbacks());
  for (int i = 0; i < 4; ++i) {
    Effects e;
    e.starts.push_back(Start({"a", "b", "c"}));
    runner.Run(std::move(e), /*wait=*/false);
  }
  runner.Reap();
  runner.Close();
  {
    MutexLock lock(mu_);
    EXPECT_EQ(events_.size(), 4u);
  }
  // After Close, runs happen on the caller's thread.
  Effects e;
  e.starts.push_back(Start({"a"}));
  runner.Run(std::move(e), /*wait=*/false);
  MutexLock lock(mu_);
  EXPECT_EQ(events_.size(), 5u);
}

}  // namespace
}  // namespace baton
