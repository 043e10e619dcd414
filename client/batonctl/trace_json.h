// Chrome trace-event JSON (the format Perfetto and chrome://tracing open) from a job's
// step trace (baton.v1.JobTrace, from JobService.GetJobTrace).
//
// Layout: one process per rank ("rank R (worker W)"), one thread, i.e. one track, per
// global stage ("stage S"), so interleaved schedules show each of a rank's chunks on its
// own track. Every clock action is a complete event ("ph": "X") on its stage's track;
// STEP (the optimizer) goes on the rank's first stage. End-of-step waits for sends to
// drain are events named "wait <send>" in category "send_wait". Times are microseconds
// from the earliest rank's step start; ranks are aligned by their wall clocks.
#ifndef BATON_CLIENT_BATONCTL_TRACE_JSON_H_
#define BATON_CLIENT_BATONCTL_TRACE_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/jobs.pb.h"

namespace baton::cli {

// INVALID_ARGUMENT when an action does not parse or names a stage outside the job.
absl::StatusOr<std::string> ChromeTraceJson(const baton::v1::JobTrace& trace);

// Writes `contents` to `path` ("-": stdout) through path.tmp and a rename, so a failed
// write leaves no half file. UNAVAILABLE names the file.
absl::Status WriteOutputFile(const std::string& path, const std::string& contents);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_TRACE_JSON_H_
