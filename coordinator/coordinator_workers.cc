// The coordinator's side of ClusterService: workers registering, leaving and heartbeating.
// A worker gone becomes a WorkerGone event (coordinator.cc) for the job it held.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/mutex.h"
#include "common/core/status.h"
#include "common/rpc/rpc.h"
#include "coordinator/coordinator.h"

namespace baton {

using baton::v1::Job;
using baton::v1::JobEvent;
using baton::v1::JobState;

absl::StatusOr<baton::v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const baton::v1::RegisterWorkerRequest& request, const WorkerCaller& caller) {
  BATON_RETURN_IF_ERROR(CheckWorkerCredentials(options_, caller));
  Effects effects;
  baton::v1::RegisterWorkerResponse response;
  absl::Status status;
  {
    MutexLock lock(mu_);
    ExpireLeasesLocked(&effects);  // an expired lease is reported as such, not as "replaced"
    absl::StatusOr<WorkerRegistry::Registration> reg = registry_.Register(request, caller.identity);
    if (!reg.ok()) {
      status = reg.status();
    } else {
      for (const baton::v1::WorkerInfo& old : reg->replaced) {
        LogWarning(absl::StrCat("worker ", old.worker_id(), " (", old.address(),
                                ") replaced by a new registration as ", reg->worker.worker_id()));
        WorkerGoneLocked(
            old,
            absl::StrCat("worker ", old.worker_id(), " (", old.address(), ") registered again"),
            /*name_rank=*/true, &effects);
      }
      LogWarning(absl::StrCat("worker ", reg->worker.worker_id(), " registered from ",
                              reg->worker.address(),
                              caller.identity.empty() ? "" : " as " + caller.identity));
      response.set_worker_id(reg->worker.worker_id());
      *response.mutable_heartbeat_interval() = ToProtoDuration(options_.heartbeat_interval);
      *response.mutable_lease_ttl() = ToProtoDuration(options_.lease_ttl);
      WakeLoop();
    }
  }
  Run(std::move(effects), /*wait=*/false);
  if (!status.ok()) return status;
  return response;
}

absl::Status Coordinator::AuthenticateWorker(const std::string& worker_id,
                                             const WorkerCaller& caller) {
  return registry_.CheckSession(worker_id, caller.session, caller.identity);  // its own lock
}

void Coordinator::WorkerLeaving(const std::string& worker_id) {
  // Shutting down: out of service now, not once the lease runs out.
  Effects effects;
  {
    MutexLock lock(mu_);
    if (std::optional<baton::v1::WorkerInfo> w = registry_.Leave(worker_id)) {
      LogWarning(absl::StrCat("worker ", w->worker_id(), " (", w->address(), ") left"));
      WorkerGoneLocked(*w,
                       absl::StrCat("worker ", w->worker_id(), " (", w->address(),
                                    ") shut down while running the job"),
                       /*name_rank=*/false, &effects);
      WakeLoop();
    }
  }
  Run(std::move(effects), /*wait=*/false);
}

absl::StatusOr<baton::v1::HeartbeatResponse> Coordinator::Heartbeat(
    const baton::v1::HeartbeatRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  baton::v1::HeartbeatResponse response;
  if (request.leaving()) {
    WorkerLeaving(request.worker_id());
    response.set_known(false);
    return response;
  }
  // Most heartbeats settle nothing but the lease (an idle worker idle, a busy one running
  // the job it was given): the registry's own lock suffices, and they never wait for a
  // placement round or a report holding mu_.
  const WorkerRegistry::Beat beat =
      registry_.HeartbeatAndCheck(request.worker_id(), request.job_id());
  if (options_.metrics != nullptr && beat.known) {
    options_.metrics->AddHeartbeatsMissed(MissedHeartbeats(beat.previous, Now()));
  }
  response.set_known(beat.known);
  if (!beat.known || beat.settled) return response;
  MutexLock lock(mu_);
  if (request.job_id().empty()) {
    // Busy with a job that no longer holds it (its AbortJob did not get through), and the
    // worker says it runs nothing: free it.
    const std::optional<baton::v1::WorkerInfo> info = registry_.Get(request.worker_id());
    if (info.has_value() && info->state() == baton::v1::WORKER_STATE_BUSY &&
        starting_.count(info->job_id()) == 0) {
      bool held = false;
      if (ActiveJob* j = FindActiveLocked(info->job_id())) {
        for (const RankSlot& slot : j->ranks) {
          held |= slot.worker.worker_id == request.worker_id() && slot.held;
        }
      }
      if (!held && registry_.MarkIdle(request.worker_id(), info->job_id())) WakeLoop();
    }
    return response;
  }
  bool wanted = false;
  if (ActiveJob* j = FindActiveLocked(request.job_id());
      j != nullptr && IsPlacedState(j->job.state())) {
    for (const RankSlot& slot : j->ranks) {
      if (slot.worker.worker_id == request.worker_id() && slot.held && !slot.finished) {
        wanted = true;
      }
    }
  }
  if (!wanted) response.add_abort_job_ids(request.job_id());
  return response;
}

}  // namespace baton
