#include "common/collective/grpc_gloo_store.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/collective/gloo_collective.h"
#include "common/rpc/rpc.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"
#include "common/transport/rendezvous_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using Node = RendezvousNode;

// Three workers' replicas find each other through baton's gRPC alone and sum in order.
TEST(GrpcGlooStoreTest, ReplicasOnThreeWorkersJoinAndReduceThroughTensorService) {
  constexpr int kSize = 3;
  Node nodes[kSize];
  for (Node& n : nodes) n.box.OpenJob(0xfeedULL, {});
  auto channel_for = [&](int m) { return MakeChannel(nodes[m].address); };
  const std::string prefix = GlooGroupPrefix(0xfeedULL, 1, 0);
  const float values[kSize] = {1.0f, 1e8f, -1e8f};  // 0 in member order, 1 otherwise
  std::vector<float> got(kSize, -1);
  std::vector<std::thread> threads;
  for (int m = 0; m < kSize; ++m) {
    threads.emplace_back([&, m] {
      // Bounds that only catch a hang: the members' threads may start far apart.
      GrpcGlooStore store(prefix, m, kSize, &nodes[m].box, channel_for, absl::Seconds(60));
      GlooOptions o;
      o.connect_timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<GlooCollective>> c =
          GlooCollective::Connect(store, m, kSize, o);
      ASSERT_TRUE(c.ok()) << c.status();
      float x = values[m];
      ASSERT_TRUE((*c)->AllReduceSum(&x, 1, absl::Now() + absl::Seconds(60)).ok());
      got[m] = x;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int m = 0; m < kSize; ++m) EXPECT_EQ(got[m], 0.0f) << "member " << m;
  // Gloo reads only some members' keys; what it left is under the group's prefix, which
  // the worker drops when the job ends.
  for (Node& n : nodes) {
    n.box.DropPrefix(prefix);
    EXPECT_EQ(n.box.size(), 0u);
  }
}

TEST(GrpcGlooStoreTest, AMemberThatNeverPublishesEndsTheJoinWithItsKey) {
  Node a, b;
  a.box.OpenJob(7, {});
  b.box.OpenJob(7, {});
  auto channel_for = [&](int m) { return MakeChannel(m == 0 ? a.address : b.address); };
  GrpcGlooStore store(GlooGroupPrefix(7, 0, 2), 0, 2, &a.box, channel_for,
                      absl::Milliseconds(300));
  GlooOptions o;
  o.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<GlooCollective>> c = GlooCollective::Connect(store, 0, 2, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("baton/gloo/job/<key>/attempt/0/group/2/"), std::string::npos)
      << c.status();
}

}  // namespace
}  // namespace baton
