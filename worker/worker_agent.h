// The worker's core: registration and heartbeats with the coordinator, and running one job
// at a time from the plan the coordinator sends.
//
// Life of a job on a worker:
//   StartJob(plan)  -> a job thread builds the rank's chunks, opens the tensor inbox for the
//                      job, connects a GrpcTransport to the peers, and runs the clock step
//                      after step through a StageExecutor, reporting progress each step;
//                      with spec checkpoint, after every every_steps-th and the last step
//                      it writes its blocks (StageExecutor::SaveCheckpoint), prunes, and
//                      reports the write with the step; with a plan's resume_job_dir it
//                      first loads the newest complete checkpoint at or before resume_step;
//                      a non-finite loss or gradient ends it ("training diverged");
//   at the end      -> ReportResult with the block digests (or the error);
//   AbortJob(id)    -> aborts the transport, so the running step ends within a receive's
//                      wake-up, and the job thread reports the abort (ABORTED: an echo);
//   Stop()          -> the same, reported as UNAVAILABLE "worker W is shutting down", a
//                      root cause the coordinator names instead of the peers' echoes.
// The heartbeat thread renews the lease every heartbeat_interval, re-registers when the
// coordinator has forgotten the worker, and aborts jobs the coordinator lists as unwanted.
//
// Thread safety: all public methods may be called from any thread (gRPC handlers, the
// heartbeat thread); state is guarded by mu_.
#ifndef BATON_WORKER_WORKER_AGENT_H_
#define BATON_WORKER_WORKER_AGENT_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.grpc.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/data/dataset.h"
#include "common/comm/transport.h"
#include "common/transport/rendezvous.h"
#include "common/transport/tensor_inbox.h"
#include "worker/links.h"
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
  // Called (from the job's thread, once) when a job ended with this process's GPU context
  // broken (CudaDeviceFault): nothing can run on the GPU again, so the worker should leave
  // (main.cc shuts it down with exit status 3, for its supervisor to restart it). Until it
  // has, StartJob refuses every job (UNAVAILABLE).
  std::function<void(const absl::Status&)> on_device_fault;
};

class WorkerAgent {
 public:
  // `inbox` (not owned) is the one the worker's TensorService fills.
  WorkerAgent(WorkerOptions options, TensorInbox* inbox);
  ~WorkerAgent();  // Stop()

  // Sets the address peers and the coordinator reach this worker on, when it is known only
  // after the server bound its port. Call before Start.
  void SetAdvertiseAddress(const std::string& address);
  // Starts the heartbeat thread, which registers (retrying until the coordinator answers
  // or Stop is called) and then keeps the lease.
  void Start();
  // Aborts a running job, reports it, and stops the threads. Idempotent.
  void Stop();

  // Whether a WorkerService call presenting `session` (its x-baton-session metadata) comes
  // from the coordinator this worker registered with: UNAUTHENTICATED without one,
  // PERMISSION_DENIED for another.
  absl::Status CheckCoordinatorSession(absl::string_view session) const;

  // WorkerService, as plain calls.
  absl::Status StartJob(const baton::v1::JobPlan& plan);
  absl::Status AbortJob(const std::string& job_id, const std::string& reason);
  baton::v1::WorkerStatus Status() const;

  std::string worker_id() const;

 private:
  struct Job;
  void HeartbeatLoop();
  absl::Status Register();
  void RunJob(std::shared_ptr<Job> job);
  absl::Status RunSteps(Job& job);
  void FinishJob(Job& job, const absl::Status& status);
  // Aborts `job` (once; later calls keep the first reason) and its transport.
  void Abort(Job& job, const absl::Status& why);
  absl::Status StartJobOrThrow(const baton::v1::JobPlan& plan);
  // RESOURCE_EXHAUSTED: this worker ran out of memory while doing `what` for `plan`.
  absl::Status OutOfMemory(const std::string& what, const baton::v1::JobPlan& plan) const;
  // `dir` (a spec's checkpoint.dir or a resume directory) resolved under
  // options.checkpoint_root; INVALID_ARGUMENT naming this worker and the field otherwise.
  absl::StatusOr<std::string> ConfinedCheckpointDir(const std::string& dir) const;
  // Brings up NCCL on the links of `links` that are candidates, agrees with each peer on
  // whether its link uses it (both ends' bring-up verdicts), and turns the others into
  // gRPC links with the reason. Returns the NCCL transport when any link uses it.
  absl::StatusOr<std::unique_ptr<Transport>> BringUpNccl(const baton::v1::JobPlan& plan,
                                                         std::vector<LinkPlan>* links);
  // Joins this rank's data-parallel group (the same rank of every replica) through the
  // peers' TensorService.Rendezvous: NCCL when PlanGroupEngine allows it and every member's
  // NCCL loads, Gloo over TCP otherwise (or the job fails when the spec asks for NCCL).
  // `report` says which engine and why.
  absl::StatusOr<std::unique_ptr<Collective>> JoinReplicaGroup(const baton::v1::JobPlan& plan,
                                                               absl::Duration timeout,
                                                               baton::v1::GroupReport* report);
  std::shared_ptr<grpc::Channel> TensorChannel(const std::string& address);
  // A context for a ClusterService call: the deadline and this process's session secret.
  std::unique_ptr<grpc::ClientContext> ClusterContext() const;

  WorkerOptions options_;  // advertise_address is set before Start, then never changes
  TensorInbox* const inbox_;
  std::unique_ptr<baton::v1::ClusterService::Stub> cluster_;
  // Chosen at start, sent with every registration (RegisterWorkerRequest.session_token):
  // the secret the coordinator and this worker prove themselves to each other with.
  const std::string session_;

  mutable std::mutex mu_;
  std::condition_variable wake_;  // Stop, job end
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);  // the running job, if any
  // Tensor channels by peer address, kept across jobs so a peer is connected once.
  std::mutex channels_mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(channels_mu_);
  std::thread heartbeat_thread_;
  std::thread job_thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_AGENT_H_
