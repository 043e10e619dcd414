// WorkerAgent over a fake coordinator: the lease (registration, session, heartbeats, the
// goodbye), and jobs started as the coordinator starts them, their results and aborts
// reaching the coordinator. Workers are in-process (TensorService on loopback).
#include "worker/worker_agent.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/fake_coordinator_client.h"
#include "worker/job_test_util.h"

namespace baton {
namespace {

using testing_util::kRanks;
using testing_util::Node;
using testing_util::Plans;
using testing_util::StartNode;
using testing_util::TinySpec;
using testing_util::Train;

constexpr char kSession[] = "the-session-secret";

// A worker: its receiving end, and its agent talking to its own fake coordinator.
struct Worker {
  std::unique_ptr<Node> node;
  FakeCoordinatorClient* coordinator = nullptr;  // owned by agent
  std::unique_ptr<WorkerAgent> agent;
};

Worker MakeWorker(const std::string& id) {
  Worker w;
  w.node = StartNode();
  WorkerOptions o;
  o.worker_id = id;
  o.advertise_address = w.node->address;
  o.rendezvous = &w.node->box;
  o.device.set_kind("cpu");
  auto fake = std::make_unique<FakeCoordinatorClient>();
  w.coordinator = fake.get();
  w.agent = std::make_unique<WorkerAgent>(o, &w.node->inbox, std::move(fake), kSession);
  return w;
}

TEST(WorkerAgentTest, RegistersWithItsSessionKeepsTheLeaseAndSaysGoodbye) {
  Worker w = MakeWorker("w-7");
  w.agent->Start();
  ASSERT_TRUE(w.coordinator->AwaitHeartbeats(2, absl::Seconds(60)));  // only bounds a hang
  const std::vector<baton::v1::RegisterWorkerRequest> reg = w.coordinator->registrations();
  ASSERT_EQ(reg.size(), 1u);
  EXPECT_EQ(reg[0].worker_id(), "w-7");
  EXPECT_EQ(reg[0].address(), w.node->address);
  EXPECT_EQ(reg[0].session_token(), kSession);
  EXPECT_EQ(reg[0].capabilities_size(), 1);
  EXPECT_EQ(reg[0].capabilities(0), "transport/grpc");
  EXPECT_EQ(w.agent->worker_id(), "w-7");

  EXPECT_TRUE(w.agent->CheckCoordinatorSession(kSession).ok());
  EXPECT_EQ(w.agent->CheckCoordinatorSession("").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(w.agent->CheckCoordinatorSession("another").code(),
            absl::StatusCode::kPermissionDenied);

  w.agent->Stop();
  const std::vector<baton::v1::HeartbeatRequest> hb = w.coordinator->heartbeats();
  ASSERT_FALSE(hb.empty());
  EXPECT_FALSE(hb.front().leaving());
  EXPECT_TRUE(hb.back().leaving());
  EXPECT_EQ(hb.back().worker_id(), "w-7");
  w.agent->Stop();  // idempotent: no second goodbye
  EXPECT_EQ(w.coordinator->heartbeats().size(), hb.size());
}

TEST(WorkerAgentTest, RunsAJobAndReportsItsResult) {
  std::vector<Worker> workers;
  std::vector<std::string> addresses;
  for (int r = 0; r < kRanks; ++r) {
    workers.push_back(MakeWorker(absl::StrCat("w-", r)));
    addresses.push_back(workers.back().node->address);
  }
  const baton::v1::JobSpec spec = TinySpec(3);
  const std::vector<baton::v1::JobPlan> plans = Plans(spec, "job-agent", addresses);
  // The coordinator starts rank 0, the first sender, last.
  for (int r = kRanks - 1; r >= 0; --r) {
    ASSERT_TRUE(workers[r].agent->StartJob(plans[r]).ok());
  }
  const absl::Status busy = workers[0].agent->StartJob(plans[0]);
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(busy.message(), "worker w-0 already runs job job-agent");

  std::map<int, std::string> digests;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(workers[r].coordinator->AwaitResults(1, absl::Seconds(60)));
    const baton::v1::ReportResultRequest result = workers[r].coordinator->results()[0];
    EXPECT_EQ(result.worker_id(), absl::StrCat("w-", r));
    EXPECT_EQ(result.job_id(), "job-agent");
    EXPECT_TRUE(result.error().empty()) << result.error();
    for (const auto& d : result.block_digests()) digests[d.index()] = d.digest().sha256();
    const std::vector<baton::v1::ReportProgressRequest> progress =
        workers[r].coordinator->progress();
    ASSERT_EQ(progress.size(), 3u);
    EXPECT_EQ(progress.back().step(), 3);
    EXPECT_EQ(progress.back().worker_id(), absl::StrCat("w-", r));
  }
  EXPECT_EQ(digests, Train(spec, 3).digests);
  for (Worker& w : workers) w.agent->Stop();
  EXPECT_EQ(workers[0].agent->Status().state(), baton::v1::WORKER_STATE_IDLE);
}

TEST(WorkerAgentTest, AJobTheCoordinatorNoLongerRunsIsAbortedByTheHeartbeat) {
  Worker w = MakeWorker("w-1");
  w.agent->Start();
  ASSERT_TRUE(w.coordinator->AwaitHeartbeats(1, absl::Seconds(60)));
  const std::vector<baton::v1::JobPlan> plans =
      Plans(TinySpec(1000), "job-gone", {"127.0.0.1:1", w.node->address});
  // Rank 1 alone: it waits for rank 0 until the heartbeat says the job is gone.
  ASSERT_TRUE(w.agent->StartJob(plans[1]).ok());
  EXPECT_EQ(w.agent->Status().state(), baton::v1::WORKER_STATE_BUSY);
  EXPECT_EQ(w.agent->Status().job_id(), "job-gone");
  w.coordinator->AbortJobInHeartbeats("job-gone");
  ASSERT_TRUE(w.coordinator->AwaitResults(1, absl::Seconds(60)));
  const baton::v1::ReportResultRequest result = w.coordinator->results()[0];
  EXPECT_EQ(result.error(), "ABORTED: aborted: the coordinator no longer runs this job");
  EXPECT_EQ(result.cause(), baton::v1::FAILURE_CAUSE_ABORTED);
  // Heartbeats named the job while it ran.
  bool named = false;
  for (const baton::v1::HeartbeatRequest& hb : w.coordinator->heartbeats()) {
    named = named || hb.job_id() == "job-gone";
  }
  EXPECT_TRUE(named);
  w.agent->Stop();
}

// WorkerService.AbortJob answers "stopped" only once the job's thread has let go of the
// worker: the coordinator then lists it IDLE and may place the next job on it at once.
TEST(WorkerAgentTest, AbortJobAnswersStoppedOnlyOnceTheJobHasLetGo) {
  Worker w = MakeWorker("w-1");
  const std::vector<baton::v1::JobPlan> plans =
      Plans(TinySpec(1000), "job-cancel", {"127.0.0.1:1", w.node->address});
  // Rank 1 alone: it waits for rank 0 until it is aborted.
  ASSERT_TRUE(w.agent->StartJob(plans[1]).ok());
  // Another job's abort: nothing of it runs here.
  EXPECT_TRUE(w.agent->AbortJob("job-other", "not this one", absl::Minutes(1)));
  EXPECT_EQ(w.agent->Status().state(), baton::v1::WORKER_STATE_BUSY);
  // The bound only guards against a hang: the receive wakes at once.
  EXPECT_TRUE(w.agent->AbortJob("job-cancel", "cancelled by request", absl::Minutes(1)));
  EXPECT_EQ(w.agent->Status().state(), baton::v1::WORKER_STATE_IDLE);
  const std::vector<baton::v1::JobPlan> next =
      Plans(TinySpec(1000), "job-next", {"127.0.0.1:1", w.node->address});
  EXPECT_TRUE(w.agent->StartJob(next[1]).ok());
  w.agent->Stop();
  ASSERT_TRUE(w.coordinator->AwaitResults(2, absl::Seconds(60)));
  EXPECT_EQ(w.coordinator->results()[0].error(), "ABORTED: aborted: cancelled by request");
}

TEST(WorkerAgentTest, StoppingReportsTheJobAsShutDown) {
  Worker w = MakeWorker("w-1");
  const std::vector<baton::v1::JobPlan> plans =
      Plans(TinySpec(1000), "job-stop", {"127.0.0.1:1", w.node->address});
  ASSERT_TRUE(w.agent->StartJob(plans[1]).ok());
  w.agent->Stop();
  const std::vector<baton::v1::ReportResultRequest> results = w.coordinator->results();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].error(), "UNAVAILABLE: aborted: worker w-1 is shutting down");
  EXPECT_EQ(results[0].cause(), baton::v1::FAILURE_CAUSE_SHUTDOWN);
  EXPECT_EQ(w.agent->StartJob(plans[1]).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton
