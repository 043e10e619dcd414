// The queue policy: which queued jobs start in a placement round, on which idle workers, and
// why the others wait. A pure function of the queue, the workers and the time (no I/O, no
// lock), table-tested in queue_policy_test.cc; Coordinator::PlaceQueuedLocked applies it.
//
// Order. Recovering jobs first (they held workers a moment ago), then by JobSpec.priority,
// higher first, then in submission order. Every job left waiting gets its 1-based position
// among those (1: the next to be placed) and a reason.
//
// A job that cannot start now does not block the jobs behind it:
//  - A job no set of the registered workers could run (more workers than are registered, a
//    device none has, more memory per rank than any has) waits saying so and holds nothing.
//  - A job over its user's max_workers quota (quotas.h) waits saying so and holds nothing.
//  - The first other job that does not fit (the head) holds nothing either, until it has
//    waited `reserve_after`: from then on it holds a reservation, every idle worker it could
//    use is kept for it (later jobs start only on workers it cannot use, which cannot delay
//    it), and as running jobs end it gathers the workers it needs. So backfill may delay a
//    head job by at most `reserve_after` plus the running time of what started meanwhile,
//    and no job waits forever while running jobs end.
// Jobs behind the head start on what is left, in order (backfill).
//
// Preemption. When the head does not fit and running jobs of lower priority that write
// checkpoints (RunningJob::preemptible) hold workers it could use, the round may name some
// of them to stop at a checkpoint (QueueRound::preemption): the newest started first, then
// those with the fewest workers, just enough for the head to fit on them and the idle
// workers. From then on the head holds the idle workers it can use (QueuedJob::preempting)
// until it starts. A job that writes no checkpoints is never preempted, nor is one of equal
// or higher priority, nor one still protected after it started or resumed
// (RunningJob::protection), and a head whose user may not preempt now (QueuedJob::no_preempt)
// preempts nothing: either way its reason says so.
#ifndef BATON_COORDINATOR_QUEUE_POLICY_H_
#define BATON_COORDINATOR_QUEUE_POLICY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "baton/v1/job.pb.h"
#include "baton/v1/worker.pb.h"
#include "coordinator/placement.h"
#include "coordinator/quotas.h"

namespace baton {

struct QueuedJob {
  std::string id;
  // Validated and defaulted; not owned (the caller's job record), outlives the round.
  std::shared_ptr<const baton::v1::JobSpec> spec;
  int64_t rank_need_bytes = 0;    // RankNeedBytes; 0: no memory check
  // RankNeeds: each pipeline rank's; null or empty: unknown. Not a copy: the caller's job
  // record (aliasing, like spec), outlives the round.
  std::shared_ptr<const std::vector<int64_t>> rank_needs;
  int64_t seq = 0;                // submission order, smaller first
  absl::Time queued_since;        // when it last entered the queue
  std::string user;               // Job.submitted_by
  QuotaLimits limits;             // the user's
  bool recovering = false;        // RECOVERING: placed again, maybe on fewer stages
  bool stopping = false;          // recovering or preempted, its previous workers not yet
                                  // stopped: waits, holding no one up
  // Jobs preempted for it are still stopping: it holds the idle workers it can use, and
  // preempts no more.
  bool preempting = false;
  // Non-empty: it may not preempt, and why (its user's earlier preemptions were wasted).
  std::string no_preempt;
};

// A placed job, as a candidate to preempt.
struct RunningJob {
  std::string id;
  int32_t priority = 0;
  std::vector<baton::v1::WorkerInfo> workers;  // the workers it holds
  absl::Time started;                          // placed at; newer ones go first
  // RUNNING, writes checkpoints, every rank reported a step, not already being preempted,
  // and steps left after the next one: it can stop at a checkpoint soon.
  bool preemptible = false;
  // Non-empty: preemptible, but protected for now, and why (it has not run the minimum
  // time or steps since it started or resumed); not a victim until it has.
  std::string protection;
};

struct QueueRoundInput {
  std::vector<QueuedJob> queue;  // any order
  std::vector<baton::v1::WorkerInfo> idle;
  // Every live worker (idle or busy): what could ever run a job.
  std::vector<baton::v1::WorkerInfo> registered;
  // Workers each user's running jobs hold now.
  std::map<std::string, int> held_by_user;
  absl::Time now;
  absl::Duration reserve_after = absl::Minutes(5);
  // At most this many jobs start in one round; the round stops there (the jobs after keep
  // what the previous round said of them) and QueueRound::more is set, so the caller runs
  // another at once. Bounds how long a round holds the coordinator's lock.
  int max_starts = 1 << 30;
  // Running jobs (for preemption; any order), and whether the round may preempt.
  std::vector<RunningJob> running;
  bool preempt = true;
};

struct QueueRound {
  struct Start {
    size_t index = 0;         // into QueueRoundInput::queue
    std::string id;
    baton::v1::JobSpec spec;  // a recovering job's with the stages it starts on
    WorkerChoice choice;      // indices into QueueRoundInput::idle
  };
  std::vector<Start> starts;  // in the order they were chosen
  struct Wait {
    size_t index = 0;         // into QueueRoundInput::queue
    std::string id;
    int position = 0;         // 1-based among the jobs still waiting, in queue order
    std::string reason;
  };
  std::vector<Wait> waits;    // in queue order
  bool more = false;          // stopped at max_starts: run another round
  std::string reserved_for;   // the head job holding a reservation, if one does
  int reserved_workers = 0;   // idle workers kept for it
  // Jobs to stop at a checkpoint so that `for_job` (the head) fits: ids into
  // QueueRoundInput::running, in the order chosen.
  struct Preemption {
    std::string for_job;
    std::vector<std::string> victims;
  };
  std::optional<Preemption> preemption;
};

QueueRound PlanQueueRound(const QueueRoundInput& in);

}  // namespace baton

#endif  // BATON_COORDINATOR_QUEUE_POLICY_H_
