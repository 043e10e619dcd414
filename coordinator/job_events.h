// The coordinator's events as pure functions: each takes the job an event concerns and
// returns a Decision, the changes it makes to the world around the job (the store, the
// watchers, the registry, the queue, the workers, the metrics), in the order they are made.
// No locks, no clock (EventContext.now), no store, no RPC, no logging. coordinator.cc
// calls these under its lock and carries a Decision out in one place, Coordinator::Apply;
// deciding is here (tests: job_events_test.cc, table-driven, without processes).
//
// The functions update the job's own tallies in place (ActiveJob is plain data: which
// ranks still hold their workers, the digests, the echo, the step timings); everything
// another party sees goes into the Decision. job_lifecycle.h decides the state changes and
// job_tallies.h counts the reports; these put the two together for one event.
//
//   event                      function             the coordinator's caller
//   a rank's final report      RankResultEvent      ReportResult
//   a rank's progress report   ProgressEvent        ReportProgress
//   a worker lost or replaced  WorkerGoneEvent      lease expiry, Heartbeat(leaving),
//                                                   RegisterWorker
//   StartJob calls answered    StartAnsweredEvent   the effects runner's callback
//   a client's cancel          CancelEvent          CancelJob
//   a preemption chosen        PreemptEvent         the placement round
//   an echo waited out         EchoWaitedEvent      Tick
//   any other failure          FailureEvent         Recover
//   a placement that failed    EndEvent             the placement round
#ifndef BATON_COORDINATOR_JOB_EVENTS_H_
#define BATON_COORDINATOR_JOB_EVENTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.pb.h"
#include "baton/v1/jobs.pb.h"
#include "coordinator/active_job.h"
#include "coordinator/effects_runner.h"
#include "coordinator/job_tallies.h"

namespace baton {

// What an event needs besides the job: the time, and the coordinator's options that shape
// a decision (CoordinatorOptions' fields of the same names).
struct EventContext {
  absl::Time now;
  absl::Duration progress_persist_interval = absl::Seconds(1);
  absl::Duration preempt_penalty = absl::Minutes(10);
};

// The effects a Decision lists. Apply carries them out in order, on the job it was made for.
namespace effect {
// A history entry under the job's current state (NoteState): persisted, sent to watchers.
struct Note {
  std::string reason;
};
// A state change (job_lifecycle.h allows it): appended to the history, persisted, sent to
// watchers, logged; RUNNING for the first time measures the queue wait.
struct SetState {
  baton::v1::JobState next = baton::v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
};
// The rank on this worker stopped: the registry lists the worker idle.
struct FreeWorker {
  std::string worker_id;
};
// A checkpoint every rank wrote its part of: measured, logged, persisted.
struct CheckpointComplete {
  int64_t step = 0;
  CheckpointTally tally;
};
// The first step after a recovery (not a preemption): how long the recovery took, measured.
struct RecoveryResumed {
  absl::Duration took;
};
// A step every last-stage rank reported: its row to the store's history, the event to
// watchers, and the record persisted when `persist`.
struct StepDone {
  baton::v1::StepProgress step;
  bool persist = false;
};
// A recovery or preemption begins: `record` appended to Job.recoveries (with the
// preempting job's submitter filled in when it is still active), and counted.
struct RecordRecovery {
  baton::v1::Recovery record;
};
// AbortJob to every worker still holding a rank (each no longer held; its heartbeats now
// get an abort). `counted`: the job waits for these calls before it is placed again.
struct StopRanks {
  std::string reason;
  bool counted = false;
};
// AbortJob to these workers, which are no longer the job's (its start answered after it
// moved on); `call.counted` when the job still waits for them.
struct AbortWorkers {
  AbortCall call;
};
// Drop the attempt: its ranks, tallies and preemption; steps_done back to `steps_done`.
struct ForgetAttempt {
  int64_t steps_done = 0;
};
// Into the queue again: `first` (RECOVERING) before every queued job, else in priority
// order (PREEMPTED).
struct Requeue {
  bool first = false;
};
// The job's user may not preempt until `until` (it preempted others and ended without
// training a step); preemptions made for it that no rank has been told to carry out yet
// are withdrawn (PreemptionWithdrawnEvent on each).
struct BarPreemptions {
  std::string user;
  absl::Time until;
  baton::v1::JobState ended = baton::v1::JOB_STATE_UNSPECIFIED;
};
// The job has ended: out of the queue and memory, its watchers' log closed. Always last.
struct Remove {};
// The placement loop runs again soon (the queue or the idle workers changed).
struct Wake {};
}  // namespace effect

using Effect =
    std::variant<effect::Note, effect::SetState, effect::FreeWorker, effect::CheckpointComplete,
                 effect::RecoveryResumed, effect::StepDone, effect::RecordRecovery,
                 effect::StopRanks, effect::AbortWorkers, effect::ForgetAttempt, effect::Requeue,
                 effect::BarPreemptions, effect::Remove, effect::Wake>;

// What an event does: its effects, in order. Empty: nothing changes outside the job's
// own tallies.
struct Decision {
  std::vector<Effect> effects;
  bool empty() const { return effects.empty(); }
  template <typename E>
  Decision& Add(E e) {
    effects.emplace_back(std::move(e));
    return *this;
  }
};

// A history reason or abort reason cut to 1024 characters ("..." marks the cut).
std::string TruncateReason(std::string reason);
// "RUNNING" for JOB_STATE_RUNNING.
std::string ShortStateName(baton::v1::JobState state);

// The slot of `rank` when `worker_id` runs it: INVALID_ARGUMENT for a rank out of range,
// FAILED_PRECONDITION when another worker runs it.
absl::StatusOr<RankSlot*> RankOf(ActiveJob* j, int rank, const std::string& worker_id);

// Ends a job in terminal `state` with `reason`: a user it preempted for is barred (when it
// ends other than SUCCEEDED without training a step), the state change, its held ranks
// stopped, removed.
Decision EndEvent(const ActiveJob& j, baton::v1::JobState state, const std::string& reason,
                  const EventContext& c);

// A placed (or recovering) job failed because of `reason`: FAILED, RECOVERING, or
// PREEMPTED when it was being preempted (job_lifecycle.h's OnFailure and
// OnPreemptionFailure decide).
Decision FailureEvent(const ActiveJob& j, const std::string& reason, baton::v1::FailureCause cause,
                      const EventContext& c);

// A rank's final report on placed job `j` (the caller checked that it is placed). An
// earlier attempt's, or a rank that already reported: nothing. The reporting rank's worker
// is freed and its checkpoint writes counted; then, when every rank stopped where a
// preemption asked, PREEMPTED; else as OnRankResult (job_tallies.h) decides: a failure
// (FailureEvent), SUCCEEDED with the final digests, or nothing yet. Errors: RankOf's.
absl::StatusOr<Decision> RankResultEvent(ActiveJob* j,
                                         const baton::v1::ReportResultRequest& request,
                                         const EventContext& c);

// What a progress report answers, and what it does.
struct ProgressDecision {
  baton::v1::ReportProgressResponse response;
  Decision decision;
};
// A rank's progress report on `j` (null: not active). keep_running false for a job not
// placed, a rank that is not the worker's (any more), a rank no longer held, an echo
// being waited out, an earlier attempt, or a step past a preemption's; otherwise the step
// is tallied (resume, links, groups, checkpoints, the replicas' losses) and a step every
// replica's last rank reported is done. checkpoint_and_stop at a preemption's step.
// INVALID_ARGUMENT for a step below 1 or a rank out of range.
absl::StatusOr<ProgressDecision> ProgressEvent(ActiveJob* j,
                                               const baton::v1::ReportProgressRequest& request,
                                               const EventContext& c);

// Worker `worker_id` is gone (lease expired, left, registered again) while `j` ran on it:
// its ranks are no longer held (not contacted), and the job fails with `why` (naming the
// rank when `name_rank`: "... while running rank 2"). Nothing when it held no rank of this
// attempt (it ran an earlier one).
Decision WorkerGoneEvent(ActiveJob* j, const std::string& worker_id, const std::string& why,
                         bool name_rank, const EventContext& c);

// The answers to a placement's StartJob calls, one per worker, for job `job_id` (`j`: null
// when it ended). RUNNING when every call succeeded; the first failure (one not CANCELLED
// first) fails it; a job that ended or moved on meanwhile has the workers aborted again.
Decision StartAnsweredEvent(ActiveJob* j, const std::string& job_id,
                            const std::vector<PlacedWorker>& workers,
                            const std::vector<absl::Status>& results, const EventContext& c);

// `j`'s ranks reported only echoes (ABORTED, PEER) and the root cause wait passed (the
// caller checks). No rank said what went wrong: a worker that stopped heartbeating (killed,
// frozen, cut off) is the likely root cause, and is named, before its lease runs out.
// `quiet`: by rank, how long its worker has sent no heartbeat (ranks whose worker is not
// known, or never sent one, are absent); a held rank's worker quiet for over
// `silent_after` is silent. The job fails as lost, naming the silent workers, when there
// are any; else with the echo once it is `settle_after` old; else nothing yet.
Decision EchoWaitedEvent(const ActiveJob& j, const std::map<int, absl::Duration>& quiet,
                         absl::Duration silent_after, absl::Duration settle_after,
                         const EventContext& c);

// A client cancels `j` (`why`: the request's reason, may be empty): CANCELLED.
Decision CancelEvent(const ActiveJob& j, const std::string& why, const EventContext& c);

// The queue policy chose to preempt `victim` for `for_job`: every rank of the victim stops
// after the step after the newest any reported (each waits for its report's answer before
// its next step), and both jobs' histories say so.
struct PreemptDecision {
  Decision victim;
  Decision for_job;
};
PreemptDecision PreemptEvent(ActiveJob* victim, ActiveJob* for_job);

// `victim` was being preempted for `by`, which ended in `ended` before any rank was told
// to stop: the preemption is withdrawn (it keeps running). Nothing when it was not.
Decision PreemptionWithdrawnEvent(ActiveJob* victim, const std::string& by,
                                  baton::v1::JobState ended);

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_EVENTS_H_
