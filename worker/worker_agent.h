// The worker's core, the object WorkerServiceImpl (service.h) is a thin adapter over. It
// wires three pieces that do not know each other:
//
//   LeaseKeeper (lease_keeper.h)        registration, heartbeats and the session secret;
//                                       it asks the core which job runs and tells it
//                                       which to abort, through two hooks;
//   JobRun (job_run.h)                  one job's life, from the plan to its outcome; it
//                                       gets the inbox, the rendezvous box and a channel
//                                       factory, and yields each step's report to a sink;
//   CoordinatorClient                   the calls to the coordinator's ClusterService
//   (coordinator_client.h)              (gRPC in the product, a fake in tests).
//
// The core runs one job at a time:
//   StartJob(plan)  -> JobRun::Create checks the plan; the core refuses it when busy,
//                      else opens the run (inbox, rendezvous) and starts the job thread,
//                      which runs it, sending each step's report to the coordinator
//                      (ReportProgress; an answer without keep_running aborts the run);
//   at the end      -> the worker is idle again (Status, heartbeats), then ReportResult
//                      with the outcome (retried while the coordinator is UNAVAILABLE, up
//                      to ten times, half a second apart, until Stop);
//   AbortJob(id)    -> JobRun::Abort (ABORTED: an echo), then a bounded wait for the job
//                      thread to end, answering whether it did;
//   Stop()          -> the same, as UNAVAILABLE "worker W is shutting down", a root cause
//                      the coordinator names instead of the peers' echoes; then the lease
//                      keeper says goodbye.
// A job that ends with this process's GPU context broken calls on_device_fault.
//
// Thread safety: all public methods may be called from any thread (gRPC handlers, the
// heartbeat thread); stopping_, job_ and job_thread_ are guarded by mu_.
#ifndef BATON_WORKER_WORKER_AGENT_H_
#define BATON_WORKER_WORKER_AGENT_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "baton/v1/worker.pb.h"
#include "common/data/dataset.h"
#include "common/transport/rendezvous.h"
#include "common/transport/tensor_inbox.h"
#include "common/core/mutex.h"
#include "worker/channel_cache.h"
#include "worker/coordinator_client.h"
#include "worker/job_run.h"
#include "worker/lease_keeper.h"
#include "worker/worker_metrics.h"

namespace baton {

struct WorkerOptions {
  std::string coordinator_address;  // host:port
  std::string advertise_address;    // host:port peers and the coordinator reach us on
  std::string worker_id;            // empty: the coordinator assigns one
  baton::v1::DeviceInfo device;
  int64_t inbox_bytes = int64_t{512} << 20;  // bound of received, not yet consumed tensors
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration register_retry = absl::Milliseconds(500);
  WorkerMetrics* metrics = nullptr;  // not owned; may be null
  // Where peers' TensorService.Rendezvous messages land (NCCL bring-up); not owned; may be
  // null (then no link uses NCCL).
  RendezvousBox* rendezvous = nullptr;
  // Bounds an NCCL bring-up (communicators up, handshakes and verdicts exchanged); past it
  // a link falls back to gRPC (or the job fails, when its spec asks for NCCL).
  absl::Duration nccl_init_timeout = absl::Seconds(30);
  // The directory jobs' checkpoints must lie under (--checkpoint_root): StartJob refuses a
  // plan whose checkpoint.dir or resume directory resolves elsewhere. Empty: any (tests).
  std::string checkpoint_root;
  // Where jobs' text files may be read from (--data_root), and their size bound.
  DataAccess data;
  // The cluster's join token (--join_token_file), sent when registering; empty: none.
  std::string join_token;
  // How long WorkerService.AbortJob waits for the aborted job's thread to end before it
  // answers that the job is still stopping (the coordinator then keeps the worker busy
  // until a heartbeat reports it free). Under the coordinator's abort deadline.
  absl::Duration abort_wait = absl::Seconds(1);
  // Called (from the job's thread, once) when a job ended with this process's GPU context
  // broken (CudaDeviceFault): nothing can run on the GPU again, so the worker should leave
  // (main.cc shuts it down with exit status 3, for its supervisor to restart it). Until it
  // has, StartJob refuses every job (UNAVAILABLE).
  std::function<void(const absl::Status&)> on_device_fault;
  // How a job reaches a peer's TensorService (cached per address); empty:
  // MakeTensorChannel.
  ChannelFactory tensor_channels;
};

class WorkerAgent {
 public:
  // Talks to the coordinator at options.coordinator_address over gRPC, with a session
  // secret chosen here. `inbox` (not owned) is the one the worker's TensorService fills.
  WorkerAgent(WorkerOptions options, TensorInbox* inbox);
  // Talks to the coordinator through `coordinator`, which sends `session` with its calls.
  WorkerAgent(WorkerOptions options, TensorInbox* inbox,
              std::unique_ptr<CoordinatorClient> coordinator, std::string session);
  ~WorkerAgent();  // Stop()

  // Sets the address peers and the coordinator reach this worker on, when it is known only
  // after the server bound its port. Call before Start.
  void SetAdvertiseAddress(const std::string& address);
  // Starts the lease keeper, which registers (retrying until the coordinator answers or
  // Stop is called) and then keeps the lease.
  void Start();
  // Aborts a running job, reports it, and stops the threads. Idempotent.
  void Stop();

  // LeaseKeeper::CheckCoordinatorSession.
  absl::Status CheckCoordinatorSession(absl::string_view session) const;

  // WorkerService, as plain calls.
  absl::Status StartJob(const baton::v1::JobPlan& plan);
  // Aborts job `job_id` if it runs here, then waits up to `wait` for its thread to end.
  // Returns whether no thread of that job runs here any more (true at once when it did not
  // run here): only then may the coordinator take this worker for idle.
  bool AbortJob(const std::string& job_id, const std::string& reason, absl::Duration wait);
  // BUSY from StartJob until the job's run has ended (its thread may still be reporting the
  // result: StartJob joins it), IDLE otherwise.
  baton::v1::WorkerStatus Status() const;
  absl::Duration abort_wait() const { return options_.abort_wait; }

  std::string worker_id() const;

 private:
  // Over gRPC, with `session` as the secret.
  WorkerAgent(WorkerOptions options, TensorInbox* inbox, const std::string& session);
  absl::Status StartJobOrThrow(const baton::v1::JobPlan& plan);
  // What a JobRun of this worker gets.
  JobRunOptions RunOptions();
  // The job thread: runs `run`, reports its outcome, and frees the worker.
  void RunJob(std::shared_ptr<JobRun> run);
  // ReportResult with `outcome`, retried while the coordinator is unreachable.
  void ReportResult(const JobRun& run, const JobRun::Outcome& outcome);
  // The id of the running job, "" when idle (LeaseKeeper::Hooks::running_job).
  std::string RunningJob() const;

  const WorkerOptions options_;
  TensorInbox* const inbox_;
  const std::unique_ptr<CoordinatorClient> coordinator_;
  ChannelCache channels_;
  LeaseKeeper lease_;  // uses coordinator_: declared after it

  mutable Mutex mu_;
  std::condition_variable wake_;  // Stop; a job thread freeing the worker (AbortJob)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<JobRun> job_ ABSL_GUARDED_BY(mu_);  // the running job, if any
  std::thread job_thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_AGENT_H_
