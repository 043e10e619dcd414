// JobRun: one job's life on a worker, from the plan the coordinator sent to the result to
// report. It knows neither the coordinator nor the worker around it: what it needs comes
// in JobRunOptions (the tensor inbox, the rendezvous box, how to reach a peer), what it
// produces goes out through a ProgressSink (each step) and Run's Outcome (the end).
//
// Life of a run:
//   Create(plan)  -> checks that this worker may and can run the plan (checkpoint and
//                    resume directories under the checkpoint root, a working GPU context,
//                    memory for a CPU job, a well-formed clock) and allocates everything
//                    the plan's size decides; nothing outside the run changes yet;
//   Open()        -> the worker's inbox accepts the job's tensors, its rendezvous box the
//                    members' values (before StartJob answers: any peer may send once
//                    every rank has answered);
//   Run(sink)     -> on the calling thread (the job's): connects a GrpcTransport to the
//                    peers (NCCL on the links both ends brought up), joins the data-
//                    parallel group, builds the rank's chunks in a StageExecutor, with a
//                    plan's resume_job_dir loads the newest complete checkpoint at or
//                    before resume_step, and runs the clock step after step; each step's
//                    report goes to the sink; with spec checkpoint, after every
//                    every_steps-th and the last step the blocks are written
//                    (StageExecutor::SnapshotCheckpoint, then a CheckpointWriter), and the
//                    writes finished are reported with the step; a non-finite loss ends it
//                    ("training diverged"); a report answered kCheckpointAndStop
//                    (preemption) writes that step's checkpoint and ends the run there,
//                    its result saying so. At the end the inbox and the attempt's
//                    rendezvous values are closed, and the Outcome carries the block
//                    digests, or the error and its FailureCause;
//   Abort(why)    -> from any thread: aborts the transport, so the running step ends
//                    within a receive's wake-up, and sets the flag the steps and
//                    evaluations read before every micro-batch (StageExecutorOptions::stop),
//                    the checkpoint writes every 8 MiB, and Run between its phases; Run
//                    then ends with why's code and "aborted: <why>" (ABORTED: an echo of a
//                    failure elsewhere; UNAVAILABLE: a root cause, the worker shutting down).
//
// Thread safety: Abort, plan, steps_done and aborted from any thread; Open and Run from
// one thread, once each, in that order. abort_status_ and transport_ are guarded by mu_;
// the rest of the run's state belongs to the thread in Run.
#ifndef BATON_WORKER_JOB_RUN_H_
#define BATON_WORKER_JOB_RUN_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/data/dataset.h"
#include "common/comm/transport.h"
#include "common/transport/rendezvous.h"
#include "common/transport/tensor_inbox.h"
#include "common/core/mutex.h"
#include "worker/peer_setup.h"
#include "worker/worker_metrics.h"

namespace baton {

struct JobRunOptions {
  std::string worker_id;  // names this worker in errors
  // The inbox the worker's TensorService fills; not owned; required.
  TensorInbox* inbox = nullptr;
  // Where peers' TensorService.Rendezvous messages land; not owned; may be null (then no
  // link uses NCCL, and a data-parallel plan fails).
  RendezvousBox* rendezvous = nullptr;
  // How the run reaches a peer's TensorService; required.
  ChannelFactory channels;
  int64_t inbox_bytes = int64_t{512} << 20;  // bound of received, not yet consumed tensors
  // Bounds an NCCL bring-up; past it a link falls back to gRPC (or the job fails, when its
  // spec asks for NCCL).
  absl::Duration nccl_init_timeout = absl::Seconds(30);
  // The directory checkpoints must lie under; empty: any (tests).
  std::string checkpoint_root;
  DataAccess data;                   // where text files may be read from
  WorkerMetrics* metrics = nullptr;  // not owned; may be null
  int64_t memory_bytes = 0;          // what the worker offers jobs, for out-of-memory errors
  // Its device's peaks (DeviceInfo.peak_flops, .peak_flops_bf16), for MFU.
  double peak_flops = 0;
  double peak_flops_bf16 = 0;
};

// What the run does after a step's report.
enum class StepAnswer {
  kContinue,
  // Preempted: write this step's checkpoint (when the spec checkpoints and this rank
  // writes, unless one was just taken), wait for every write, and end the run; its result
  // says stopped_after_step and carries the writes.
  kCheckpointAndStop,
};

// Receives each step's report of a JobRun, on the run's thread, in step order. The next
// step starts when OnStep returns, as its answer says; OnStep may call JobRun::Abort.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // `report`: job_id, rank (global), attempt, step, loss (the last stage's rank), timing,
  // trace, the checkpoint writes finished since the last report; the first step's also
  // the links, the data-parallel group and what a resume started from. worker_id is the
  // sink's to fill.
  virtual StepAnswer OnStep(baton::v1::ReportProgressRequest report) = 0;
};

// What the coordinator calls a worker's rank: replica * num_ranks + rank (just the rank
// without data parallelism).
int GlobalRank(const baton::v1::JobPlan& plan);

// RESOURCE_EXHAUSTED: worker `worker_id` (offering `memory_bytes`) ran out of memory while
// doing `what` for `plan`.
absl::Status OutOfMemoryError(const std::string& worker_id, int64_t memory_bytes,
                              const std::string& what, const baton::v1::JobPlan& plan);

// What kind of failure `s` is, for the coordinator's decision to recover or fail; `aborted`:
// the run was told to stop (JobRun::Abort).
baton::v1::FailureCause RunFailureCause(const absl::Status& s, bool aborted);

class JobRun {
 public:
  struct Outcome {
    absl::Status status;
    // job_id, rank (global), attempt; on success the block digests, else the error
    // ("CODE: message") and its cause. worker_id is the caller's to fill.
    baton::v1::ReportResultRequest report;
  };

  // INVALID_ARGUMENT for a plan this worker may not run (a checkpoint or resume directory
  // outside the root or not usable, a malformed clock); UNAVAILABLE when the GPU context
  // is broken (the worker is leaving); RESOURCE_EXHAUSTED when a CPU job needs more memory
  // than the process can allocate now. May throw std::bad_alloc (OutOfMemoryError).
  static absl::StatusOr<std::unique_ptr<JobRun>> Create(const baton::v1::JobPlan& plan,
                                                        JobRunOptions options);
  ~JobRun();

  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  // Opens the inbox and the rendezvous box for the job. Once, before Run.
  void Open();
  // Runs the job to its end (see above). Once, after Open.
  Outcome Run(ProgressSink* sink);
  // Aborts the run for `why` (the first reason is kept) and its transport. Idempotent.
  void Abort(const absl::Status& why);

  const baton::v1::JobPlan& plan() const { return plan_; }
  int64_t steps_done() const { return steps_done_.load(); }
  bool aborted() const { return aborted_.load(); }

 private:
  struct Pipeline;  // what Run builds, torn down in order when it ends

  JobRun(const baton::v1::JobPlan& plan, JobRunOptions options);
  // The checks and allocations of Create.
  absl::Status Admit();
  // `dir` resolved under options.checkpoint_root; INVALID_ARGUMENT naming this worker.
  absl::StatusOr<std::string> ConfinedCheckpointDir(const std::string& dir) const;

  // The phases of Run, in order; each fills its part of `p`.
  absl::Status RunSteps(ProgressSink* sink);
  absl::Status Prepare(Pipeline& p);    // the spec, the clock, the block ranges
  absl::Status Connect(Pipeline& p);    // gRPC and NCCL links, routed by peer
  absl::Status JoinGroup(Pipeline& p);  // the data-parallel group, if any
  absl::Status Build(Pipeline& p);      // the StageExecutor with this rank's chunks
  absl::Status Resume(Pipeline& p);     // a checkpoint's weights, with resume_job_dir
  absl::Status Train(Pipeline& p, ProgressSink* sink);  // the step loop
  // One step: its report, or why the job ends.
  absl::StatusOr<baton::v1::ReportProgressRequest> Step(Pipeline& p, int64_t step);
  // After step `step`: a snapshot when one is due (or `stopping`: the run ends after it),
  // and the finished writes into `writes` (all of them, waited for, after the last step
  // and when stopping).
  absl::Status Checkpoint(Pipeline& p, int64_t step, bool stopping,
                          google::protobuf::RepeatedPtrField<baton::v1::CheckpointWrite>* writes);
  // Stops routing Abort to the transport (before it goes).
  void DetachTransport();
  // The result report for `status`.
  baton::v1::ReportResultRequest ResultReport(const absl::Status& status) const;

  const baton::v1::JobPlan plan_;
  const JobRunOptions options_;
  // Made by Create, handed to the inbox and the rendezvous box by Open.
  InboxPlan inbox_plan_;
  std::vector<std::string> members_;

  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> steps_done_{0};
  Mutex mu_;
  // Why the run was aborted: ABORTED when told to by the coordinator or a peer (an echo
  // of a failure elsewhere), UNAVAILABLE when this worker is shutting down (a root cause).
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;  // while Run has one
  // The block digests, once every step ran. Run's thread only.
  baton::v1::ReportResultRequest digests_;
  // What Run is doing ("building its blocks (0-7)", "training step 12"), for an
  // out-of-memory error to name. Run's thread only.
  std::string phase_ = "starting";
};

}  // namespace baton

#endif  // BATON_WORKER_JOB_RUN_H_
