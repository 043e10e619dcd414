// The coordinator's core: jobs, workers, placement and progress, behind methods that mirror
// the JobService and ClusterService RPCs (coordinator/service.h only converts statuses).
//
// The design (job states and every history reason, the queue, failure handling and
// recovery, progress, checkpoints and resume, what workers must do) is in docs/cluster.md,
// "The coordinator's core". The parts, each tested alone:
//   job_admission.h   SubmitJob's checks that need no state, before the lock (pure)
//   active_job.h      an active job and its rank slots (plain data)
//   job_events.h      one function per event: the job's Decision, a list of effects (pure)
//   job_lifecycle.h   the state transitions and the fail-or-recover decision (pure)
//   job_tallies.h     checkpoint, resume, progress, link, group and result tallies (pure)
//   effects_runner.h  the StartJob/AbortJob calls the decisions ask for
//   job_watch.h       a job's event log and its WatchJob subscriptions
//   checkpoint_dirs.h who may write checkpoints where under the checkpoint root
//   placement_round.h the pure parts of a placement round
//   job_queries.h     traces and history pages assembled from stored jobs (pure)
//   coordinator_options.h  the options, and the option and worker-credential checks
//   worker_registry.h, placement.h, job_store.h
// This class keeps the lock, the loop, placement rounds and the events (coordinator.cc):
// an event is decided under mu_ by job_events.h, the Decision carried out by Apply (the
// store, watchers, registry, queue, metrics), and the calls to make handed to the
// EffectsRunner. Its read side is coordinator_queries.cc, the workers' registrations and
// heartbeats coordinator_workers.cc.
//
// CONTRACT
//  - Every state change appends a StateChange (time, reason) to Job.history, is written to
//    the job store before anyone can observe it, and is sent to watchers.
//  - No RPC to a worker is ever made under mu_. Worker calls' answers come back under mu_,
//    and a job whose state changed meanwhile is re-checked then.
//  - A worker is never handed a new job while the coordinator still expects it to be
//    stopping the old one, nor listed IDLE: it is freed only once its AbortJob answered that
//    the job stopped there, its result report came, its lease expired, or a heartbeat said
//    it runs nothing.
//  - Thread-safe. LOCKING: one mutex (mu_) guards the active jobs and the queue and the
//    decisions on the registry (which has a lock of its own inside, so that a heartbeat
//    that only renews a lease takes that alone), and is held while writing to the store
//    (SQLite has its own lock inside JobStore). Watchers wait on a per-job JobEventLog with its own
//    mutex (lock order: mu_ before a log's mutex), never on mu_. A background loop, woken by events
//    and at least every heartbeat_interval/2, expires leases and places queued jobs; the worker
//    calls it triggers run on the EffectsRunner's threads, which Stop() joins.
#ifndef BATON_COORDINATOR_COORDINATOR_H_
#define BATON_COORDINATOR_COORDINATOR_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.pb.h"
#include "baton/v1/jobs.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/checkpoint/block_stream.h"
#include "common/core/mutex.h"
#include "common/plan/planner.h"
#include "common/rpc/security.h"
#include "coordinator/active_job.h"
#include "coordinator/call_caps.h"
#include "coordinator/checkpoint_dirs.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/effects_runner.h"
#include "coordinator/job_admission.h"
#include "coordinator/job_events.h"
#include "coordinator/job_lifecycle.h"
#include "coordinator/job_store.h"
#include "coordinator/job_tallies.h"
#include "coordinator/job_watch.h"
#include "coordinator/placement.h"
#include "coordinator/queue_policy.h"
#include "coordinator/quotas.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"

namespace baton {

class Coordinator {
 public:
  // The most steps one GetJobHistory page holds (and its default): about 40 bytes each.
  static constexpr int kMaxHistoryPageSize = 10000;

  // Opens the store, recovers it (QUEUED jobs are queued again; PLACING/RUNNING ones become
  // FAILED "coordinator restarted while the job was running"), and starts the background
  // loop (options.background). INVALID_ARGUMENT for bad durations, naming the flag.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options);
  ~Coordinator();  // Stop()
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Stops the loop, waits for in-flight worker calls, ends every watch (UNAVAILABLE).
  // Jobs stay as they are in the store. Idempotent.
  void Stop();

  // ---- JobService ----
  // Validates (ValidateAndDefaultJobSpec, then the pipeline as placement will build it):
  // INVALID_ARGUMENT whose message starts with the field path. A non-empty submission_id
  // makes it idempotent: the same id with the same (defaulted) spec returns the first job;
  // with a different spec, ALREADY_EXISTS.
  // `submitted_by` is recorded in Job.submitted_by (the caller's token name). A caller who
  // is not `admin` may resume only from its own jobs (PERMISSION_DENIED naming
  // resume_from.job_id), and may not name a checkpoint.dir inside another user's job's
  // checkpoint directory, or one containing it (PERMISSION_DENIED naming checkpoint.dir).
  // Quotas (options.quotas, for the caller's name and role: admin or submitter): a priority
  // above the role's max_priority is PERMISSION_DENIED, a submission beyond max_queued
  // jobs waiting RESOURCE_EXHAUSTED, each naming the limit.
  absl::StatusOr<baton::v1::Job> SubmitJob(const baton::v1::SubmitJobRequest& request,
                                           const std::string& submitted_by = "anonymous",
                                           bool admin = true);
  // NOT_FOUND for unknown ids.
  absl::StatusOr<baton::v1::Job> GetJob(const std::string& job_id);
  // Newest first; page_size 0 means 50, at most 1000.
  absl::StatusOr<baton::v1::ListJobsResponse> ListJobs(const baton::v1::ListJobsRequest& request);
  // QUEUED: CANCELLED at once. RUNNING: CANCELLED; every worker still running a rank is
  // sent AbortJob (in parallel, abort_timeout each) and is idle when this returns if it
  // answered that the job stopped there (one still stopping, or unreachable, stays busy
  // until a heartbeat reports it free or its lease runs out). PLACING:
  // the same, except that the workers are freed only once their StartJob calls returned
  // (and were answered with another AbortJob). A job already in a terminal state is
  // returned unchanged, not an error: cancelling is idempotent and the result tells how the
  // job ended. NOT_FOUND if unknown.
  absl::StatusOr<baton::v1::Job> CancelJob(const baton::v1::CancelJobRequest& request);
  // Sets a QUEUED, PREEMPTED (or RECOVERING) job's JobSpec.priority; the queue reorders at once.
  // FAILED_PRECONDITION once the job runs or ended, NOT_FOUND for unknown ids. (Admins only:
  // the service checks.)
  absl::StatusOr<baton::v1::Job> SetJobPriority(const std::string& job_id, int32_t priority);
  // NOT_FOUND if unknown.
  absl::StatusOr<std::unique_ptr<JobWatch>> WatchJob(const std::string& job_id);
  baton::v1::ListWorkersResponse ListWorkers();
  // Every rank's action timeline of one step (0: the latest step all ranks reported).
  // NOT_FOUND for unknown jobs, and for steps without a trace, naming the kept steps.
  absl::StatusOr<baton::v1::JobTrace> GetJobTrace(const baton::v1::GetJobTraceRequest& request);
  // The job's per-step loss and throughput from request.from_step (0 means 1) on, in step
  // order, at most request.page_size steps (0 means kMaxHistoryPageSize, and larger ones are
  // cut to it); next_from_step is the step after the page's last when stored steps follow,
  // else 0. A step never reported has no row. NOT_FOUND for unknown jobs; INVALID_ARGUMENT
  // naming the field for an empty job_id or a negative from_step or page_size.
  absl::StatusOr<baton::v1::JobHistory> GetJobHistory(
      const baton::v1::GetJobHistoryRequest& request);
  // The weights of the job's complete checkpoint after request.step (0: the newest) as one
  // safetensors file, streamed (WeightsExport, common/checkpoint/block_stream.h: the bytes
  // ExportWeights returns, in pieces read as they are asked for), and the step and step
  // directory it came from. The checkpoint's files are checked against their SHA-256 before
  // this returns, and again as they are streamed (a file changed since: DATA_LOSS from
  // WeightsExport::Next). NOT_FOUND for unknown jobs; FAILED_PRECONDITION when the job has
  // no checkpoint or this coordinator cannot read its directory (naming it);
  // RESOURCE_EXHAUSTED, before anything is read, when options.max_exports exports are under
  // way, or max_exports_per_caller of `caller`'s (CallCaps); the checkpoint errors
  // otherwise. Who may: the service checks (the submitter or an admin). Takes mu_ only to
  // look the job up: reading and hashing run without it.
  struct Export {
    CallCaps::Slot slot;  // the export's place under the caps, given back when destroyed
    int64_t step = 0;
    std::string dir;
    std::unique_ptr<WeightsExport> weights;
  };
  absl::StatusOr<std::unique_ptr<Export>> ExportJob(const baton::v1::ExportJobRequest& request,
                                                    const std::string& caller = "anonymous");
  // Exports under way (holding a place under the caps).
  int ExportsInFlight() const { return export_caps_.in_use(); }
  // SCHEDULE_AUTO's calibration: the traced runs of the newest (at most two, of different
  // micro-batch sizes) earlier jobs with this spec's name and model. Takes mu_ (through
  // GetJobTrace); call without it.
  std::vector<MeasuredRun> EarlierRunsOf(const baton::v1::JobSpec& spec);

  // Workers and jobs by state, for the metrics.
  StateCounts CountStates();

  // ---- ClusterService ----
  // UNAUTHENTICATED when the options require a certificate or a join token the caller did
  // not present; PERMISSION_DENIED for a wrong join token, or a certificate without the
  // worker URI SAN (options.worker_uri_prefix: a user's certificate); otherwise as
  // WorkerRegistry::Register, recording caller.identity.
  absl::StatusOr<baton::v1::RegisterWorkerResponse> RegisterWorker(
      const baton::v1::RegisterWorkerRequest& request, const WorkerCaller& caller = {});
  // Whether a Heartbeat, ReportProgress or ReportResult naming `worker_id` comes from the
  // process that registered it (WorkerRegistry::CheckSession). The service checks before
  // each such call; the calls themselves then check the job and rank are the worker's.
  absl::Status AuthenticateWorker(const std::string& worker_id, const WorkerCaller& caller);
  absl::StatusOr<baton::v1::HeartbeatResponse> Heartbeat(
      const baton::v1::HeartbeatRequest& request);
  absl::StatusOr<baton::v1::ReportProgressResponse> ReportProgress(
      const baton::v1::ReportProgressRequest& request);
  absl::StatusOr<baton::v1::ReportResultResponse> ReportResult(
      const baton::v1::ReportResultRequest& request);

  // One round of the background loop: expire leases (failing their jobs), place queued jobs.
  // Tests without the background loop call it themselves.
  void Tick();

  const CoordinatorOptions& options() const { return options_; }

  // State changes made that job_lifecycle.h's TransitionAllowed does not allow (each is
  // logged as a bug). Always 0 unless the coordinator has a bug; tests check it.
  int64_t InvalidTransitions() {
    MutexLock lock(mu_);
    return invalid_transitions_;
  }

 private:
  // Pages of the store: ListJobs' (a page ends before its jobs pass kMaxPageBytes; gRPC's
  // default limit on a received message is 4 MiB, and large inline texts made full pages
  // fail) and Recover's.
  static constexpr int kDefaultPageSize = 50;
  static constexpr int kMaxPageSize = 1000;
  static constexpr int64_t kMaxPageBytes = int64_t{2} << 20;

  explicit Coordinator(CoordinatorOptions options);
  // Create's recovery from the store: the active jobs (Recover) and, first, every stored
  // job's checkpoint directory (RecoverCheckpointDirs). Each takes mu_.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RecoverCheckpointDirs() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time Now() const { return options_.clock(); }

  // How the effects runner reaches back into this core (each takes mu_).
  EffectsRunner::Callbacks RunnerCallbacks();
  // Runs effects now on this thread (wait) or on a background thread (runner_).
  void Run(Effects effects, bool wait) { runner_.Run(std::move(effects), wait); }
  // Whether a recovering or preempted job still waits for previous workers that were
  // stopping when their abort answered (ActiveJob::stopping_workers); forgets those freed.
  bool StillStoppingLocked(ActiveJob* j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An AbortCall with free_after returned: frees the workers that said the job stopped
  // there and counts it off the job's pending aborts.
  void AbortReturned(const AbortCall& call, const std::vector<PlacedWorker>& stopped);
  // A placement's StartJob answers are in: RUNNING, FAILED/RECOVERING, or (the job moved
  // on meanwhile) another abort.
  void FinishStart(const std::string& job_id, const std::vector<PlacedWorker>& workers,
                   const std::vector<absl::Status>& results);
  // Whether the job is still PLACING (a StartJob refused as busy is retried while it is).
  bool StillPlacing(const std::string& job_id);
  void WakeLoop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoopMain();
  void LogWarning(const std::string& message);

  ActiveJob* FindActiveLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendStateLocked(ActiveJob* job, baton::v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(ActiveJob* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitLocked(ActiveJob* job, baton::v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked(Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker that was BUSY is gone (lease expired, it left, it registered again): the job it
  // held a rank of fails, or recovers, with `why` (WorkerGoneEvent).
  void WorkerGoneLocked(const baton::v1::WorkerInfo& w, const std::string& why, bool name_rank,
                        Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs whose ranks reported only echoes (ABORTED, PEER) for root_cause_wait: each fails,
  // naming a silent worker as the cause when one is (EchoWaitedEvent).
  void SettleEchoesLocked(Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceQueuedLocked(Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills in the queue (in queue order) and running jobs of a round's input, and the
  // workers each user holds; returns the queued jobs by QueuedJob index.
  std::vector<ActiveJob*> QueueInputLocked(QueueRoundInput* in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts one job the queue policy placed: the auto-planner's choice, the plans, PLACING.
  void StartQueuedLocked(ActiveJob* j, const QueueRound::Start& start,
                         const std::vector<baton::v1::WorkerInfo>& idle, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The quota limits of `user` with `role` (options_.quotas, else DefaultLimits).
  QuotaLimits LimitsOf(const std::string& user, const std::string& role) const;
  void FreeWorkersLocked(const std::string& job_id, const std::vector<PlacedWorker>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportProgress's part under mu_ (it takes the lock): tallies the step and says what
  // the worker should do; the worker calls it leads to go into `effects`.
  absl::StatusOr<baton::v1::ReportProgressResponse> RecordProgress(
      const baton::v1::ReportProgressRequest& request, Effects* effects) ABSL_LOCKS_EXCLUDED(mu_);
  // A heartbeat saying its worker shuts down: out of the registry now, failing (or
  // recovering) the job it ran a rank of.
  void WorkerLeaving(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Heartbeat intervals that passed without one since w's last heartbeat.
  int64_t MissedHeartbeats(absl::Time last, absl::Time now) const;
  // The time and options the event functions need (job_events.h).
  EventContext Ctx() const {
    return EventContext{Now(), options_.progress_persist_interval, options_.preempt_penalty};
  }
  // Carries out a decision of job_events.h on `j` (null: the job is gone, and only calls to
  // its workers are made): every effect in order, the worker calls into `effects`. Returns
  // the job's final record when the decision ended it (j is gone then).
  std::optional<baton::v1::Job> Apply(ActiveJob* j, const Decision& d, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One effect each (job_events.h says what each does).
  void ApplyEffectLocked(ActiveJob* j, const effect::Note& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::SetState& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::FreeWorker& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::CheckpointComplete& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::RecoveryResumed& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::StepDone& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::RecordRecovery& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::StopRanks& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::AbortWorkers& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::ForgetAttempt& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::Requeue& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::BarPreemptions& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::Remove& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyEffectLocked(ActiveJob* j, const effect::Wake& e, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of an ended job: out of the queue and memory, its watchers' log closed.
  // Returns its final record.
  baton::v1::Job RemoveLocked(ActiveJob* j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitJob's part under mu_ (it takes the lock), on a spec Admit passed: the resume
  // source, checkpoint directory owners, the submission id, quotas; then QUEUED.
  absl::StatusOr<baton::v1::Job> EnqueueAdmitted(AdmittedJob admitted,
                                                 const std::string& submitted_by, bool admin)
      ABSL_LOCKS_EXCLUDED(mu_);
  // SubmitJob: finds the job spec.resume_from names and checks it (CheckResumeSource),
  // filling in `checkpoints` (INVALID_ARGUMENT naming the field otherwise).
  absl::Status ResolveResumeLocked(const baton::v1::JobSpec& spec,
                                   baton::v1::JobCheckpoints* checkpoints,
                                   const std::string& submitted_by, bool admin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorOptions options_;
  std::unique_ptr<JobStore> store_;

  Mutex mu_;
  std::condition_variable loop_cv_;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Locks itself (lock order: mu_ first). Read and changed under mu_ but for heartbeats'
  // leases (WorkerRegistry::HeartbeatAndCheck), which take its lock alone.
  WorkerRegistry registry_;
  std::map<std::string, std::unique_ptr<ActiveJob>> active_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);  // QUEUED job ids, oldest first
  // Jobs whose StartJob calls are in flight: their workers are freed when those return.
  std::set<std::string> starting_ ABSL_GUARDED_BY(mu_);
  int64_t invalid_transitions_ ABSL_GUARDED_BY(mu_) = 0;
  // Every job's checkpoint.dir (as stored: resolved at submit), who may write where; loaded
  // at Create, kept at each submission.
  CheckpointDirs checkpoint_dirs_ ABSL_GUARDED_BY(mu_);
  // Users whose jobs may not preempt until a time: one of their jobs preempted others and
  // ended without training a step (options_.preempt_penalty). Not kept across restarts.
  struct PreemptBar {
    absl::Time until;
    std::string job_id;  // the job that wasted its preemptions
  };
  std::map<std::string, PreemptBar> preempt_bars_ ABSL_GUARDED_BY(mu_);

  // ExportJob's caps (options_.max_exports...); a lock of its own, never held with mu_.
  CallCaps export_caps_;

  std::thread loop_;
  // Makes the worker calls; its callbacks take mu_. Declared last: built once options_ is.
  EffectsRunner runner_;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_COORDINATOR_H_
