#include "coordinator/placement_round.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/plan/planner.h"

namespace baton {

QueuedJob QueuedJobOf(const ActiveJob& j, bool stopping, bool preempting, const QuotaLimits& limits,
                      std::string no_preempt) {
  QueuedJob q;
  q.id = j.job.id();
  q.spec = std::shared_ptr<const baton::v1::JobSpec>(std::shared_ptr<void>(), &j.job.spec());
  q.recovering = j.job.state() == baton::v1::JOB_STATE_RECOVERING;
  q.stopping = stopping;
  q.preempting = preempting;
  q.rank_need_bytes = q.recovering ? RankNeedBytes(*q.spec) : BusiestRankBytes(j.rank_needs);
  if (!q.recovering) {
    q.rank_needs =
        std::shared_ptr<const std::vector<int64_t>>(std::shared_ptr<void>(), &j.rank_needs);
  }
  q.seq = j.seq;
  q.queued_since = j.queued_since;
  q.user = j.job.submitted_by();
  q.no_preempt = std::move(no_preempt);
  q.limits = limits;
  return q;
}

std::string NoPreemptReason(const std::string& user, const std::string& bar_job, absl::Time until,
                            absl::Time now) {
  if (now >= until) return "";
  return absl::StrCat(user, "'s ", bar_job,
                      " preempted other jobs and ended without training a step, so ", user,
                      "'s jobs may not preempt until ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", until, absl::UTCTimeZone()));
}

RunningJob RunningJobOf(const ActiveJob& j, std::vector<baton::v1::WorkerInfo> workers,
                        absl::Time now, absl::Duration min_run, int64_t min_steps) {
  RunningJob r;
  r.id = j.job.id();
  r.priority = j.job.spec().priority();
  r.started = j.placed_at;
  r.workers = std::move(workers);
  bool reported = true;
  int64_t newest = 0;
  for (const RankSlot& slot : j.ranks) {
    reported = reported && slot.held && slot.reported_step > 0;
    newest = std::max(newest, slot.reported_step);
  }
  r.preemptible = j.job.state() == baton::v1::JOB_STATE_RUNNING && j.job.spec().has_checkpoint() &&
                  j.preempt_step == 0 && j.echo.reason.empty() && reported &&
                  newest + 1 < j.job.spec().steps();
  // Protected until this attempt has run long enough: a job just resumed keeps its workers.
  const absl::Duration ran = now - j.running_since;
  const int64_t trained = newest - j.attempt_first_step;
  if (r.preemptible && (ran < min_run || trained < min_steps)) {
    r.protection = absl::StrCat(
        j.attempt() > 0 ? "resumed " : "started ", absl::ToInt64Seconds(ran), "s ago and trained ",
        trained, trained == 1 ? " step" : " steps", "; jobs run ", absl::FormatDuration(min_run),
        " and ", min_steps, " steps before they may be preempted");
  }
  return r;
}

absl::StatusOr<std::string> ChooseAutoPlan(const WorkerChoice& choice,
                                           const std::vector<baton::v1::WorkerInfo>& idle,
                                           baton::v1::JobSpec* spec, ActiveJob* j) {
  int64_t budget = 0;
  for (size_t i : choice.indices) {
    const int64_t m = idle[i].device().memory_bytes();
    if (choice.device == Device::kCuda && m > 0) budget = budget == 0 ? m : std::min(budget, m);
  }
  absl::StatusOr<Plan> plan = ResolveAutoPipeline(spec, budget, j->auto_costs);
  if (!plan.ok()) return plan.status();
  baton::v1::PipelineSpec* chosen = j->job.mutable_spec()->mutable_pipeline();
  chosen->set_schedule(spec->pipeline().schedule());
  chosen->set_virtual_stages(spec->pipeline().virtual_stages());
  chosen->set_microbatches(spec->pipeline().microbatches());
  *chosen->mutable_partition() = spec->pipeline().partition();
  return SummarizePlan(*plan);
}

std::string RecordPlacement(const baton::v1::JobSpec& spec, const std::vector<PlacedWorker>& placed,
                            bool again, const ResumePoint& resume, const std::string& why,
                            Placement* placement, ActiveJob* j) {
  for (baton::v1::JobPlan& plan : placement->plans) {
    plan.set_attempt(j->attempt());
    if (!resume.dir.empty()) {
      plan.set_resume_job_dir(resume.dir);
      plan.set_resume_step(resume.step);
    }
  }
  j->layout = std::move(placement->layout);
  j->ranks.clear();
  std::vector<std::string> names;
  for (const PlacedWorker& w : placed) {
    j->ranks.push_back(RankSlot{w});
    j->job.add_workers(w.worker_id);
    names.push_back(w.worker_id);
  }
  *j->job.mutable_pipeline() = placement->report;
  j->peak_inflight.assign(placed.size(), 0);
  std::string recovery;
  if (again) {
    baton::v1::Recovery* r = j->job.mutable_recoveries(j->attempt() - 1);
    r->set_stages_after(spec.pipeline().stages());
    for (const std::string& n : names) r->add_workers_after(n);
    recovery = absl::StrCat(r->preempted_by().empty() ? "recovery " : "resuming after preemption ",
                            j->attempt(), ": ", r->stages_before(), " -> ",
                            spec.pipeline().stages(), " stages, from ",
                            resume.dir.empty() ? std::string("the start")
                            : resume.step > 0  ? absl::StrCat("step ", resume.step)
                                               : std::string("the newest checkpoint"),
                            "; ");
  }
  return absl::StrCat("placing on ", absl::StrJoin(names, ", "), " (", recovery, why, ")");
}

bool WaitIsNews(const baton::v1::Job& job, const std::string& reason) {
  auto what = [](absl::string_view r) { return r.substr(0, r.find(" (")); };
  const auto& history = job.history();
  return history.empty() || history.rbegin()->state() != job.state() ||
         what(history.rbegin()->reason()) != what(reason);
}

}  // namespace baton
