// Reading a trace file back (batonctl plan --costs-from TRACE.json); the costs themselves
// come from common/plan/measured_run.h.
#ifndef BATON_CLIENT_BATONCTL_MEASURED_COSTS_H_
#define BATON_CLIENT_BATONCTL_MEASURED_COSTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/jobs.pb.h"
#include "common/plan/measured_run.h"

namespace baton::cli {

// A Chrome trace-event JSON as `batonctl trace -o` and `batonctl train-local --trace` write
// it, read back into a JobTrace (one RankTrace per pid; send waits and all-reduces kept as
// such). INVALID_ARGUMENT naming `what` (a file name) when it is not such a trace.
absl::StatusOr<baton::v1::JobTrace> JobTraceFromChromeJson(const std::string& json,
                                                           const std::string& what);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_MEASURED_COSTS_H_
