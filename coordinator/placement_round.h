// The pure parts of a placement round: what the queue policy (queue_policy.h) is told of
// each active job, and what placing one records on it. No lock, no registry, no clock (the
// caller passes the time). Coordinator::PlaceQueuedLocked gathers the jobs under its lock,
// runs PlanQueueRound, and starts what it chose with these (tests: placement_round_test.cc).
#ifndef BATON_COORDINATOR_PLACEMENT_ROUND_H_
#define BATON_COORDINATOR_PLACEMENT_ROUND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/jobs.pb.h"
#include "baton/v1/worker.pb.h"
#include "coordinator/active_job.h"
#include "coordinator/job_tallies.h"
#include "coordinator/placement.h"
#include "coordinator/queue_policy.h"
#include "coordinator/quotas.h"

namespace baton {

// Queued (or recovering, or preempted) `j` as the queue policy sees it. The entry reads the
// job's own spec and rank needs (aliasing, owning nothing): `j` must outlive the round.
// `stopping`: its previous workers have not stopped yet; `preempting`: jobs preempted for
// it are still stopping; `no_preempt`: why it may not preempt ("" when it may).
QueuedJob QueuedJobOf(const ActiveJob& j, bool stopping, bool preempting, const QuotaLimits& limits,
                      std::string no_preempt);

// Why `user`'s jobs may not preempt at `now`: `bar_job` preempted others and ended without
// training a step, barring them until `until`; "" from `until` on.
std::string NoPreemptReason(const std::string& user, const std::string& bar_job, absl::Time until,
                            absl::Time now);

// Placed `j`, holding `workers`, as a candidate to preempt at `now`: preemptible when
// RUNNING, it writes checkpoints, is not being preempted or waiting out an echo, every rank
// reported a step and a step is left after the next; protected (saying why) until this
// attempt ran `min_run` and trained `min_steps`.
RunningJob RunningJobOf(const ActiveJob& j, std::vector<baton::v1::WorkerInfo> workers,
                        absl::Time now, absl::Duration min_run, int64_t min_steps);

// The auto-planner's choice for SCHEDULE_AUTO `spec` on the `choice` of `idle` workers (a
// GPU job's budget is the smallest GPU's memory), calibrated by j's auto_costs: written
// into `spec` and into j's own spec (the choice sticks: a recovery or resume trains the
// same clock). Returns the plan's summary, or the planner's error.
absl::StatusOr<std::string> ChooseAutoPlan(const WorkerChoice& choice,
                                           const std::vector<baton::v1::WorkerInfo>& idle,
                                           baton::v1::JobSpec* spec, ActiveJob* j);

// Records on `j` that it is placed on `placed` (rank r on placed[r]) with `placement` for
// `spec`: the plans' attempt and resume point (`resume`), the layout, the rank slots,
// Job.workers, the pipeline report, and for a job placed again (`again`: recovering or
// preempted) its recovery record's stages and workers after. Returns the PLACING reason
// ("placing on w-1, w-2 (recovery 1: 3 -> 2 stages, from step 40; <why>)").
std::string RecordPlacement(const baton::v1::JobSpec& spec, const std::vector<PlacedWorker>& placed,
                            bool again, const ResumePoint& resume, const std::string& why,
                            Placement* placement, ActiveJob* j);

// Whether a wait reason is news for `job`'s history: what it waits for changed (the reason
// up to its first " ("), not merely its position or an idle count.
bool WaitIsNews(const baton::v1::Job& job, const std::string& reason);

}  // namespace baton

#endif  // BATON_COORDINATOR_PLACEMENT_ROUND_H_
