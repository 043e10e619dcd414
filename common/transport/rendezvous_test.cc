#include "common/transport/rendezvous.h"

#include <memory>
#include <string>
#include <thread>

#include "common/comm/inproc_transport.h"
#include "common/rpc/rpc.h"
#include "common/transport/routed_transport.h"
#include "common/transport/tensor_service.h"
#include "common/transport/rendezvous_test_util.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

// Bounds only a hang: the calls given it are expected to succeed or fail for another reason.
constexpr absl::Duration kHangBound = absl::Seconds(60);

TEST(RendezvousBoxTest, PutTakeWaitAndLimits) {
  RendezvousBox::Options o;
  o.max_entries_per_job = 2;
  o.max_value_bytes = 4;
  RendezvousBox box(o);
  box.OpenJob(7, {});
  const std::string a = "baton/nccl/job/7/a", b = "baton/nccl/job/7/b";
  EXPECT_TRUE(box.Put(a, "1").ok());
  EXPECT_TRUE(box.Put(a, "1").ok());  // a retried RPC
  EXPECT_EQ(box.Put(a, "2").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(box.Put("", "1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(box.Put("a", "1").code(), absl::StatusCode::kInvalidArgument);  // no job in it
  EXPECT_EQ(box.Put(b, "12345").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(box.Put(b, "2").ok());
  EXPECT_EQ(box.Put("baton/nccl/job/7/c", "3").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*box.Take(a, absl::Now()), "1");
  EXPECT_EQ(box.size(), 1u);
  // Take waits for a later Put, and gives up at its deadline naming the key (its job key
  // redacted).
  // (Put a little later, as a rule while Take waits; put first, it is taken all the same.)
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(box.Put("baton/nccl/job/7/late", "x").ok());
  });
  EXPECT_EQ(*box.Take("baton/nccl/job/7/late", absl::Now() + kHangBound), "x");
  later.join();
  const absl::StatusOr<std::string> none =
      box.Take("baton/gloo/job/7/never", absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(none.status().message(), "rendezvous: nothing arrived under baton/gloo/job/<key>/never");
  ASSERT_TRUE(box.Put("baton/nccl/job/7/x", "1").ok());
  box.DropPrefix("baton/nccl/job/7/x");
  EXPECT_EQ(box.size(), 1u);  // b stays
}

TEST(RendezvousBoxTest, KeysNameTheirJobAndErrorsRedactIt) {
  EXPECT_EQ(JobKeyOfRendezvousKey("baton/nccl/job/18446744073709551615/attempt/0/0->1"),
            18446744073709551615ULL);
  EXPECT_EQ(JobKeyOfRendezvousKey("baton/gloo/job/5/"), 5u);
  for (const char* bad : {"", "baton/job/5/x", "baton/nccl/job/x/", "baton/nccl/job/5",
                          "other/nccl/job/5/", "baton//job/5/"}) {
    EXPECT_FALSE(JobKeyOfRendezvousKey(bad).has_value()) << bad;
  }
  EXPECT_EQ(RedactJobKey("rendezvous baton/nccl/job/123/attempt/0 and baton/gloo/job/9/x"),
            "rendezvous baton/nccl/job/<key>/attempt/0 and baton/gloo/job/<key>/x");
}

// Entries belong to an open job attempt and its members: a stranger files nothing, a
// member of another job neither, junk cannot fill the box for a job's members, and what an
// attempt held goes when it closes.
TEST(RendezvousBoxTest, OnlyAnOpenAttemptsMembersFileAndEntriesExpireWithIt) {
  RendezvousBox::Options o;
  o.max_entries_per_job = 4;
  RendezvousBox box(o);
  // Nothing is open: any key is refused (UNAVAILABLE: a peer ahead of this worker retries).
  EXPECT_EQ(box.Put("baton/nccl/job/1/x", "v", "baton-worker-1").code(),
            absl::StatusCode::kUnavailable);
  for (int i = 0; i < 1024; ++i) {  // a flood of junk for jobs that do not run here
    EXPECT_FALSE(box.Put(absl::StrCat("baton/gloo/job/", 1000 + i, "/junk"), "v", "user").ok());
  }
  EXPECT_EQ(box.size(), 0u);
  box.OpenJob(1, {"baton-worker-0", "baton-worker-1"});
  const absl::Status stranger = box.Put("baton/nccl/job/1/x", "v", "baton-client");
  EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(stranger.message()),
              testing::HasSubstr("baton-client is not a member of its job"));
  EXPECT_EQ(box.Put("baton/nccl/job/1/x", "v", "").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(box.Put("baton/nccl/job/2/x", "v", "baton-worker-1").code(),
            absl::StatusCode::kUnavailable);  // another job's key
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(box.Put(absl::StrCat("baton/nccl/job/1/", i), "v", "baton-worker-1").ok());
  }
  EXPECT_EQ(box.Put("baton/nccl/job/1/5", "v", "baton-worker-0").code(),
            absl::StatusCode::kResourceExhausted);  // full: only for its own members
  box.OpenJob(2, {});  // the next attempt, on a plaintext cluster: anyone with its key
  EXPECT_TRUE(box.Put("baton/gloo/job/2/x", "v", "").ok());
  EXPECT_EQ(*box.Take("baton/nccl/job/1/0", absl::Now()), "v");  // room again
  EXPECT_TRUE(box.Put("baton/nccl/job/1/5", "v", "baton-worker-0").ok());
  box.CloseJob(1);
  EXPECT_EQ(box.size(), 1u);  // job 2's entry stays
  EXPECT_EQ(box.Put("baton/nccl/job/1/6", "v", "baton-worker-0").code(),
            absl::StatusCode::kUnavailable);
  box.CloseJob(2);
  EXPECT_EQ(box.size(), 0u);
}

using Node = RendezvousNode;

TEST(RendezvousTest, IdsTravelOverTensorServiceBothWays) {
  Node n0, n1;
  n0.box.OpenJob(3, {});
  n1.box.OpenJob(3, {});
  auto channel_to = [&](int rank) { return MakeChannel(rank == 0 ? n0.address : n1.address); };
  GrpcNcclIdExchange ex0(0, &n0.box, channel_to, kHangBound);
  GrpcNcclIdExchange ex1(1, &n1.box, channel_to, kHangBound);
  NcclUniqueId a, b;
  a.bytes[0] = 'a';
  b.bytes[127] = 'b';
  // Rank 0 (the lower) publishes both directions' ids; rank 1 fetches them.
  ASSERT_TRUE(ex0.Publish("baton/nccl/job/3/attempt/0/0->1", a).ok());
  ASSERT_TRUE(ex0.Publish("baton/nccl/job/3/attempt/0/1->0", b).ok());
  EXPECT_EQ(*ex1.Fetch("baton/nccl/job/3/attempt/0/0->1", absl::Now() + kHangBound), a);
  EXPECT_EQ(*ex1.Fetch("baton/nccl/job/3/attempt/0/1->0", absl::Now() + kHangBound), b);
  EXPECT_EQ(ex0.Publish("baton/nccl/job/3/attempt/0/4->5", a).code(),
            absl::StatusCode::kInvalidArgument);  // not an edge of rank 0
  // A value of the wrong size is refused when fetched.
  const std::string k = "baton/nccl/job/3/attempt/0/9->1";
  ASSERT_TRUE(SendRendezvous(channel_to(1), k, "short", absl::Now() + kHangBound).ok());
  EXPECT_EQ(ex1.Fetch(k, absl::Now() + kHangBound).status().code(),
            absl::StatusCode::kDataLoss);
}

// A peer ahead of this worker (its StartJob not here yet) is refused UNAVAILABLE and
// retries until the job opens; a sender outside the job gives up at its deadline.
TEST(RendezvousTest, APublishAheadOfTheJobWaitsForItToOpen) {
  Node n;
  const std::string key = "baton/nccl/job/4/attempt/0/0->1";
  // The job opens a little later (as a rule after the first attempts were refused; the
  // send succeeds either way).
  std::thread open_later([&] {
    absl::SleepFor(absl::Milliseconds(200));
    n.box.OpenJob(4, {});
  });
  EXPECT_TRUE(SendRendezvous(MakeChannel(n.address), key, "v", absl::Now() + kHangBound).ok());
  open_later.join();
  EXPECT_EQ(*n.box.Take(key, absl::Now()), "v");
  // The sender retries until its deadline and then gives up: with the refusal it last got
  // (UNAVAILABLE), or DEADLINE_EXCEEDED when the deadline cut its last attempt short (how
  // much time that attempt had left depends on scheduling).
  const absl::Status never = SendRendezvous(MakeChannel(n.address), "baton/nccl/job/5/attempt/0/0->1",
                                            "v", absl::Now() + absl::Milliseconds(300));
  EXPECT_THAT(never.code(), testing::AnyOf(absl::StatusCode::kUnavailable,
                                           absl::StatusCode::kDeadlineExceeded))
      << never;
  EXPECT_THAT(std::string(never.message()), testing::HasSubstr("baton/nccl/job/<key>/"));
}

TEST(RendezvousTest, AWorkerWithoutABoxSaysUnimplemented) {
  TensorInbox inbox;
  TensorServiceImpl::Options so;
  so.tune_malloc = false;
  TensorServiceImpl service(&inbox, so);
  ServerOptions opts;
  opts.services = {&service};
  std::string address;
  auto server = StartServer(opts, &address);
  ASSERT_TRUE(server.ok());
  const absl::Status s = SendRendezvous(MakeChannel(address), "baton/nccl/job/1/k", "v",
                                        absl::Now() + kHangBound);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  (*server)->Shutdown();
}

TEST(RoutedTransportTest, EachPeerGoesToItsTransport) {
  InProcessHub a(3), b(3);  // rank 0 reaches rank 1 through a, rank 2 through b
  RoutedTransport r0(0, {nullptr, a.transport(0), b.transport(0)});
  EXPECT_STREQ(r0.backend(), "inproc");
  EXPECT_EQ(r0.BackendFor(1), "inproc");
  EXPECT_EQ(r0.BackendFor(0), "");
  const TensorTag t1{1, 0, 0, 0, TensorKind::kActivation};
  Tensor x = Tensor::Zeros({2});
  ASSERT_TRUE(r0.Send(1, t1, x)->Wait(absl::Now() + kHangBound).ok());
  ASSERT_TRUE(r0.Send(2, t1, x)->Wait(absl::Now() + kHangBound).ok());
  EXPECT_EQ(a.Pending(), 1);
  EXPECT_EQ(b.Pending(), 1);
  EXPECT_TRUE(a.transport(1)->Recv(0, t1, absl::Now() + kHangBound).ok());
  EXPECT_TRUE(b.transport(2)->Recv(0, t1, absl::Now() + kHangBound).ok());
  // No link: a clear error, not a crash.
  EXPECT_EQ(r0.Recv(0, t1, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  // Abort reaches every routed transport.
  r0.Abort(absl::InternalError("stop"));
  EXPECT_EQ(a.transport(1)->Recv(0, t1, absl::Now() + kHangBound).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(b.transport(2)->Recv(0, t1, absl::Now() + kHangBound).status().code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace baton
