#include "worker/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/status.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "common/nccl/nccl_api.h"
#include "common/core/mutex.h"
#include "worker/links.h"
#include "worker/worker_log.h"

namespace baton {

LeaseKeeper::LeaseKeeper(LeaseOptions options, CoordinatorClient* coordinator, std::string session,
                         Hooks hooks)
    : options_(std::move(options)),
      coordinator_(coordinator),
      session_(std::move(session)),
      hooks_(std::move(hooks)) {
  worker_id_ = options_.worker_id;
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

void LeaseKeeper::SetAdvertiseAddress(const std::string& address) {
  options_.advertise_address = address;
}

void LeaseKeeper::Start() {
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
}

void LeaseKeeper::RequestStop() {
  MutexLock lock(mu_);
  stopping_ = true;
  wake_.notify_all();
}

void LeaseKeeper::Stop() {
  RequestStop();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  baton::v1::HeartbeatRequest req;
  {
    MutexLock lock(mu_);
    if (!registered_) return;
    registered_ = false;  // the goodbye is said once
    req.set_worker_id(worker_id_);
  }
  req.set_leaving(true);
  const absl::Status s =
      coordinator_->Heartbeat(req, std::min(options_.rpc_timeout, absl::Seconds(2))).status();
  WorkerLog(s.ok() ? "told the coordinator this worker is leaving"
                   : absl::StrCat("could not tell the coordinator this worker is leaving: ",
                                  s.ToString()));
}

absl::Status LeaseKeeper::CheckCoordinatorSession(absl::string_view session) const {
  if (session.empty()) {
    return absl::UnauthenticatedError(
        "no x-baton-session metadata: WorkerService takes calls from the coordinator only");
  }
  if (!SecretsEqual(session, session_)) {
    return absl::PermissionDeniedError(
        "the caller is not the coordinator this worker registered with");
  }
  return absl::OkStatus();
}

std::string LeaseKeeper::worker_id() const {
  MutexLock lock(mu_);
  return worker_id_;
}

absl::Status LeaseKeeper::Register() {
  baton::v1::RegisterWorkerRequest req;
  req.set_address(options_.advertise_address);
  *req.mutable_device() = options_.device;
  req.add_capabilities("transport/grpc");
  // NCCL needs a GPU and the library: say so only when both are here.
  if (options_.offer_nccl && LoadNccl().ok()) req.add_capabilities(kNcclCapability);
  req.set_worker_id(worker_id());
  req.set_session_token(session_);
  BATON_ASSIGN_OR_RETURN(baton::v1::RegisterWorkerResponse resp, coordinator_->RegisterWorker(req));
  MutexLock lock(mu_);
  worker_id_ = resp.worker_id();
  registered_ = true;
  if (options_.metrics != nullptr) options_.metrics->SetDevice(worker_id_, options_.device);
  const absl::Duration interval = FromProtoDuration(resp.heartbeat_interval());
  heartbeat_interval_ = interval > absl::ZeroDuration() ? interval : absl::Seconds(1);
  WorkerLog(absl::StrCat("registered as ", worker_id_, " with ", options_.coordinator_address,
                         " (heartbeat every ", absl::FormatDuration(heartbeat_interval_), ")"));
  return absl::OkStatus();
}

bool LeaseKeeper::Heartbeat(int* failures) {
  baton::v1::HeartbeatRequest req;
  req.set_worker_id(worker_id());
  const std::string job = hooks_.running_job ? hooks_.running_job() : "";
  if (!job.empty()) req.set_job_id(job);
  absl::StatusOr<baton::v1::HeartbeatResponse> resp =
      coordinator_->Heartbeat(req, options_.rpc_timeout);
  // PERMISSION_DENIED: the id is another process's now (this one's lease ran out).
  const bool denied = resp.status().code() == absl::StatusCode::kPermissionDenied;
  if (!resp.ok() && !denied) {
    if ((*failures)++ % 20 == 0) {
      WorkerLog(absl::StrCat("heartbeat failed: ", resp.status().ToString()));
    }
    return true;
  }
  *failures = 0;
  if (denied || !resp->known()) {
    // It restarted or let the lease expire: any job it gave us has been failed.
    WorkerLog(denied ? absl::StrCat("heartbeat refused (", resp.status().message(),
                                    "); registering again")
                     : "the coordinator does not know this worker; registering again");
    if (!job.empty() && hooks_.abort_job) {
      hooks_.abort_job(job, "the coordinator no longer knows this worker");
    }
    return false;
  }
  for (const std::string& id : resp->abort_job_ids()) {
    if (hooks_.abort_job) hooks_.abort_job(id, "the coordinator no longer runs this job");
  }
  return true;
}

void LeaseKeeper::HeartbeatLoop() {
  int failures = 0;
  while (true) {
    absl::Duration wait;
    bool registered;
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      registered = registered_;
      wait = heartbeat_interval_;
    }
    if (!registered) {
      const absl::Status s = Register();
      if (s.ok()) {
        failures = 0;
        continue;  // heartbeat right away
      }
      if (failures++ % 20 == 0) {
        WorkerLog(absl::StrCat("cannot register with ", options_.coordinator_address, ": ",
                               s.ToString(), " (retrying)"));
      }
      wait = options_.register_retry;
    } else if (!Heartbeat(&failures)) {
      MutexLock lock(mu_);
      registered_ = false;
      continue;
    }
    MutexLock lock(mu_);
    wake_.wait_for(lock.native(), absl::ToChronoNanoseconds(wait),
                   [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
  }
}

}  // namespace baton
