#include "worker/job_reports.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/worker_log.h"

namespace baton {

CoordinatorProgressSink::CoordinatorProgressSink(CoordinatorClient* coordinator,
                                                 std::function<std::string()> worker_id,
                                                 JobRun* run)
    : coordinator_(coordinator), worker_id_(std::move(worker_id)), run_(run) {}

StepAnswer CoordinatorProgressSink::OnStep(baton::v1::ReportProgressRequest report) {
  report.set_worker_id(worker_id_());
  absl::StatusOr<baton::v1::ReportProgressResponse> resp = coordinator_->ReportProgress(report);
  if (!resp.ok()) {
    WorkerLog(absl::StrCat("progress report for step ", report.step(),
                           " failed: ", resp.status().ToString()));
  } else if (!resp->keep_running()) {
    run_->Abort(absl::AbortedError("the coordinator stopped the job"));
  } else if (resp->checkpoint_and_stop()) {
    return StepAnswer::kCheckpointAndStop;
  }
  return StepAnswer::kContinue;
}

}  // namespace baton
