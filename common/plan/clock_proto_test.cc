#include "common/plan/clock_proto.h"

#include "common/schedule/vocabulary.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(ClockProtoTest, EveryActionKindRoundTripsUnderItsOwnName) {
  for (int k = 0; k <= static_cast<int>(ActionKind::kClipGrad); ++k) {
    const Action a{static_cast<ActionKind>(k), 3, k == 8 ? 0 : 5};
    const baton::v1::PlanAction p = ActionToProto(a);
    // The proto's enum name spells the kind's clock text: PLAN_ACTION_KIND_SEND_F for SEND_F.
    const std::string name = baton::v1::PlanActionKind_Name(p.kind());
    SCOPED_TRACE(name);
    absl::StatusOr<Action> back = ActionFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, a);
    const std::string text = ActionKindName(a.kind);
    if (text.size() > 1) {
      EXPECT_EQ(name, "PLAN_ACTION_KIND_" + text);
    }
  }
  EXPECT_EQ(baton::v1::PlanActionKind_Name(ActionToProto({ActionKind::kForward, 0, 0}).kind()),
            "PLAN_ACTION_KIND_FORWARD");
  EXPECT_EQ(baton::v1::PlanActionKind_Name(ActionToProto({ActionKind::kBackwardWeight, 0, 0}).kind()),
            "PLAN_ACTION_KIND_BACKWARD_WEIGHT");
}

TEST(ClockProtoTest, UnknownKindsAndNegativeIndicesAreRefusedNamingTheAction) {
  baton::v1::PlanAction p;
  EXPECT_EQ(ActionFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);  // unset
  p.set_kind(static_cast<baton::v1::PlanActionKind>(99));
  absl::StatusOr<Action> a = ActionFromProto(p);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("unknown kind 99"), std::string::npos) << a.status();
  p.set_kind(baton::v1::PLAN_ACTION_KIND_FORWARD);
  p.set_stage(-1);
  a = ActionFromProto(p);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("negative"), std::string::npos) << a.status();
}

TEST(ClockProtoTest, EveryScheduleKindRoundTripsUnderItsOwnName) {
  for (const ScheduleEntry& e : ScheduleTable()) {
    const baton::v1::ClockSchedule p = ScheduleKindToProto(e.kind);
    absl::StatusOr<ScheduleKind> back = ScheduleKindFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, e.kind);
    // CLOCK_SCHEDULE_ZB_H1 for "zb-h1", CLOCK_SCHEDULE_1F1B for "1f1b".
    std::string want = std::string("CLOCK_SCHEDULE_") + e.name;
    for (char& c : want) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
    EXPECT_EQ(baton::v1::ClockSchedule_Name(p), want);
  }
  EXPECT_FALSE(ScheduleKindFromProto(baton::v1::CLOCK_SCHEDULE_UNSPECIFIED).ok());
  EXPECT_FALSE(ScheduleKindFromProto(static_cast<baton::v1::ClockSchedule>(42)).ok());
}

}  // namespace
}  // namespace baton
