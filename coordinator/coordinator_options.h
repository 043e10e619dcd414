// What a Coordinator is built with (CoordinatorOptions, filled from flags by main.cc) and
// what a ClusterService caller presents (WorkerCaller), with the checks on each that need
// no coordinator state (tests: coordinator_options_test.cc).
#ifndef BATON_COORDINATOR_COORDINATOR_OPTIONS_H_
#define BATON_COORDINATOR_COORDINATOR_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/security.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/quotas.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"

namespace baton {

struct CoordinatorOptions {
  // The SQLite job store; ":memory:" for a throw-away one.
  std::string db_path = "baton-coordinator.db";
  // Workers heartbeat at least this often ...
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // ... and are dead when a lease is not renewed for this long. Must exceed the interval.
  absl::Duration lease_ttl = absl::Seconds(5);
  // Deadline of every receive on the workers (JobPlan.recv_timeout): the floor a job's
  // planned step raises (PlannedReceiveTimeout).
  absl::Duration recv_timeout = absl::Seconds(60);
  // Deadlines of the StartJob and AbortJob calls to workers.
  absl::Duration start_timeout = absl::Seconds(5);
  absl::Duration abort_timeout = absl::Seconds(2);
  // A worker still winding down its previous job (it reported its result, or returned from
  // AbortJob, but has not quite let go) answers StartJob with FAILED_PRECONDITION; the call
  // is retried, with backoff, for this long before the job fails.
  absl::Duration busy_retry = absl::Seconds(3);
  // A rank whose error is ABORTED usually echoes another rank's failure; the job waits this
  // long for a root-cause error (any other code) before failing with the echo.
  absl::Duration root_cause_wait = absl::Milliseconds(500);
  // steps_done/last_loss reach the store at most this often (and at every state change).
  absl::Duration progress_persist_interval = absl::Seconds(1);
  // Time for leases, time stamps and retries; null means absl::Now. Tests pass a fake.
  ClockFn clock;
  // Waits between StartJob retries; null means absl::SleepFor. Tests pass one that
  // advances their fake clock, so no test waits for real time.
  std::function<void(absl::Duration)> sleep;
  // null: a GrpcWorkerClient.
  std::shared_ptr<WorkerClient> worker_client;
  // Log job state changes and worker events to stderr ("coordinator: job-000001 RUNNING:
  // all 2 ranks started").
  bool log = true;
  // false (tests): no background loop and no threads: the test calls Tick(), and every call
  // to a worker runs on the calling thread (after the lock is released).
  bool background = true;
  // Where queue waits, missed heartbeats and lease expirations are counted; not owned, may
  // be null. Create() points its state gauges at this coordinator (and Stop() away).
  CoordinatorMetrics* metrics = nullptr;
  // Per-user quotas and priority bounds (quotas.h); not owned, may be null (DefaultLimits).
  const QuotaBook* quotas = nullptr;
  // How long the first job in line that does not fit may be passed by jobs behind it before
  // it holds a reservation (queue_policy.h).
  absl::Duration reserve_after = absl::Minutes(5);
  // Whether a higher-priority job that does not fit may preempt running lower-priority jobs
  // that write checkpoints (queue_policy.h, "Preemption").
  bool preempt = true;
  // A recovering or preempted job whose previous workers answered their abort "still
  // stopping" waits this long at most for them to be freed (by a heartbeat that reports no
  // job) before it is placed on fewer stages.
  absl::Duration stop_grace = absl::Seconds(30);
  // A job is not preempted until its attempt has run this long (since RUNNING) and trained
  // this many steps: one just resumed keeps its workers a while, so preemptions cannot
  // churn it. 0: no bound.
  absl::Duration preempt_min_run = absl::Minutes(1);
  int64_t preempt_min_steps = 1;
  // A job that preempted others and then ended without training a step (it failed to
  // start, or was cancelled first) bars its user's jobs from preempting for this long.
  absl::Duration preempt_penalty = absl::Minutes(10);
  // Called under the lock after every placement round with its duration and the jobs left
  // waiting (bench/control_plane_bench.cc); keep it short. May be empty.
  std::function<void(absl::Duration, size_t)> round_observer;
  // Action timelines (batonctl trace) are kept for each job's latest this many steps.
  int64_t trace_steps = 200;
  // Directories a spec's data.text.path must lie under (after symlinks, as far as this
  // host can resolve them), refused at submit otherwise; empty: any (tests). The workers
  // check again with their own --data_root.
  std::vector<std::string> data_roots;
  // The workers' bound on one text file (their --data_max_mb): a data.text.path this host
  // sees that is larger, or is not a regular file (a FIFO, a device), is refused at submit
  // (CheckDataFileAtSubmit); so are init.from_hf files that are not regular.
  int64_t max_data_file_bytes = int64_t{1} << 30;
  // The directory a spec's checkpoint.dir must lie under (a relative one is taken under
  // it; paths are resolved as data paths are), refused at submit otherwise and rewritten to
  // the resolved absolute path; empty: any (tests). The workers check again with their own
  // --checkpoint_root. main.cc: CheckpointRootFromFlag.
  std::string checkpoint_root;
  // Who may register as a worker. require_worker_certificate (set when the coordinator
  // verifies client certificates against the cluster CA): only callers whose certificate
  // verified. join_token non-empty: only callers sending it as x-baton-join-token. With
  // neither, anyone who reaches the port (the loopback demo).
  bool require_worker_certificate = false;
  std::string join_token;
  // With require_worker_certificate, the certificate must also carry a URI SAN starting
  // with this: what tells a worker's certificate from a user's signed by the same CA.
  std::string worker_uri_prefix = kWorkerUriPrefix;
  // ExportJob calls streaming at once, in all and per caller; one more is refused at once
  // with RESOURCE_EXHAUSTED. Each holds a server thread, one open block file and one piece
  // (block_stream.h) while it streams, and reads the whole checkpoint twice (the hash check,
  // then the export).
  int max_exports = 4;
  int max_exports_per_caller = 2;
};

// What a ClusterService call presents besides its request: its verified certificate's
// common name ("" without), the join token and the session secret it sent ("" if not),
// and the certificate's URI SANs.
struct WorkerCaller {
  std::string identity;
  std::string join_token;
  std::string session;
  std::vector<std::string> uris;
};

// INVALID_ARGUMENT, naming the flag, for durations and bounds a coordinator cannot run
// with (a heartbeat interval not positive, a lease not longer than it, ...); OK otherwise.
absl::Status ValidateCoordinatorOptions(const CoordinatorOptions& options);

// Whether `caller` may register as a worker under `options`: UNAUTHENTICATED when a
// certificate or the join token is required and missing; PERMISSION_DENIED for a wrong
// join token, or a certificate without the worker URI SAN (options.worker_uri_prefix: a
// user's certificate).
absl::Status CheckWorkerCredentials(const CoordinatorOptions& options, const WorkerCaller& caller);

}  // namespace baton

#endif  // BATON_COORDINATOR_COORDINATOR_OPTIONS_H_
