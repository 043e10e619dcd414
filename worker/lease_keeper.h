// LeaseKeeper: this worker's membership in the cluster. It registers with the coordinator
// (retrying every register_retry until it answers), renews the lease with a heartbeat
// every heartbeat_interval (the coordinator's choice), registers again when the
// coordinator has forgotten the worker (it restarted, or the lease ran out: any job it gave
// the worker has been failed, so that job is aborted), aborts the jobs the coordinator
// lists as unwanted, and on Stop says goodbye (a heartbeat with `leaving`).
//
// It owns the session secret: chosen by whoever builds the keeper and its
// CoordinatorClient (the client sends it with every call), sent with each registration,
// and checked on the coordinator's WorkerService calls (CheckCoordinatorSession).
//
// It knows nothing of how jobs run: it asks Hooks::running_job which job to name in a
// heartbeat, and tells Hooks::abort_job which job to stop and why. Hooks are called from
// the heartbeat thread with no lock of the keeper held.
//
// Thread safety: every public method may be called from any thread; worker_id_,
// registered_, heartbeat_interval_ and stopping_ are guarded by mu_. Start and Stop are
// called by one owner (WorkerAgent), Start at most once.
#ifndef BATON_WORKER_LEASE_KEEPER_H_
#define BATON_WORKER_LEASE_KEEPER_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "baton/v1/worker.pb.h"
#include "worker/coordinator_client.h"
#include "worker/worker_metrics.h"
#include "common/core/mutex.h"

namespace baton {

struct LeaseOptions {
  std::string coordinator_address;  // for log lines only: calls go through the client
  std::string advertise_address;    // host:port peers and the coordinator reach us on
  std::string worker_id;            // empty: the coordinator assigns one
  baton::v1::DeviceInfo device;
  // Offer the NCCL transport (kNcclCapability) when libnccl loads: the device is a GPU and
  // the worker takes peers' rendezvous messages.
  bool offer_nccl = false;
  absl::Duration rpc_timeout = absl::Seconds(5);  // bounds a heartbeat
  absl::Duration register_retry = absl::Milliseconds(500);
  WorkerMetrics* metrics = nullptr;  // not owned; may be null (SetDevice on registration)
};

class LeaseKeeper {
 public:
  struct Hooks {
    // The id of the job this worker runs now, "" when idle.
    std::function<std::string()> running_job;
    // Stop job `job_id` if this worker still runs it, for `reason` (ABORTED, an echo).
    std::function<void(const std::string& job_id, const std::string& reason)> abort_job;
  };

  // `coordinator` is not owned and outlives the keeper; `session` is the secret it sends.
  LeaseKeeper(LeaseOptions options, CoordinatorClient* coordinator, std::string session,
              Hooks hooks);
  ~LeaseKeeper();  // Stop()

  // Sets the address to register, when it is known only after the server bound its port.
  // Call before Start.
  void SetAdvertiseAddress(const std::string& address);
  // Starts the heartbeat thread: it registers, then keeps the lease.
  void Start();
  // Tells the heartbeat thread to end (it does at its next wake-up) without waiting.
  void RequestStop();
  // RequestStop, waits for the heartbeat thread, and (when registered) tells the
  // coordinator this worker is leaving, best effort within min(rpc_timeout, 2 s): a
  // coordinator that does not answer lets the lease run out. Idempotent.
  void Stop();

  // Whether a WorkerService call presenting `session` comes from the coordinator this
  // worker registered with: UNAUTHENTICATED without one, PERMISSION_DENIED for another.
  absl::Status CheckCoordinatorSession(absl::string_view session) const;

  // The id the coordinator knows this worker by (options.worker_id until registered).
  std::string worker_id() const;

 private:
  void HeartbeatLoop();
  // One registration; on success records the id and interval the coordinator gave.
  absl::Status Register();
  // One heartbeat; false when the coordinator has forgotten this worker (register again).
  bool Heartbeat(int* failures);

  LeaseOptions options_;  // advertise_address is set before Start, then never changes
  CoordinatorClient* const coordinator_;
  const std::string session_;
  const Hooks hooks_;

  mutable Mutex mu_;
  std::condition_variable wake_;  // Stop
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_thread_;  // touched by Start and Stop only
};

}  // namespace baton

#endif  // BATON_WORKER_LEASE_KEEPER_H_
