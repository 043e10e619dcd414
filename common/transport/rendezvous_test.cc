#include "common/transport/rendezvous.h"

#include <memory>
#include <string>
#include <thread>

#include "common/pipeline/inproc_transport.h"
#include "common/rpc/rpc.h"
#include "common/transport/routed_transport.h"
#include "common/transport/tensor_service.h"
#include "common/transport/rendezvous_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(RendezvousBoxTest, PutTakeWaitAndLimits) {
  RendezvousBox::Options o;
  o.max_entries = 2;
  o.max_value_bytes = 4;
  RendezvousBox box(o);
  EXPECT_TRUE(box.Put("a", "1").ok());
  EXPECT_TRUE(box.Put("a", "1").ok());  // a retried RPC
  EXPECT_EQ(box.Put("a", "2").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(box.Put("", "1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(box.Put("b", "12345").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(box.Put("b", "2").ok());
  EXPECT_EQ(box.Put("c", "3").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*box.Take("a", absl::Now()), "1");
  EXPECT_EQ(box.size(), 1u);
  // Take waits for a later Put, and gives up at its deadline naming the key.
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(box.Put("late", "x").ok());
  });
  EXPECT_EQ(*box.Take("late", absl::Now() + absl::Seconds(5)), "x");
  later.join();
  const absl::StatusOr<std::string> none = box.Take("never", absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(none.status().message().find("never"), std::string::npos);
  ASSERT_TRUE(box.Put("baton/nccl/job/7/x", "1").ok());
  box.DropPrefix("baton/nccl/job/7/");
  EXPECT_EQ(box.size(), 1u);  // "b" stays
}

using Node = RendezvousNode;

TEST(RendezvousTest, IdsTravelOverTensorServiceBothWays) {
  Node n0, n1;
  auto channel_to = [&](int rank) { return MakeChannel(rank == 0 ? n0.address : n1.address); };
  GrpcNcclIdExchange ex0(0, &n0.box, channel_to, absl::Seconds(5));
  GrpcNcclIdExchange ex1(1, &n1.box, channel_to, absl::Seconds(5));
  NcclUniqueId a, b;
  a.bytes[0] = 'a';
  b.bytes[127] = 'b';
  // Rank 0 (the lower) publishes both directions' ids; rank 1 fetches them.
  ASSERT_TRUE(ex0.Publish("baton/nccl/job/3/attempt/0/0->1", a).ok());
  ASSERT_TRUE(ex0.Publish("baton/nccl/job/3/attempt/0/1->0", b).ok());
  EXPECT_EQ(*ex1.Fetch("baton/nccl/job/3/attempt/0/0->1", absl::Now() + absl::Seconds(5)), a);
  EXPECT_EQ(*ex1.Fetch("baton/nccl/job/3/attempt/0/1->0", absl::Now() + absl::Seconds(5)), b);
  EXPECT_EQ(ex0.Publish("baton/nccl/job/3/attempt/0/4->5", a).code(),
            absl::StatusCode::kInvalidArgument);  // not an edge of rank 0
  // A value of the wrong size is refused when fetched.
  ASSERT_TRUE(SendRendezvous(channel_to(1), "k", "short", absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(ex1.Fetch("k", absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kDataLoss);
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
  const absl::Status s =
      SendRendezvous(MakeChannel(address), "k", "v", absl::Now() + absl::Seconds(5));
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
  ASSERT_TRUE(r0.Send(1, t1, x)->Wait(absl::Now() + absl::Seconds(1)).ok());
  ASSERT_TRUE(r0.Send(2, t1, x)->Wait(absl::Now() + absl::Seconds(1)).ok());
  EXPECT_EQ(a.Pending(), 1);
  EXPECT_EQ(b.Pending(), 1);
  EXPECT_TRUE(a.transport(1)->Recv(0, t1, absl::Now() + absl::Seconds(1)).ok());
  EXPECT_TRUE(b.transport(2)->Recv(0, t1, absl::Now() + absl::Seconds(1)).ok());
  // No link: a clear error, not a crash.
  EXPECT_EQ(r0.Recv(0, t1, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  // Abort reaches every routed transport.
  r0.Abort(absl::InternalError("stop"));
  EXPECT_EQ(a.transport(1)->Recv(0, t1, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(b.transport(2)->Recv(0, t1, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace baton
