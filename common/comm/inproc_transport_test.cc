// The in-process transport's own behaviour: delivery in any order, a hub-wide abort and
// its reset, refusals. What every transport promises is tested in
// common/pipeline/transport_contract_test.cc.
#include "common/comm/inproc_transport.h"

#include <thread>

#include "gtest/gtest.h"

namespace baton {
namespace {

Tensor Filled(float v, int n = 4) {
  Tensor t = Tensor::Empty({n});
  for (int i = 0; i < n; ++i) t.f32()[i] = v + static_cast<float>(i);
  return t;
}

TensorTag Tag(int mb, int stage = 0, TensorKind kind = TensorKind::kActivation) {
  return TensorTag{7, 1, mb, stage, kind};
}

TEST(InProcessTransportTest, DeliversByTagInAnyOrder) {
  InProcessHub hub(2);
  ASSERT_TRUE(hub.transport(0)->Send(1, Tag(0), Filled(1))->Wait(absl::InfiniteFuture()).ok());
  ASSERT_TRUE(hub.transport(0)->Send(1, Tag(1), Filled(10))->Wait(absl::InfiniteFuture()).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);  // only bounds a hang
  absl::StatusOr<Tensor> b = hub.transport(1)->Recv(0, Tag(1), deadline);
  absl::StatusOr<Tensor> a = hub.transport(1)->Recv(0, Tag(0), deadline);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->f32()[0], 1.0f);
  EXPECT_EQ(b->f32()[3], 13.0f);
  EXPECT_EQ(hub.Pending(), 0);
  EXPECT_EQ(hub.Counters().tensors_sent, 2);
  EXPECT_EQ(hub.Counters().bytes_sent, 32);
}

TEST(InProcessTransportTest, AbortWakesWaitersWithTheReason) {
  InProcessHub hub(3);
  absl::Status seen;
  std::thread waiter([&] {
    // Woken by the abort, not by this deadline (that would be DEADLINE_EXCEEDED).
    seen = hub.transport(2)->Recv(1, Tag(0), absl::Now() + absl::Minutes(10)).status();
  });
  // As a rule the receive waits by now; one that starts after the abort fails the same way.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  hub.transport(0)->Abort(absl::InternalError("disk on fire"));
  waiter.join();
  EXPECT_EQ(seen.code(), absl::StatusCode::kAborted);
  EXPECT_NE(seen.message().find("rank 0 aborted: disk on fire"), absl::string_view::npos) << seen;
  // Later operations fail too, until Reset.
  EXPECT_FALSE(hub.transport(1)->Send(2, Tag(1), Filled(0))->Wait(absl::InfiniteFuture()).ok());
  hub.Reset();
  EXPECT_TRUE(hub.transport(1)->Send(2, Tag(1), Filled(0))->Wait(absl::InfiniteFuture()).ok());
}

TEST(InProcessTransportTest, DuplicateTagAndBadPeerAreRefused) {
  InProcessHub hub(2);
  ASSERT_TRUE(hub.transport(0)->Send(1, Tag(0), Filled(1))->Wait(absl::InfiniteFuture()).ok());
  EXPECT_EQ(hub.transport(0)->Send(1, Tag(0), Filled(1))->Wait(absl::InfiniteFuture()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(hub.transport(0)->Send(5, Tag(1), Filled(1))->Wait(absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
