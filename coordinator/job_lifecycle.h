// The job life's decisions as pure functions: which state changes are allowed, whether a
// failure ends a job or starts a recovery, and how many stages a recovery re-plans onto.
// No threads, no clock, no store: coordinator.cc calls these under its lock and carries
// out what they decide (tests: job_lifecycle_test.cc, table-driven).
//
//   QUEUED ──> PLACING ──> RUNNING ──> SUCCEEDED
//     │           │           ├──────> FAILED
//     │           │           └──────> RECOVERING ──> PLACING (attempt + 1)
//     │           ├──────────> RECOVERING   │
//     │           ├──────────> FAILED       ├──────> FAILED
//     └───────────┴──────────> CANCELLED <──┘
#ifndef BATON_COORDINATOR_JOB_LIFECYCLE_H_
#define BATON_COORDINATOR_JOB_LIFECYCLE_H_

#include <string>

#include "baton/v1/cluster.pb.h"
#include "baton/v1/job.pb.h"
#include "baton/v1/jobs.pb.h"

namespace baton {

bool IsTerminalState(baton::v1::JobState s);
// PLACING or RUNNING: the job holds workers that run (or are about to run) its ranks.
bool IsPlacedState(baton::v1::JobState s);
// Whether the job may go from `from` to `to` (a repeat of the same state, as a new history
// reason, is allowed for QUEUED, RUNNING and RECOVERING).
bool TransitionAllowed(baton::v1::JobState from, baton::v1::JobState to);

struct FailureFacts {
  baton::v1::JobState state = baton::v1::JOB_STATE_UNSPECIFIED;
  baton::v1::FailureCause cause = baton::v1::FAILURE_CAUSE_UNSPECIFIED;
  // From the spec (absent restart: max_restarts 0).
  int max_restarts = 0;
  // Recoveries so far, and whether one of them rolled back a divergence.
  int restarts_done = 0;
  bool diverged_before = false;
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

// The stages a recovery re-plans `spec` onto with `idle` idle workers: pipeline.stages when
// there are enough, else the most stages in [restart.min_stages, idle] for which the
// pipeline is valid (BuildPipelineLayout); 0 when none fits (the job waits).
int RecoveryStages(const baton::v1::JobSpec& spec, int idle);

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_LIFECYCLE_H_
