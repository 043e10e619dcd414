// WorkerRegistry: the workers the coordinator knows, with leases.
//
// A worker registers (getting an id "w-N" unless it names itself) and then renews its lease
// by heartbeats. A lease not renewed within `lease_ttl` expires at the next ExpireLeases():
// the worker is DEAD and must register again (its Heartbeat answers known=false). Dead
// workers stay listed for a while (ListWorkers shows them) and are then forgotten.
//
// Idle workers are handed out in registration order (a re-registration moves a worker to
// the back). A worker whose last heartbeat reported a job the coordinator did not give it
// (say, one from before a coordinator restart, not yet aborted) is not handed out until a
// heartbeat reports it free.
//
// Time comes from an injectable clock so tests can move it.
//
// Thread-safe: one mutex of its own guards every entry, so that a heartbeat that settles
// nothing else (HeartbeatAndCheck) renews its lease without the coordinator's lock. The
// coordinator calls the rest under its own lock too (lock order: the coordinator's, then
// this one's), so its decisions see the registry unchanged while it holds its lock, but
// for leases renewed and jobs reported by such heartbeats.
#ifndef BATON_COORDINATOR_WORKER_REGISTRY_H_
#define BATON_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/base/thread_annotations.h"
#include "baton/v1/cluster.pb.h"
#include "common/core/mutex.h"

namespace baton {

using ClockFn = std::function<absl::Time()>;

class WorkerRegistry {
 public:
  // `clock` null means absl::Now. Dead workers are forgotten `dead_retention` after they
  // died.
  WorkerRegistry(absl::Duration lease_ttl, ClockFn clock,
                 absl::Duration dead_retention = absl::Minutes(10));

  struct Registration {
    baton::v1::WorkerInfo worker;  // the new entry, IDLE
    // Live entries this registration replaced: the same worker id at the same address (the
    // process restarted), or another id at the same address (restarted under a new name).
    // They are gone from the registry; if one was BUSY its job lost a rank.
    std::vector<baton::v1::WorkerInfo> replaced;
  };
  // `identity` is the common name of the caller's verified certificate ("" without mutual
  // TLS); it is recorded (WorkerInfo.identity) and every later call of this worker is
  // checked against it (CheckSession).
  // INVALID_ARGUMENT naming the field for an empty or malformed address or worker id.
  // ALREADY_EXISTS when the id belongs to a live worker at another address, or the id or
  // the address belongs to a live worker of another identity: a stranger cannot take over
  // a worker's name or address (and its job) by registering it; a worker that really moved
  // registers once the old lease ran out (its register loop retries).
  absl::StatusOr<Registration> Register(const baton::v1::RegisterWorkerRequest& request,
                                        const std::string& identity = "");

  // Whether a call naming `worker_id` comes from the process that registered it: OK when
  // `session` is its session secret and `identity` its identity, and also when the worker is
  // unknown or dead (the call then tells it to register again). PERMISSION_DENIED for a
  // live worker's id with another session or identity (UNAUTHENTICATED without a session).
  absl::Status CheckSession(const std::string& worker_id, const std::string& session,
                            const std::string& identity) const;
  // The session secret of a live worker ("" if unknown), for the coordinator's calls to it.
  std::string SessionOf(const std::string& worker_id) const;

  // Renews the lease and records the job the worker says it runs ("" for none). False when
  // the worker is unknown or dead: it must register again.
  bool Heartbeat(const std::string& worker_id, const std::string& reported_job_id);

  // Heartbeat, and whether that settles it: the worker is live and reports what the
  // registry knows it runs (nothing while IDLE; while BUSY, the job it was marked busy with
  // and is still wanted for: see Unwant). Otherwise the caller decides what to tell it
  // (abort the job, free the worker). `previous` is its last heartbeat before this one.
  struct Beat {
    bool known = false;
    bool settled = false;
    absl::Time previous;  // when known
  };
  Beat HeartbeatAndCheck(const std::string& worker_id, const std::string& reported_job_id);
  // The coordinator no longer expects the BUSY worker to run `job_id` (it is stopping it, or
  // the rank ended): its heartbeats reporting the job are not settled by HeartbeatAndCheck
  // any more. The worker stays BUSY until MarkIdle.
  void Unwant(const std::string& worker_id, const std::string& job_id);

  // Workers whose lease ran out since the last call, now DEAD (as they were just before:
  // state and job_id tell what they were doing). Also forgets long-dead workers.
  std::vector<baton::v1::WorkerInfo> ExpireLeases();

  // Live IDLE workers free to take a job, in registration order.
  std::vector<baton::v1::WorkerInfo> IdleWorkers() const;
  // Number of live workers (idle or busy).
  int LiveCount() const;

  // IDLE -> BUSY running `job_id`. FAILED_PRECONDITION unless the worker is live and idle.
  absl::Status MarkBusy(const std::string& worker_id, const std::string& job_id);
  // BUSY -> IDLE, only if the worker still runs `job_id` (a late release of an old job does
  // not free a worker that has moved on). Returns whether it changed anything.
  bool MarkIdle(const std::string& worker_id, const std::string& job_id);

  // The worker said it is leaving (shutting down): DEAD now. Returns it as it was just
  // before (state and job_id tell what it was doing); nullopt when unknown or already dead.
  std::optional<baton::v1::WorkerInfo> Leave(const std::string& worker_id);

  std::optional<baton::v1::WorkerInfo> Get(const std::string& worker_id) const;
  // Every worker, live ones in registration order, then the dead.
  std::vector<baton::v1::WorkerInfo> List() const;

  absl::Duration lease_ttl() const { return lease_ttl_; }

 private:
  struct Entry {
    baton::v1::WorkerInfo info;
    int64_t order = 0;  // registration order
    absl::Time lease_expiry;
    absl::Time died;              // when DEAD
    std::string reported_job_id;  // from the last heartbeat
    std::string session;          // secret shared with the worker since its registration
    bool wanted = false;          // BUSY, and its job still expects it to run (Unwant)
  };
  absl::Time Now() const { return clock_(); }
  std::vector<const Entry*> Sorted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration lease_ttl_;
  const absl::Duration dead_retention_;
  const ClockFn clock_;
  mutable Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_WORKER_REGISTRY_H_
