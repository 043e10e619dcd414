#include "coordinator/call_caps.h"

#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(CallCaps, RefusesPastEitherCapNamingItAndGivesPlacesBackOnDestruction) {
  CallCaps caps("exports", 3, 2);
  absl::StatusOr<CallCaps::Slot> a1 = caps.Acquire("caller alice");
  absl::StatusOr<CallCaps::Slot> a2 = caps.Acquire("caller alice");
  ASSERT_TRUE(a1.ok() && a2.ok());
  const absl::Status alice = caps.Acquire("caller alice").status();
  EXPECT_EQ(alice.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alice.message(),
            "too many exports for caller alice (2 at once; the limit per caller is 2): "
            "retry later");
  absl::StatusOr<CallCaps::Slot> b1 = caps.Acquire("caller bob");
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(caps.in_use(), 3);
  const absl::Status bob = caps.Acquire("caller bob").status();
  EXPECT_EQ(bob.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bob.message(), "too many exports at once (3; the limit is 3): retry later");
  // A place moved is held once, and given back once.
  CallCaps::Slot moved = *std::move(a1);
  EXPECT_EQ(caps.in_use(), 3);
  moved = CallCaps::Slot();
  EXPECT_EQ(caps.in_use(), 2);
  EXPECT_TRUE(caps.Acquire("caller bob").ok());  // taken and given back at once
  a2 = absl::InternalError("dropped");
  b1 = absl::InternalError("dropped");
  EXPECT_EQ(caps.in_use(), 0);
}

TEST(CallCaps, CapsBelowOneAreOne) {
  CallCaps caps("watch streams", 0, -1);
  absl::StatusOr<CallCaps::Slot> one = caps.Acquire("x");
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(caps.Acquire("y").status().message(), HasSubstr("the limit is 1"));
}

}  // namespace
}  // namespace baton
