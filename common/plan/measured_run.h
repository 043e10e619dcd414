// What a run measured, as the simulator's costs and the auto-planner's calibration:
// `batonctl plan --costs-from JOB|TRACE.json` predicts a clock from the per-stage action
// times a finished (or running) job recorded in one step's trace, instead of unit costs;
// `batonctl plan --auto` and SCHEDULE_AUTO calibrate the planner's rates (planner.h) from
// them.
//
// Units are milliseconds. Per stage: F, B, I and W are the means of that stage's spans (the
// device time where a GPU rank measured one); SEND the mean time to post a send; RECV the
// shortest receive seen on the stage, the closest the trace comes to a transfer without
// waiting (a receive's span also holds the wait for its producer, which the simulator
// derives itself); STEP the mean optimizer step. A run without split backward has no I or
// W: they are taken as half of B each; a run with I and W but no B gets B = I + W.
#ifndef BATON_COMMON_PLAN_MEASURED_RUN_H_
#define BATON_COMMON_PLAN_MEASURED_RUN_H_

#include "absl/status/statusor.h"
#include "baton/v1/jobs.pb.h"
#include "common/plan/planner.h"
#include "common/schedule/validate.h"

namespace baton {

// Per-stage costs from one step's trace (trace.num_stages() stages). INVALID_ARGUMENT when
// a stage ran no forward, or an action does not parse.
absl::StatusOr<Costs> CostsFromTrace(const baton::v1::JobTrace& trace);

// The planner's calibration from a job (its spec and pipeline report: partition, D, M) and
// one step of its trace. INVALID_ARGUMENT when the job has no pipeline report yet or the
// trace's stages differ from it.
// The samples in one micro-batch of a placed job (its report's D and M), 0 before placement.
int64_t MicrobatchRows(const baton::v1::Job& job);

absl::StatusOr<MeasuredRun> MeasuredRunFromJob(const baton::v1::Job& job,
                                               const baton::v1::JobTrace& trace);

}  // namespace baton

#endif  // BATON_COMMON_PLAN_MEASURED_RUN_H_
