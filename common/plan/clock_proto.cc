#include "common/plan/clock_proto.h"

#include "absl/strings/str_cat.h"

namespace baton {

// Both enums list the kinds in the C++ order, the proto's shifted by one for UNSPECIFIED;
// clock_proto_test checks every kind both ways.
baton::v1::PlanAction ActionToProto(const Action& a) {
  baton::v1::PlanAction out;
  out.set_kind(static_cast<baton::v1::PlanActionKind>(static_cast<int>(a.kind) + 1));
  out.set_stage(a.stage);
  out.set_microbatch(a.microbatch);
  return out;
}

absl::StatusOr<Action> ActionFromProto(const baton::v1::PlanAction& a) {
  const int kind = static_cast<int>(a.kind()) - 1;
  if (kind < 0 || kind > static_cast<int>(ActionKind::kClipGrad)) {
    return absl::InvalidArgumentError(absl::StrCat("plan: action of unknown kind ",
                                                   static_cast<int>(a.kind()), " (stage ",
                                                   a.stage(), ", micro-batch ", a.microbatch(),
                                                   ")"));
  }
  Action out{static_cast<ActionKind>(kind), a.stage(), a.microbatch()};
  if (a.stage() < 0 || a.microbatch() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: action ", out.ToString(), " has a negative index"));
  }
  return out;
}

baton::v1::ClockSchedule ScheduleKindToProto(ScheduleKind kind) {
  return static_cast<baton::v1::ClockSchedule>(static_cast<int>(kind) + 1);
}

absl::StatusOr<ScheduleKind> ScheduleKindFromProto(baton::v1::ClockSchedule s) {
  const int kind = static_cast<int>(s) - 1;
  if (kind < 0 || kind > static_cast<int>(ScheduleKind::kCustom)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: schedule_kind ", static_cast<int>(s), " names no schedule"));
  }
  return static_cast<ScheduleKind>(kind);
}

}  // namespace baton
