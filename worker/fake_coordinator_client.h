// FakeCoordinatorClient: an in-memory coordinator for tests of the worker. It records
// every call and answers as the test set it up: registrations get an id and a short
// heartbeat interval, heartbeats say the worker is known (and which jobs to abort),
// progress reports keep the job running until a chosen step, results are accepted.
//
// Thread-safe: every field is guarded by mu_; Await* wait for a call to arrive.
#ifndef BATON_WORKER_FAKE_COORDINATOR_CLIENT_H_
#define BATON_WORKER_FAKE_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/rpc.h"
#include "worker/coordinator_client.h"

namespace baton {

class FakeCoordinatorClient final : public CoordinatorClient {
 public:
  // Answers ReportProgress for a step at or after `step` with keep_running false.
  void StopJobAtStep(int64_t step) {
    absl::MutexLock lock(&mu_);
    stop_at_step_ = step;
  }
  // Answers ReportProgress for step `step` with checkpoint_and_stop (a preemption).
  void PreemptAtStep(int64_t step) {
    absl::MutexLock lock(&mu_);
    preempt_at_step_ = step;
  }
  // The next heartbeats list `job_id` among the jobs to abort.
  void AbortJobInHeartbeats(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    abort_job_ids_.push_back(job_id);
  }
  // Every call fails with `status` until set back to OK.
  void FailCalls(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(status);
  }

  absl::StatusOr<baton::v1::RegisterWorkerResponse> RegisterWorker(
      const baton::v1::RegisterWorkerRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (!fail_.ok()) return fail_;
    registrations_.push_back(request);
    baton::v1::RegisterWorkerResponse resp;
    resp.set_worker_id(request.worker_id().empty() ? "w-fake" : request.worker_id());
    *resp.mutable_heartbeat_interval() = ToProtoDuration(absl::Milliseconds(20));
    return resp;
  }
  absl::StatusOr<baton::v1::HeartbeatResponse> Heartbeat(const baton::v1::HeartbeatRequest& request,
                                                         absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (!fail_.ok()) return fail_;
    heartbeats_.push_back(request);
    baton::v1::HeartbeatResponse resp;
    resp.set_known(true);
    for (const std::string& id : abort_job_ids_) resp.add_abort_job_ids(id);
    return resp;
  }
  absl::StatusOr<baton::v1::ReportProgressResponse> ReportProgress(
      const baton::v1::ReportProgressRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (!fail_.ok()) return fail_;
    progress_.push_back(request);
    baton::v1::ReportProgressResponse resp;
    resp.set_keep_running(stop_at_step_ <= 0 || request.step() < stop_at_step_);
    resp.set_checkpoint_and_stop(request.step() == preempt_at_step_);
    return resp;
  }
  absl::StatusOr<baton::v1::ReportResultResponse> ReportResult(
      const baton::v1::ReportResultRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (!fail_.ok()) return fail_;
    results_.push_back(request);
    return baton::v1::ReportResultResponse();
  }

  std::vector<baton::v1::RegisterWorkerRequest> registrations() const {
    absl::MutexLock lock(&mu_);
    return registrations_;
  }
  std::vector<baton::v1::HeartbeatRequest> heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<baton::v1::ReportProgressRequest> progress() const {
    absl::MutexLock lock(&mu_);
    return progress_;
  }
  std::vector<baton::v1::ReportResultRequest> results() const {
    absl::MutexLock lock(&mu_);
    return results_;
  }
  // Waits up to `timeout` until `n` results (heartbeats) arrived; whether they did.
  bool AwaitResults(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto arrived = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return results_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  }
  bool AwaitHeartbeats(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto arrived = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return heartbeats_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  int64_t stop_at_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t preempt_at_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> abort_job_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<baton::v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<baton::v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<baton::v1::ReportProgressRequest> progress_ ABSL_GUARDED_BY(mu_);
  std::vector<baton::v1::ReportResultRequest> results_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_FAKE_COORDINATOR_CLIENT_H_
