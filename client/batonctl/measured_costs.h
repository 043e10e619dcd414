// What a run measured, as the simulator's costs: `batonctl plan --costs-from JOB|TRACE.json`
// predicts a clock from the per-stage action times a finished (or running) job recorded in
// one step's trace, instead of unit costs.
//
// Units are milliseconds. Per stage: F, B, I and W are the means of that stage's spans (the
// device time where a GPU rank measured one); SEND the mean time to post a send; RECV the
// shortest receive seen on the stage, the closest the trace comes to a transfer without
// waiting (a receive's span also holds the wait for its producer, which the simulator
// derives itself); STEP the mean optimizer step. A run without split backward has no I or
// W: they are taken as half of B each; a run with I and W but no B gets B = I + W.
#ifndef BATON_CLIENT_BATONCTL_MEASURED_COSTS_H_
#define BATON_CLIENT_BATONCTL_MEASURED_COSTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/jobs.pb.h"
#include "common/schedule/validate.h"

namespace baton::cli {

// Per-stage costs from one step's trace (trace.num_stages() stages). INVALID_ARGUMENT when
// a stage ran no forward, or an action does not parse.
absl::StatusOr<Costs> CostsFromTrace(const baton::v1::JobTrace& trace);

// A Chrome trace-event JSON as `batonctl trace -o` and `batonctl train-local --trace` write
// it, read back into a JobTrace (one RankTrace per pid; send waits and all-reduces kept as
// such). INVALID_ARGUMENT naming `what` (a file name) when it is not such a trace.
absl::StatusOr<baton::v1::JobTrace> JobTraceFromChromeJson(const std::string& json,
                                                           const std::string& what);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_MEASURED_COSTS_H_
