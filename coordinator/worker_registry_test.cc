#include "coordinator/worker_registry.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

using baton::v1::RegisterWorkerRequest;

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1700000000);
  ClockFn fn() {
    return [this] { return now; };
  }
};

RegisterWorkerRequest Req(const std::string& address, const std::string& id = "") {
  RegisterWorkerRequest r;
  r.set_address(address);
  r.set_worker_id(id);
  return r;
}

TEST(WorkerRegistryTest, AssignsIdsAndHandsOutIdleWorkersInOrder) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  auto a = reg.Register(Req("127.0.0.1:5001"));
  auto b = reg.Register(Req("127.0.0.1:5002"));
  auto c = reg.Register(Req("127.0.0.1:5003", "gpu-box"));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->worker.worker_id(), "w-1");
  EXPECT_EQ(b->worker.worker_id(), "w-2");
  EXPECT_EQ(c->worker.worker_id(), "gpu-box");
  auto idle = reg.IdleWorkers();
  ASSERT_EQ(idle.size(), 3u);
  EXPECT_EQ(idle[0].worker_id(), "w-1");
  EXPECT_EQ(idle[2].worker_id(), "gpu-box");

  ASSERT_TRUE(reg.MarkBusy("w-1", "job-1").ok());
  EXPECT_FALSE(reg.MarkBusy("w-1", "job-2").ok());
  idle = reg.IdleWorkers();
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_EQ(idle[0].worker_id(), "w-2");
  EXPECT_FALSE(reg.MarkIdle("w-1", "job-other"));  // a stale release changes nothing
  EXPECT_TRUE(reg.MarkIdle("w-1", "job-1"));
  EXPECT_EQ(reg.IdleWorkers().size(), 3u);
}

// A heartbeat settles itself (no coordinator lock needed) only when the worker reports what
// the registry knows: nothing while idle, the job it was given while busy and wanted.
TEST(WorkerRegistryTest, AHeartbeatSettlesOnlyWhatTheRegistryAlreadyKnows) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  ASSERT_TRUE(reg.Register(Req("127.0.0.1:5001")).ok());
  const absl::Time registered = clock.now;
  clock.now += absl::Seconds(1);
  WorkerRegistry::Beat b = reg.HeartbeatAndCheck("w-1", "");
  EXPECT_TRUE(b.known);
  EXPECT_TRUE(b.settled);
  EXPECT_EQ(b.previous, registered);
  b = reg.HeartbeatAndCheck("w-1", "job-9");  // idle, yet it says it runs a job
  EXPECT_TRUE(b.known);
  EXPECT_FALSE(b.settled);
  EXPECT_TRUE(reg.IdleWorkers().empty()) << "not handed out while it reports a job";
  EXPECT_TRUE(reg.HeartbeatAndCheck("w-1", "").settled);

  ASSERT_TRUE(reg.MarkBusy("w-1", "job-1").ok());
  EXPECT_TRUE(reg.HeartbeatAndCheck("w-1", "job-1").settled);
  EXPECT_FALSE(reg.HeartbeatAndCheck("w-1", "").settled);       // busy, says it runs nothing
  EXPECT_FALSE(reg.HeartbeatAndCheck("w-1", "job-2").settled);  // another job
  reg.Unwant("w-1", "job-2");                                   // not its job: no change
  EXPECT_TRUE(reg.HeartbeatAndCheck("w-1", "job-1").settled);
  reg.Unwant("w-1", "job-1");  // being stopped: its heartbeats go to the coordinator
  EXPECT_FALSE(reg.HeartbeatAndCheck("w-1", "job-1").settled);
  EXPECT_EQ(reg.Get("w-1")->state(), baton::v1::WORKER_STATE_BUSY);
  EXPECT_TRUE(reg.MarkIdle("w-1", "job-1"));
  EXPECT_TRUE(reg.HeartbeatAndCheck("w-1", "").settled);
  ASSERT_TRUE(reg.MarkBusy("w-1", "job-3").ok());  // wanted again for a new job
  EXPECT_TRUE(reg.HeartbeatAndCheck("w-1", "job-3").settled);

  EXPECT_FALSE(reg.HeartbeatAndCheck("w-404", "").known);
  clock.now += absl::Seconds(6);  // the lease ran out: dead, must register again
  EXPECT_FALSE(reg.HeartbeatAndCheck("w-1", "job-3").known);
}

TEST(WorkerRegistryTest, RefusesBadAddressesAndIds) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  for (const char* bad : {"", "localhost", "host:", "host:0", "host:70000", "host:12ab"}) {
    auto r = reg.Register(Req(bad));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("address"), std::string::npos) << r.status();
  }
  auto r = reg.Register(Req("host:1", "bad id!"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("worker_id"), std::string::npos);
  EXPECT_TRUE(reg.Register(Req("[::1]:8080")).ok());
}

TEST(WorkerRegistryTest, LeasesExpireWithoutHeartbeats) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn(), absl::Minutes(1));
  ASSERT_TRUE(reg.Register(Req("h:1")).ok());
  ASSERT_TRUE(reg.Register(Req("h:2")).ok());
  ASSERT_TRUE(reg.MarkBusy("w-2", "job-9").ok());

  clock.now += absl::Seconds(4);
  EXPECT_TRUE(reg.Heartbeat("w-1", ""));
  EXPECT_TRUE(reg.ExpireLeases().empty());
  clock.now += absl::Seconds(2);  // w-2: 6s without a heartbeat; w-1: 2s
  auto dead = reg.ExpireLeases();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].worker_id(), "w-2");
  EXPECT_EQ(dead[0].state(), baton::v1::WORKER_STATE_BUSY);  // as it was
  EXPECT_EQ(dead[0].job_id(), "job-9");
  EXPECT_TRUE(reg.ExpireLeases().empty());  // reported once
  EXPECT_FALSE(reg.Heartbeat("w-2", ""));   // must register again
  EXPECT_FALSE(reg.Heartbeat("w-404", ""));
  EXPECT_EQ(reg.Get("w-2")->state(), baton::v1::WORKER_STATE_DEAD);
  EXPECT_EQ(reg.LiveCount(), 1);
  auto all = reg.List();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].worker_id(), "w-2");  // the dead last

  // A lease that ran out is dead even before ExpireLeases collects it.
  clock.now += absl::Seconds(6);
  EXPECT_FALSE(reg.Heartbeat("w-1", ""));

  // Re-registering under the dead name revives it; long-dead workers are forgotten.
  ASSERT_TRUE(reg.Register(Req("h:2", "w-2")).ok());
  EXPECT_EQ(reg.Get("w-2")->state(), baton::v1::WORKER_STATE_IDLE);
  reg.ExpireLeases();  // w-1 dies now
  clock.now += absl::Minutes(2);
  EXPECT_TRUE(reg.Heartbeat("w-2", "") == false);  // expired too by now
  reg.ExpireLeases();
  clock.now += absl::Minutes(2);
  reg.ExpireLeases();
  EXPECT_FALSE(reg.Get("w-1").has_value());
}

TEST(WorkerRegistryTest, ReRegistrationReplacesTheOldEntry) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  ASSERT_TRUE(reg.Register(Req("h:1")).ok());
  ASSERT_TRUE(reg.MarkBusy("w-1", "job-1").ok());
  // The same process address under a new (empty) name: the old entry goes.
  auto again = reg.Register(Req("h:1"));
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->replaced.size(), 1u);
  EXPECT_EQ(again->replaced[0].worker_id(), "w-1");
  EXPECT_EQ(again->replaced[0].job_id(), "job-1");
  EXPECT_FALSE(reg.Get("w-1").has_value());
  EXPECT_EQ(again->worker.worker_id(), "w-2");
  // The same name at a new address, while the worker is alive: refused (it would hijack
  // the name and its job); once the lease ran out, it is the worker that moved.
  auto moved = reg.Register(Req("h:9", "w-2"));
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(moved.status().message().rfind("worker_id: \"w-2\" is registered from h:1 and alive", 0),
            0u)
      << moved.status();
  EXPECT_EQ(reg.Get("w-2")->address(), "h:1");
  clock.now += absl::Seconds(6);
  reg.ExpireLeases();
  moved = reg.Register(Req("h:9", "w-2"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(reg.Get("w-2")->address(), "h:9");
  // The same name at the same address: the process restarted; the old entry goes.
  auto restarted = reg.Register(Req("h:9", "w-2"));
  ASSERT_TRUE(restarted.ok());
  ASSERT_EQ(restarted->replaced.size(), 1u);
}

TEST(WorkerRegistryTest, AWorkerReportingAForeignJobIsNotHandedOut) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  ASSERT_TRUE(reg.Register(Req("h:1")).ok());
  EXPECT_TRUE(reg.Heartbeat("w-1", "job-old"));
  EXPECT_TRUE(reg.IdleWorkers().empty());
  EXPECT_TRUE(reg.Heartbeat("w-1", ""));
  EXPECT_EQ(reg.IdleWorkers().size(), 1u);
}

TEST(WorkerRegistryTest, AnotherIdentityCannotTakeALiveWorkersNameOrAddress) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  ASSERT_TRUE(reg.Register(Req("h:1", "gpu-0"), "baton-worker-0").ok());
  EXPECT_EQ(reg.Get("gpu-0")->identity(), "baton-worker-0");
  // A stranger's certificate (or none) at the same address or under the same name.
  for (const auto& [address, id] : {std::pair<std::string, std::string>{"h:1", "gpu-0"},
                                    {"h:1", "other"},
                                    {"h:2", "gpu-0"}}) {
    for (const std::string identity : {"", "baton-worker-9"}) {
      auto r = reg.Register(Req(address, id), identity);
      ASSERT_FALSE(r.ok()) << address << " " << id << " " << identity;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
    }
  }
  EXPECT_EQ(reg.Get("gpu-0")->address(), "h:1");
  // The same certificate restarting at the same address replaces its entry at once.
  auto restarted = reg.Register(Req("h:1", "gpu-0"), "baton-worker-0");
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(restarted->replaced.size(), 1u);
  // Once the lease ran out, the name is free for anyone who may register.
  clock.now += absl::Seconds(6);
  reg.ExpireLeases();
  EXPECT_TRUE(reg.Register(Req("h:2", "gpu-0"), "baton-worker-9").ok());
}

TEST(WorkerRegistryTest, CallsAreCheckedAgainstTheRegistrationsSession) {
  FakeClock clock;
  WorkerRegistry reg(absl::Seconds(5), clock.fn());
  RegisterWorkerRequest r = Req("h:1", "gpu-0");
  r.set_session_token("session-of-gpu-0-0123456789");
  ASSERT_TRUE(reg.Register(r, "baton-worker-0").ok());
  EXPECT_EQ(reg.SessionOf("gpu-0"), "session-of-gpu-0-0123456789");
  EXPECT_TRUE(reg.CheckSession("gpu-0", "session-of-gpu-0-0123456789", "baton-worker-0").ok());
  EXPECT_EQ(reg.CheckSession("gpu-0", "", "baton-worker-0").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(reg.CheckSession("gpu-0", "session-of-gpu-0-0123456780", "baton-worker-0").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reg.CheckSession("gpu-0", "session-of-gpu-0-0123456789", "baton-worker-1").code(),
            absl::StatusCode::kPermissionDenied);
  // Unknown or dead workers pass: their calls answer "register again".
  EXPECT_TRUE(reg.CheckSession("nobody", "", "").ok());
  clock.now += absl::Seconds(6);
  reg.ExpireLeases();
  EXPECT_TRUE(reg.CheckSession("gpu-0", "x", "").ok());
  EXPECT_EQ(reg.SessionOf("gpu-0"), "");
  // A session too short to be a secret is refused; none at all gets one picked.
  r.set_session_token("short");
  EXPECT_EQ(reg.Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.clear_session_token();
  ASSERT_TRUE(reg.Register(r).ok());
  EXPECT_EQ(reg.SessionOf("gpu-0").size(), 32u);
}

}  // namespace
}  // namespace baton
