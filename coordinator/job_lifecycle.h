// The job life's decisions as pure functions: which state changes are allowed, whether a
// failure ends a job or starts a recovery, and how many stages a recovery re-plans onto.
// No threads, no clock, no store: the event functions (job_events.h) call these and the
// coordinator carries out what they decide (tests: job_lifecycle_test.cc, table-driven).
//
//   QUEUED ──> PLACING ──> RUNNING ──> SUCCEEDED
//     │           │           ├──────> FAILED
//     │           │           ├──────> PREEMPTED ───> PLACING (attempt + 1)
//     │           │           └──────> RECOVERING ──> PLACING (attempt + 1)
//     │           ├──────────> RECOVERING   │
//     │           ├──────────> FAILED       ├──────> FAILED
//     │           ├──────────> SUCCEEDED    │   (every rank finished before the start
//     │           │                         │    calls' answers were counted)
//     ├───────────┴──────────> CANCELLED <──┘
//     └──────────────────────> FAILED   (placement itself failed)
// PREEMPTED waits in the queue as QUEUED does (and may be CANCELLED, or FAILED when its
// placement fails).
// A state may also follow itself (QUEUED, PLACING, RUNNING, RECOVERING, PREEMPTED): a note, a new
// history reason under the same state (NoteState).
//
// Ranks report as soon as they run, which can be before the coordinator has counted the
// answers to its StartJob calls (under load, a whole short job can finish first). Their
// reports are recorded under the state the job is in; only the answers move PLACING to
// RUNNING (OnStartAnswered).
#ifndef BATON_COORDINATOR_JOB_LIFECYCLE_H_
#define BATON_COORDINATOR_JOB_LIFECYCLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "baton/v1/cluster.pb.h"
#include "baton/v1/job.pb.h"
#include "baton/v1/jobs.pb.h"

namespace baton {

bool IsTerminalState(baton::v1::JobState s);
// QUEUED, RECOVERING or PREEMPTED: the job waits in the queue to be placed (it has a queue
// position and a wait reason).
bool IsWaitingState(baton::v1::JobState s);
// PLACING or RUNNING: the job holds workers that run (or are about to run) its ranks.
bool IsPlacedState(baton::v1::JobState s);
// Whether the job may go from `from` to `to` (a repeat of the same state, as a new history
// reason, is allowed for QUEUED, PLACING, RUNNING and RECOVERING).
bool TransitionAllowed(baton::v1::JobState from, baton::v1::JobState to);

// The state a note about a job in `current` is recorded under (the links and groups its
// ranks report, what it waits for): `current` itself. A note never changes the state.
baton::v1::JobState NoteState(baton::v1::JobState current);

// What the coordinator does when the answers to a placement's StartJob calls are in, the
// job being in `state` by then.
enum class StartAnswer {
  kCount,       // PLACING: RUNNING if every call succeeded, else the first failure fails it
  kAbortAgain,  // it ended or moved on meanwhile (cancelled, failed, recovering, or every
                // rank already finished): stop what the plans started, then free the workers
};
StartAnswer OnStartAnswered(baton::v1::JobState state);

struct FailureFacts {
  baton::v1::JobState state = baton::v1::JOB_STATE_UNSPECIFIED;
  baton::v1::FailureCause cause = baton::v1::FAILURE_CAUSE_UNSPECIFIED;
  // From the spec (absent restart: max_restarts 0).
  int max_restarts = 0;
  // Recoveries so far, and whether one of them rolled back a divergence.
  int restarts_done = 0;
  bool diverged_before = false;
  // Steps done when the failure was seen, and the step a recovery would resume from (its
  // newest complete checkpoint as recorded; 0: the start).
  int64_t steps_done = 0;
  int64_t resume_step = 0;
};

struct FailureVerdict {
  bool recover = false;
  // Why not, when it does not recover but the spec asked for restarts ("no restarts left
  // (2 of 2 used)"); empty otherwise.
  std::string why_not;
};

// A failure of a placed job: recover (RECOVERING) or fail (FAILED). Recovers when the spec
// allows restarts, some are left, and the cause is worth retrying: a lost worker or link, a
// worker shutting down, an unknown or internal error, and a divergence the first time (a
// transient fault rolled back once). A configuration error never recovers: it would fail
// again the same way.
FailureVerdict DecideOnFailure(const FailureFacts& facts);

// What an event does to a job: its next state, the history reason, and the effects the
// coordinator carries out, in this order. job_events.h turns them into a Decision, which
// Coordinator::Apply only executes; deciding is here.
struct JobTransition {
  enum class Effect {
    kRecordRecovery,  // add a Job.recoveries entry (reason, cause, from step, lost steps)
    kStopRanks,       // AbortJob to every worker still holding a rank of this attempt
    kForgetAttempt,   // drop the attempt's ranks and progress; steps_done = resume step
    kQueueFirst,      // to be placed again before every queued job
    kQueue,           // to be placed again in its priority's order (preempted)
    kEnd,             // terminal: stop its ranks, close its watchers, leave queue and memory
  };
  baton::v1::JobState next = baton::v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  std::vector<Effect> effects;
  // A preemption: the job that takes the workers (the recovery record's preempted_by).
  std::string preempted_by;
};

// A placed (or recovering) job failed because of `what` ("worker w-3 (...) lease
// expired"): FAILED, saying why it does not recover when it asked to, or RECOVERING.
JobTransition OnFailure(const FailureFacts& facts, const std::string& what);
// Every rank of a RUNNING job stopped after the step its preemption chose (facts.steps_done),
// the job `by` taking its workers: PREEMPTED, queued again in its priority's order, to
// resume from its newest complete checkpoint (facts.resume_step; normally that very step)
// on whatever workers it gets next.
JobTransition OnPreempted(const FailureFacts& facts, const std::string& by);
// A job being preempted (stopping for `by`) failed because of `what` before every rank had
// stopped as asked: PREEMPTED all the same, its other ranks stopped, to resume from its
// newest complete checkpoint (facts.resume_step) once they have. Preemption must not cost
// a job its life: a lost report answer or a link closing under a stopping peer is not the
// job's fault. A configuration error or a divergence is (it would fail again on resuming):
// those go as OnFailure decides.
JobTransition OnPreemptionFailure(const FailureFacts& facts, const std::string& by,
                                  const std::string& what);
// The client cancelled it (reason: "cancelled: <why>" or "cancelled by request").
JobTransition OnCancel(const std::string& reason);
// Every rank finished every step.
JobTransition OnSuccess(const std::string& reason);

// The stages a recovery re-plans `spec` onto with `idle` idle workers: pipeline.stages when
// there are enough, else the most stages in [restart.min_stages, idle] for which the
// pipeline is valid (BuildPipelineLayout); 0 when none fits (the job waits). A job with
// data-parallel replicas keeps them all: each stage takes pipeline.data_parallel workers.
int RecoveryStages(const baton::v1::JobSpec& spec, int idle);

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_LIFECYCLE_H_
