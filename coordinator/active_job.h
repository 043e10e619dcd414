// A job the coordinator holds in memory (every job not yet in a terminal state) and the
// slots of its placed ranks: plain data, with no lock of its own. The coordinator reads
// and changes it under its mutex; the pure event functions (job_events.h) read it and
// update its tallies, and say in their Decision what else changes.
#ifndef BATON_COORDINATOR_ACTIVE_JOB_H_
#define BATON_COORDINATOR_ACTIVE_JOB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "baton/v1/jobs.pb.h"
#include "common/plan/planner.h"
#include "coordinator/job_tallies.h"
#include "coordinator/job_watch.h"
#include "coordinator/placement.h"

namespace baton {

// One rank of a placed attempt: the worker that runs it and what it reported.
struct RankSlot {
  PlacedWorker worker;
  bool held = true;           // the worker is still busy with this job
  bool finished = false;      // reported a result without error
  bool stopped = false;       // preempted: stopped after the step asked, as asked
  int64_t reported_step = 0;  // the newest step it reported (this attempt)
};

// A job not yet ended, from its submission (or the coordinator's restart) on.
struct ActiveJob {
  int64_t seq = 0;  // the store's sequence number (tensor tags use a random key per attempt)
  baton::v1::Job job;
  std::shared_ptr<JobEventLog> log;
  // Set from PLACING on.
  std::vector<RankSlot> ranks;
  PipelineLayout layout;
  std::map<int, std::string> digests;  // block index -> hex
  // Data parallelism: each step's replica losses until every replica reported.
  ReplicaLosses replica_losses;
  StepTimings timings;
  std::vector<int> peak_inflight;
  absl::Time last_step_at;
  absl::Time last_persist;
  // While every error ranks reported is ABORTED or PEER (OnRankResult).
  EchoFailure echo;
  // Checkpoints being written, until every rank wrote its part.
  CheckpointTallies checkpoints;
  // A resumed job: the checkpoint step each rank loaded (from its first report).
  std::map<int, int64_t> resumed_from;
  // RECOVERING: AbortJob calls to its previous workers still in flight; it is placed
  // again only once they returned (so it gets its own workers back, not fewer stages).
  int pending_aborts = 0;
  // Its previous workers that answered the abort "still stopping": it waits for them to
  // be freed (their heartbeats) until stopping_until (options.stop_grace), then is
  // placed on what is idle. Checked by StillStoppingLocked.
  std::set<std::string> stopping_workers;
  absl::Time stopping_until;
  // SCHEDULE_AUTO: what the newest earlier runs of a job of the same name and model
  // measured, gathered at submission; the planner calibrates from them at placement.
  std::vector<MeasuredRun> auto_costs;
  // What each pipeline rank needs (RankNeeds, at submission or start-up; empty: unknown):
  // each rank is placed on a worker that registered as much.
  std::vector<int64_t> rank_needs;
  // When it last entered the queue (submitted, recovering, or recovered by a restart).
  absl::Time queued_since;
  // When this attempt was placed (preemption takes the newest first), when it started
  // RUNNING (InfinitePast before), and the step it started from.
  absl::Time placed_at;
  absl::Time running_since = absl::InfinitePast();
  int64_t attempt_first_step = 0;
  // It preempted other jobs and has not trained a step since: if it ends so, its
  // preemptions were wasted and count against its user (preempt_penalty).
  bool preempted_others = false;
  // Being preempted: every rank stops after this step (0: not being preempted), making
  // room for `preempted_for`.
  int64_t preempt_step = 0;
  std::string preempted_for;
  bool stop_sent = false;  // a rank was answered checkpoint_and_stop
  // The placement attempt: 0, then one more per recovery (Job.recoveries_size()).
  int attempt() const { return job.recoveries_size(); }
};

}  // namespace baton

#endif  // BATON_COORDINATOR_ACTIVE_JOB_H_
