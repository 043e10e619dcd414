#include "common/pipeline/local_pipeline.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/status.h"
#include "common/schedule/generators.h"
#include "common/schedule/validate.h"
#include "common/spec/spec.h"

namespace baton {

absl::StatusOr<ScheduleKind> ScheduleKindFromSpec(const baton::v1::PipelineSpec& p) {
  switch (p.schedule()) {
    case baton::v1::SCHEDULE_GPIPE:
      return ScheduleKind::kGpipe;
    case baton::v1::SCHEDULE_UNSPECIFIED:
    case baton::v1::SCHEDULE_1F1B:
      return ScheduleKind::k1F1B;
    case baton::v1::SCHEDULE_INTERLEAVED_1F1B:
      return ScheduleKind::kInterleaved1F1B;
    case baton::v1::SCHEDULE_ZB_H1:
      return ScheduleKind::kZbH1;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pipeline.schedule: unknown schedule ", static_cast<int>(p.schedule())));
}

absl::StatusOr<std::unique_ptr<LocalPipelineTrainer>> LocalPipelineTrainer::Create(
    baton::v1::JobSpec spec, LocalPipelineOptions options) {
  BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(&spec));
  std::unique_ptr<LocalPipelineTrainer> t(new LocalPipelineTrainer());
  t->spec_ = std::move(spec);
  const baton::v1::PipelineSpec& p = t->spec_.pipeline();
  if (options.schedule.has_value()) {
    Schedule s = *std::move(options.schedule);
    if (!s.lowered()) {
      BATON_ASSIGN_OR_RETURN(s, Lower(s));
    }
    BATON_RETURN_IF_ERROR(Validate(s));
    if (s.num_microbatches != p.microbatches()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the custom schedule has ", s.num_microbatches,
                       " micro-batches but pipeline.microbatches is ", p.microbatches()));
    }
    t->schedule_ = std::move(s);
  } else {
    ScheduleOptions o;
    BATON_ASSIGN_OR_RETURN(o.kind, ScheduleKindFromSpec(p));
    o.num_ranks = p.stages();
    o.virtual_stages = p.virtual_stages();
    o.num_microbatches = p.microbatches();
    BATON_ASSIGN_OR_RETURN(t->schedule_, BuildSchedule(o));
  }
  BATON_ASSIGN_OR_RETURN(t->stage_blocks_,
                         PartitionBlocks(DescribeBlocks(t->spec_.model()),
                                         t->schedule_.num_stages()));
  t->hub_ = std::make_unique<InProcessHub>(t->schedule_.num_ranks);
  StageExecutorOptions eo;
  eo.recv_timeout = options.recv_timeout;
  // Every rank on this process's device (one GPU shared by all the stage threads).
  BATON_ASSIGN_OR_RETURN(eo.device, LocalDeviceFor(t->spec_));
  t->device_ = eo.device;
  for (int r = 0; r < t->schedule_.num_ranks; ++r) {
    BATON_ASSIGN_OR_RETURN(
        std::unique_ptr<StageExecutor> ex,
        StageExecutor::Create(t->spec_, t->schedule_, t->stage_blocks_, r,
                              t->hub_->transport(r), eo));
    t->executors_.push_back(std::move(ex));
  }
  return t;
}

absl::StatusOr<PipelineStepStats> LocalPipelineTrainer::Step() {
  if (failed_) {
    return absl::FailedPreconditionError("an earlier step failed; the pipeline is stopped");
  }
  const auto start = std::chrono::steady_clock::now();
  const int S = schedule_.num_ranks;
  std::vector<absl::StatusOr<RankStepResult>> results(S, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.reserve(S);
  const int64_t step = steps_done_;
  for (int r = 0; r < S; ++r) {
    threads.emplace_back([this, r, step, &results] { results[r] = executors_[r]->RunStep(step); });
  }
  for (std::thread& th : threads) th.join();

  // The root cause is the first error that is not another rank's abort echo.
  absl::Status first_error;
  for (const auto& r : results) {
    if (r.ok()) continue;
    if (first_error.ok() || (first_error.code() == absl::StatusCode::kAborted &&
                             r.status().code() != absl::StatusCode::kAborted)) {
      first_error = r.status();
    }
  }
  if (!first_error.ok()) {
    failed_ = true;
    return first_error;
  }

  PipelineStepStats stats;
  const int last_rank = schedule_.stage_to_rank.back();
  const std::vector<float>& losses = results[last_rank]->losses;
  double sum = 0.0;
  for (float l : losses) sum += l;  // micro-batch order, as the reference trainer
  ++steps_done_;
  stats.step = steps_done_;
  stats.loss = static_cast<float>(sum / static_cast<double>(schedule_.num_microbatches));
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.samples = spec_.data().batch_size();
  stats.tokens = spec_.data().has_text() ? stats.samples * spec_.model().gpt().context()
                                         : stats.samples;
  for (auto& r : results) {
    stats.peak_inflight.push_back(r->peak_inflight);
    stats.ranks.push_back(*std::move(r));
  }
  return stats;
}

absl::Status LocalPipelineTrainer::SaveCheckpoint(const std::string& job_dir,
                                                  const std::string& job) {
  const std::string step_dir = CheckpointStepDir(job_dir, steps_done_);
  for (auto& e : executors_) {
    absl::StatusOr<std::vector<CheckpointBlockFile>> files =
        e->SaveCheckpoint(step_dir, job, steps_done_);
    if (!files.ok()) return files.status();
  }
  return absl::OkStatus();
}

absl::Status LocalPipelineTrainer::LoadCheckpoint(const std::string& step_dir) {
  int64_t step = -1;
  for (auto& e : executors_) {
    absl::StatusOr<int64_t> s = e->LoadCheckpoint(step_dir);
    if (!s.ok()) {
      failed_ = true;
      return absl::Status(s.status().code(),
                          absl::StrCat("rank ", e->rank(), ": ", s.status().message()));
    }
    step = *s;
  }
  steps_done_ = step;
  return absl::OkStatus();
}

std::vector<Digest> LocalPipelineTrainer::BlockDigests() {
  std::vector<Digest> out(stage_blocks_.empty() ? 0 : stage_blocks_.back().last);
  for (auto& ex : executors_) {
    for (auto& [block, digest] : ex->BlockDigests()) out[block] = digest;
  }
  return out;
}

}  // namespace baton
