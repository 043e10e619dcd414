#include "coordinator/job_queries.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/spec/spec.h"
#include "coordinator/placement.h"

namespace baton {

absl::StatusOr<int64_t> HistoryPageSize(const baton::v1::GetJobHistoryRequest& request,
                                        int64_t max) {
  if (request.from_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "from_step: must be 0 (the first step) or a 1-based step, got ", request.from_step()));
  }
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must not be negative, got ", request.page_size()));
  }
  return request.page_size() == 0 ? max : std::min<int64_t>(request.page_size(), max);
}

baton::v1::JobHistory HistoryPage(const std::string& job_id,
                                  std::vector<baton::v1::StepProgress> steps, int64_t page_size) {
  baton::v1::JobHistory out;
  out.set_job_id(job_id);
  if (static_cast<int64_t>(steps.size()) > page_size) {
    steps.pop_back();
    out.set_next_from_step(steps.back().step() + 1);
  }
  for (baton::v1::StepProgress& step : steps) *out.add_steps() = std::move(step);
  return out;
}

absl::StatusOr<baton::v1::JobTrace> AssembleTrace(const baton::v1::Job& job, int64_t step,
                                                  const JobStore::TraceSteps& kept,
                                                  std::vector<baton::v1::RankTrace> traces) {
  if (traces.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has no trace of step ", step,
                                            ": steps ", kept.first, " to ", kept.last,
                                            " are kept"));
  }
  baton::v1::JobTrace out;
  out.set_job_id(job.id());
  out.set_step(step);
  out.set_first_kept_step(kept.first);
  out.set_last_kept_step(kept.last);
  // The layout placement built, from the spec (the same function the placement used) with
  // the stages it ran on (a recovery may have re-planned onto fewer).
  baton::v1::JobSpec planned = job.spec();
  if (job.pipeline().stages() > 0) SetPipelineStages(&planned, job.pipeline().stages());
  absl::StatusOr<PipelineLayout> layout = BuildPipelineLayout(planned);
  if (layout.ok()) {
    out.set_num_stages(static_cast<int>(layout->schedule.stage_to_rank.size()));
    for (int r : layout->schedule.stage_to_rank) out.add_stage_to_rank(r);
    out.set_schedule(ScheduleKindName(layout->schedule.kind));
  }
  const int ranks = job.workers_size();
  for (baton::v1::RankTrace& t : traces) {
    if (t.rank() >= 0 && t.rank() < ranks) t.set_worker_id(job.workers(t.rank()));
    *out.add_ranks() = std::move(t);
  }
  return out;
}

}  // namespace baton
