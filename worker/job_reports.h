// How a job's reports reach the coordinator: the ProgressSink the worker gives each
// JobRun, over a CoordinatorClient. JobRun knows neither of these; the sink knows the run
// only to abort it.
//
// Thread safety: a CoordinatorProgressSink is used by its run's thread only.
#ifndef BATON_WORKER_JOB_REPORTS_H_
#define BATON_WORKER_JOB_REPORTS_H_

#include <functional>
#include <string>

#include "worker/coordinator_client.h"
#include "worker/job_run.h"

namespace baton {

// Sends each step's report to the coordinator (ReportProgress) as worker `worker_id()`
// (asked at each step: a re-registered worker may have another id). An answer without
// keep_running aborts `run` (ABORTED "the coordinator stopped the job"); checkpoint_and_stop
// (preemption) answers kCheckpointAndStop; a failed call is logged and the job goes on (the
// coordinator's lease logic settles a lost worker; a preemption that needed this answer then
// ends in a receive timeout, and the job fails or recovers as for any lost link).
class CoordinatorProgressSink final : public ProgressSink {
 public:
  // Not owned; both outlive the sink.
  CoordinatorProgressSink(CoordinatorClient* coordinator, std::function<std::string()> worker_id,
                          JobRun* run);

  StepAnswer OnStep(baton::v1::ReportProgressRequest report) override;

 private:
  CoordinatorClient* const coordinator_;
  const std::function<std::string()> worker_id_;
  JobRun* const run_;
};

}  // namespace baton

#endif  // BATON_WORKER_JOB_REPORTS_H_
