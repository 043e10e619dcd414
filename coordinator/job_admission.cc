#include "coordinator/job_admission.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/hf.h"
#include "common/core/log_text.h"
#include "common/core/paths.h"
#include "common/core/status.h"
#include "common/data/dataset.h"
#include "common/rpc/rpc.h"
#include "common/spec/spec.h"
#include "coordinator/checkpoint_dirs.h"
#include "coordinator/placement.h"
#include "google/protobuf/util/message_differencer.h"

namespace baton {
namespace {

constexpr size_t kMaxSubmissionIdChars = 128;

// Paths the workers read must lie under the data roots: a spec naming /etc/shadow is
// refused now, naming the field; what this host sees of a file must be what a worker
// reads (a FIFO, or a file over the workers' bound, is refused now, not when every worker
// of the job fails on it).
absl::Status CheckDataPaths(const baton::v1::JobSpec& spec, const AdmissionOptions& options) {
  if (spec.data().has_text() && spec.data().text().has_path()) {
    BATON_ASSIGN_OR_RETURN(const std::string text,
                           ConfineDataPath(spec.data().text().path(), options.data_roots));
    BATON_RETURN_IF_ERROR(
        CheckDataFileAtSubmit(text, "data.text.path", options.max_data_file_bytes));
  }
  // So do token shards; the ones this host can see are checked too (header, size, window).
  BATON_RETURN_IF_ERROR(CheckTokenDataAtSubmit(spec, options.data_roots));
  // So does a Hugging Face model directory: an absolute one must lie under the roots, a
  // relative one (looked up under each root on the workers) must not climb out of them;
  // its files that this host sees must be regular files.
  if (spec.init().has_from_hf()) {
    const std::string& dir = spec.init().from_hf();
    if (!dir.empty() && dir.front() == '/') {
      BATON_RETURN_IF_ERROR(ConfineDataPath(dir, options.data_roots, "init.from_hf").status());
    } else if (absl::StrContains(absl::StrCat("/", dir, "/"), "/../")) {
      return absl::InvalidArgumentError(absl::StrCat("init.from_hf: '", EchoInput(dir),
                                                     "' climbs out of the data roots with '..'"));
    }
    BATON_RETURN_IF_ERROR(CheckHfModelAtSubmit(spec, options.data_roots));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdmittedJob> Admit(
    const baton::v1::SubmitJobRequest& request, const std::string& submitted_by,
    const AdmissionOptions& options,
    const std::function<std::vector<MeasuredRun>(const baton::v1::JobSpec&)>& earlier_runs) {
  if (request.submission_id().size() > kMaxSubmissionIdChars) {
    return absl::InvalidArgumentError(absl::StrCat("submission_id: at most ", kMaxSubmissionIdChars,
                                                   " characters, got ",
                                                   request.submission_id().size()));
  }
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  baton::v1::JobSpec spec = request.spec();
  // A spec that checkpoints without naming where: its user's own directory (CheckpointDirs).
  if (spec.has_checkpoint() && spec.checkpoint().dir().empty()) {
    spec.mutable_checkpoint()->set_dir(DefaultCheckpointDir(options.checkpoint_root, submitted_by));
  }
  // An evaluation-only job is one step, the evaluation, and writes no checkpoint (its
  // weights are those it loaded).
  if (spec.eval().only()) {
    spec.set_steps(1);
    spec.clear_checkpoint();
  }
  // The workers write checkpoints only under the checkpoint root: a spec naming /etc or
  // "ckpt/../../.." is refused now, and the job records where its directory resolved.
  if (spec.has_checkpoint() && !options.checkpoint_root.empty()) {
    BATON_ASSIGN_OR_RETURN(std::string dir,
                           ConfineCheckpointDir(spec.checkpoint().dir(), options.checkpoint_root));
    spec.mutable_checkpoint()->set_dir(std::move(dir));
  }
  BATON_ASSIGN_OR_RETURN(ValidatedJobSpec valid, ValidatedJobSpec::Validate(std::move(spec)));
  std::vector<MeasuredRun> auto_costs;
  if (valid->pipeline().schedule() == baton::v1::SCHEDULE_AUTO) {
    // The planner runs at placement; a spec it can find nothing for is refused now.
    baton::v1::JobSpec trial = *valid;
    BATON_RETURN_IF_ERROR(ResolveAutoPipeline(&trial, 0).status());
    BATON_RETURN_IF_ERROR(BuildPipelineLayout(trial).status());
    if (earlier_runs) auto_costs = earlier_runs(*valid);
  } else {
    BATON_RETURN_IF_ERROR(BuildPipelineLayout(*valid).status());
  }
  BATON_RETURN_IF_ERROR(CheckDataPaths(*valid, options));
  // Data the coordinator can see is checked now (inline text against the vocabulary and
  // context, the synthetic teacher); a text file and token shards are read on the workers.
  const baton::v1::DataSpec& data = valid->data();
  if (!data.has_tokens() && (!data.has_text() || data.text().has_inline_text())) {
    BATON_RETURN_IF_ERROR(MakeDataset(valid, DataAccess()).status());
  }
  // What each rank needs: placement gives each a worker that holds it.
  std::vector<int64_t> rank_needs = RankNeeds(*valid);
  return AdmittedJob{request.submission_id(), std::move(valid), std::move(rank_needs),
                     std::move(auto_costs)};
}

bool SameSubmission(const baton::v1::JobSpec& stored, const baton::v1::JobSpec& asked_spec) {
  baton::v1::JobSpec asked = asked_spec;
  const baton::v1::PipelineSpec& chosen = stored.pipeline();
  if (asked.pipeline().schedule() == baton::v1::SCHEDULE_AUTO &&
      chosen.schedule() != baton::v1::SCHEDULE_AUTO) {
    baton::v1::PipelineSpec* p = asked.mutable_pipeline();
    p->set_schedule(chosen.schedule());
    if (p->virtual_stages() == 0) p->set_virtual_stages(chosen.virtual_stages());
    if (p->microbatches() == 0) p->set_microbatches(chosen.microbatches());
    *p->mutable_partition() = chosen.partition();
    if (!ValidateAndDefaultJobSpec(&asked).ok()) asked = asked_spec;
  }
  return google::protobuf::util::MessageDifferencer::Equals(stored, asked);
}

absl::Status CheckQuota(const QuotaLimits& limits, const std::string& user, const std::string& role,
                        int32_t priority, int queued) {
  if (limits.max_priority.has_value() && priority > *limits.max_priority) {
    return absl::PermissionDeniedError(absl::StrCat("priority: ", user, " (", role,
                                                    ") may ask for at most ", *limits.max_priority,
                                                    ", got ", priority, " (quota max_priority)"));
  }
  if (limits.max_queued.has_value() && queued >= *limits.max_queued) {
    return absl::ResourceExhaustedError(
        absl::StrCat(user, " has ", queued, " jobs queued, its limit (quota max_queued ",
                     *limits.max_queued, "): wait for some to start, or cancel some"));
  }
  return absl::OkStatus();
}

baton::v1::Job NewJobRecord(const std::string& id, const std::string& submitted_by,
                            const std::string& role, baton::v1::JobCheckpoints checkpoints,
                            absl::Time now, AdmittedJob* admitted) {
  const baton::v1::JobSpec& spec = admitted->spec.proto();
  baton::v1::Job job;
  job.set_id(id);
  job.set_submission_id(std::move(admitted->submission_id));
  job.set_submitted_by(submitted_by);
  job.set_submitted_role(role);
  if (spec.has_checkpoint()) {
    checkpoints.set_job_dir(CheckpointJobDir(spec.checkpoint().dir(), id));
  }
  if (spec.has_checkpoint() || spec.has_resume_from()) {
    *job.mutable_checkpoints() = std::move(checkpoints);
    // An evaluation-only job's one step is still to come, whatever step it loads.
    job.set_steps_done(spec.eval().only() ? 0 : job.checkpoints().resumed_from_step());
  }
  *job.mutable_spec() = spec;
  job.set_state(baton::v1::JOB_STATE_QUEUED);
  *job.mutable_create_time() = ToProtoTime(now);
  baton::v1::StateChange* change = job.add_history();
  change->set_state(baton::v1::JOB_STATE_QUEUED);
  *change->mutable_time() = ToProtoTime(now);
  change->set_reason("submitted");
  return job;
}

}  // namespace baton
