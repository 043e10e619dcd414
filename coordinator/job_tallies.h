// The coordinator's tallies over one job's reports, as pure functions: which checkpoint is
// complete across the ranks and where a (re)placement resumes, the resume bookkeeping of a
// job's first reports, each step's progress across ranks and replicas, the links and
// data-parallel groups the ranks report, and the ranks' final results. Like job_lifecycle.h: no
// threads, no clock (the caller passes the time), no store, no logging. The event functions
// (job_events.h) call these and say in their Decision what the coordinator carries out
// (persisting, logging, metrics, history notes); tests: job_tallies_test.cc.
#ifndef BATON_COORDINATOR_JOB_TALLIES_H_
#define BATON_COORDINATOR_JOB_TALLIES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.pb.h"
#include "baton/v1/job.pb.h"
#include "common/nn/model.h"
#include "baton/v1/jobs.pb.h"
#include "coordinator/job_lifecycle.h"
#include "coordinator/placement.h"

namespace baton {

// ---- Checkpoints ----

// What the ranks that wrote their part of one checkpoint reported.
struct CheckpointTally {
  std::set<int> ranks;
  int64_t bytes = 0;
  absl::Duration write_time;  // the longest rank's
};
// Checkpoints being written: step -> its tally, until complete.
using CheckpointTallies = std::map<int64_t, CheckpointTally>;

// Counts `rank`'s part `write` of a checkpoint. `writers` ranks write each one (a
// data-parallel job's replica 0: every replica holds the same state; with a sharded
// optimizer every replica, each a part of its rank's blocks). When this write
// completes step N (the last of the writers), N is appended to `c`'s complete ones (at
// `now`), only the newest max(1, keep) of them stay (the ranks prune their files by the
// same rule), the tallies of N and older steps are dropped, and N's tally is returned.
// Returns nullopt otherwise: a write still waiting for other ranks, a repeat, or a step
// not newer than the newest complete one.
std::optional<CheckpointTally> TallyCheckpointWrite(int rank,
                                                    const baton::v1::CheckpointWrite& write,
                                                    int writers, int keep, absl::Time now,
                                                    CheckpointTallies* tallies,
                                                    baton::v1::JobCheckpoints* c);

// ---- Resume ----

// Where a placement starts: a checkpoint directory ("" for the seed) and a step (0: the
// newest complete checkpoint the ranks find there).
struct ResumePoint {
  std::string dir;
  int64_t step = 0;
};

// Where the next placement of `job` (attempt job.recoveries_size()) starts. A recovery of a
// job with a complete checkpoint of its own: its own directory at step 0 (the ranks may
// have written newer ones than recorded; older ones may be pruned). Otherwise where the job
// itself started: resume_from's directory, at the step the user named (0 when they named
// none), or the seed.
ResumePoint ResumePointOf(const baton::v1::Job& job);

// The step a recovery would resume from, as recorded: the newest complete checkpoint, else
// the step the job resumed from, else 0 (the start).
int64_t RecordedResumeStep(const baton::v1::JobCheckpoints& c);

// What DecideOnFailure (job_lifecycle.h) needs to know about `job` failing with `cause`.
FailureFacts FailureFactsOf(const baton::v1::Job& job, baton::v1::FailureCause cause);

// A resumed attempt's first reports: the checkpoint step each rank loaded.
struct ResumeTally {
  // Non-empty: the ranks loaded different checkpoints; the job fails with this.
  std::string failure;
  // Non-empty for the first rank's report: the history note ("resumed from job-000003
  // step 8", with what was skipped), the job already updated (see TallyResume).
  std::string note;
};

// Records that request.rank() loaded request.resumed_from_step() (> 0) in `resumed_from`
// (rank -> step; a rank's later reports change nothing). The first rank's report updates
// `job`: the recovery record of this attempt (from_step = the step loaded, lost_steps
// recomputed from the steps done at detection) or, on the first attempt,
// checkpoints.resumed_from_step; and steps_done is at least the step loaded.
ResumeTally TallyResume(const baton::v1::ReportProgressRequest& request,
                        std::map<int, int64_t>* resumed_from, baton::v1::Job* job);

// SubmitJob's check of spec.resume_from against `source`, the job it names (`ended`:
// whether it has ended). PERMISSION_DENIED naming resume_from.job_id when a caller who is
// not `admin` names another user's job; INVALID_ARGUMENT naming the field when it has not
// ended, has no such complete checkpoint, or differs in model or optimizer kind, or when
// spec.steps leaves nothing to train. On success fills in `checkpoints`'
// resumed_from_{job,step,dir}.
absl::Status CheckResumeSource(const baton::v1::JobSpec& spec, const baton::v1::Job& source,
                               bool ended, const std::string& submitted_by, bool admin,
                               baton::v1::JobCheckpoints* checkpoints);

// ---- Progress ----

// A step's losses across data-parallel replicas: step -> replica -> the loss its last
// rank reported, until every replica has.
using ReplicaLosses = std::map<int64_t, std::map<int, float>>;

// Records `replica`'s loss of `step`. Once all `replicas` reported it, returns their mean
// (StepLoss, in replica order) and forgets that step and older ones; nullopt before.
std::optional<float> TallyReplicaLoss(int64_t step, int replica, float loss, int replicas,
                                      ReplicaLosses* losses);

// Each step's timings, step -> rank -> what the rank reported.
using StepTimings = std::map<int64_t, std::map<int, baton::v1::RankTiming>>;
// How many steps back timings are kept once a step is complete.
constexpr int64_t kKeptStepTimings = 8;
// Drops the timings of steps older than step - kKeptStepTimings.
void PruneStepTimings(int64_t step, StepTimings* timings);

// A step's duration: the last rank's own timing.step when positive, else the time since
// the previous step.
absl::Duration StepDuration(const baton::v1::RankTiming& timing, absl::Duration since_previous);

// What a step's report adds besides its loss and timings: what the last stage's rank said
// (learning rate, gradient norm, validation loss) and what the job is (its model FLOPs per
// step; the sum of its devices' peaks, 0 when any is unknown).
struct StepExtras {
  float learning_rate = 0;
  std::optional<float> grad_norm;
  std::optional<float> val_loss;
  double model_flops_per_step = 0;
  double peak_flops = 0;
};

// The sum of the devices' peaks in the job's precision (peak_flops_bf16 for a bf16 job),
// 0 when any is 0 (unknown).
double PeakFlopsOf(const std::vector<baton::v1::DeviceInfo>& devices, bool bf16 = false);

// What watchers get for `step` of a job with `spec`: `loss` (when known), `duration`,
// samples/s = batch_size / duration, tokens/s = TokensPerStep(spec) / duration (both absent
// for a zero duration), the extras (model TFLOP/s = flops per step / duration, MFU = that
// over the peak, 0 when the peak is unknown), and the timings of the ranks that reported
// the step by then (worker_ids[rank] naming each rank's worker).
baton::v1::StepProgress MakeStepProgress(const baton::v1::JobSpec& spec, int64_t step,
                                         std::optional<float> loss, absl::Duration duration,
                                         const std::map<int, baton::v1::RankTiming>& timings,
                                         const std::vector<std::string>& worker_ids,
                                         const StepExtras& extras = {});

// ---- Links and groups ----

// Keeps in `report` the links request.rank() reports as the lower rank of the pair (both
// ends report each and decided alike: the lower rank's word counts), once per pair.
// Returns the history note for what was new ("links: ranks 0-1 grpc: ...; ..."), or "".
std::string TallyLinks(const baton::v1::ReportProgressRequest& request,
                       baton::v1::PipelineReport* report);

// Keeps in `report` the first report of each data-parallel group (one per pipeline rank;
// every member reports it, having decided alike). Returns the history note for what was
// new ("data-parallel groups: rank 0 nccl ordered (...)"), or "".
std::string TallyGroups(const baton::v1::ReportProgressRequest& request,
                        baton::v1::PipelineReport* report);

// ---- Results ----

// Checks a rank's final report without an error against `layout`: a well-formed SHA-256
// (hex, either case) for every block the rank's stage owns and no other, each equal to what
// another replica already reported for that block (`digests`: block -> lower-case hex).
// Returns "" after adding the rank's digests to `digests`, else the failure ("rank 1 on
// worker w-2 finished without a digest for block 3 (fc3)"), `digests` unchanged.
std::string TallyResultDigests(const baton::v1::ReportResultRequest& request,
                               const PipelineLayout& layout, std::map<int, std::string>* digests);

// Sets `job`'s block_digests (named by layout.blocks, in block order) and weights_digest
// (CombineBlockDigests of them) from `digests`, which holds every block's.
void SetFinalDigests(const PipelineLayout& layout, const std::map<int, std::string>& digests,
                     baton::v1::Job* job);

// While every error the ranks reported is an echo (ABORTED) or a possible one (PEER): the
// first PEER one, else the first ABORTED one. The job fails with it unless a root cause (an
// error of another kind, a silent worker) shows within root_cause_wait.
struct EchoFailure {
  std::string reason;  // "" while there is none
  baton::v1::FailureCause cause = baton::v1::FAILURE_CAUSE_ABORTED;
  absl::Time since;  // when the first one came
};

// What a rank's final report does to its placed job.
struct ResultVerdict {
  enum class Action {
    kNone,     // wait: for other ranks, or for a root cause of an echo
    kFail,     // FAILED (or RECOVERING) with reason and cause
    kSucceed,  // every rank finished
  };
  Action action = Action::kNone;
  std::string reason;
  baton::v1::FailureCause cause = baton::v1::FAILURE_CAUSE_UNSPECIFIED;
};

// Decides on a rank's final report. `failure`: "" when the report was accepted as a
// success, else why it failed ("rank 1 on worker w-2: <error>", or a bad digest);
// `all_reported`: no rank holds its worker any more; `all_finished`: every rank succeeded.
// An error whose cause is ABORTED or PEER is recorded in `echo` (at `now`) and fails the job
// only once every rank reported; any other failure fails it at once (a malformed report,
// or an error without a cause, as INTERNAL).
ResultVerdict OnRankResult(const baton::v1::ReportResultRequest& request,
                           const std::string& failure, bool all_reported, bool all_finished,
                           absl::Time now, EchoFailure* echo);

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_TALLIES_H_
