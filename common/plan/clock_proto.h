// A rank's clock on the wire (baton.v1.JobPlan, worker.proto): the coordinator writes it
// with these, the worker reads it back with them, and no action is ever printed and parsed
// on the way.
#ifndef BATON_COMMON_PLAN_CLOCK_PROTO_H_
#define BATON_COMMON_PLAN_CLOCK_PROTO_H_

#include "absl/status/statusor.h"
#include "baton/v1/worker.pb.h"
#include "common/schedule/action.h"
#include "common/schedule/schedule.h"

namespace baton {

baton::v1::PlanAction ActionToProto(const Action& a);
// INVALID_ARGUMENT naming the action for an unknown kind or a negative index.
absl::StatusOr<Action> ActionFromProto(const baton::v1::PlanAction& a);

baton::v1::ClockSchedule ScheduleKindToProto(ScheduleKind kind);
// INVALID_ARGUMENT for CLOCK_SCHEDULE_UNSPECIFIED or a number no kind has.
absl::StatusOr<ScheduleKind> ScheduleKindFromProto(baton::v1::ClockSchedule s);

}  // namespace baton

#endif  // BATON_COMMON_PLAN_CLOCK_PROTO_H_
