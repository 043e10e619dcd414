// The coordinator's read side: jobs, their watches, traces, histories and exports, the
// workers, and the earlier runs the auto-planner learns from. Each takes mu_ (or reads the
// store, which has its own lock) and changes nothing.
#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/core/mutex.h"
#include "common/core/status.h"
#include "common/plan/measured_run.h"
#include "common/rpc/rpc.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_queries.h"
#include "google/protobuf/util/message_differencer.h"

namespace baton {

using baton::v1::Job;
using baton::v1::JobEvent;
using baton::v1::JobState;

absl::StatusOr<std::unique_ptr<Coordinator::Export>> Coordinator::ExportJob(
    const baton::v1::ExportJobRequest& request, const std::string& caller) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: a step number (0: the newest checkpoint), got ", request.step()));
  }
  BATON_ASSIGN_OR_RETURN(Job job, GetJob(request.job_id()));
  if (!job.spec().has_checkpoint() || job.checkpoints().job_dir().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.id(), " has no checkpoints (its spec sets none)"));
  }
  // A place under the caps before any file is read: the hash check reads the whole
  // checkpoint.
  auto out = std::make_unique<Export>();
  BATON_ASSIGN_OR_RETURN(out->slot, export_caps_.Acquire(caller));
  const std::string& dir = job.checkpoints().job_dir();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator cannot read ", job.id(), "'s checkpoint directory ", dir,
        " (mount the checkpoint root on the coordinator, or export with batonctl export "
        "--from on a host that has it)"));
  }
  std::vector<std::string> skipped;
  // Every file hashed (in pieces), then opened for streaming, which hashes them again.
  BATON_ASSIGN_OR_RETURN(
      out->step, FindCheckpoint(dir, {}, request.step() > 0 ? request.step() : -1, &skipped));
  out->dir = CheckpointStepDir(dir, out->step);
  BATON_ASSIGN_OR_RETURN(out->weights, WeightsExport::Open(out->dir));
  return out;
}

absl::StatusOr<Job> Coordinator::GetJob(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  MutexLock lock(mu_);
  if (ActiveJob* j = FindActiveLocked(job_id)) return j->job;
  return store_->Get(job_id);
}

absl::StatusOr<baton::v1::ListJobsResponse> Coordinator::ListJobs(
    const baton::v1::ListJobsRequest& request) {
  int page_size = request.page_size();
  if (page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must not be negative, got ", page_size));
  }
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  BATON_ASSIGN_OR_RETURN(JobStore::Page page,
                         store_->List(page_size, request.page_token(), kMaxPageBytes));
  baton::v1::ListJobsResponse response;
  MutexLock lock(mu_);
  for (Job& job : page.jobs) {
    // Running jobs are fresher in memory (steps are written to the store now and then). One
    // that ended since the page was read is read again (under mu_ the store is current), so
    // the page shows every job as of one moment: no job ended and its successor placed.
    if (ActiveJob* j = FindActiveLocked(job.id())) {
      job = j->job;
    } else if (!IsTerminalState(job.state())) {
      if (absl::StatusOr<Job> ended = store_->Get(job.id()); ended.ok()) job = *std::move(ended);
    }
    *response.add_jobs() = std::move(job);
  }
  response.set_next_page_token(page.next_page_token);
  return response;
}

absl::StatusOr<std::unique_ptr<JobWatch>> Coordinator::WatchJob(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  MutexLock lock(mu_);
  JobEvent first;
  first.set_job_id(job_id);
  *first.mutable_time() = ToProtoTime(Now());
  if (ActiveJob* j = FindActiveLocked(job_id)) {
    if (!j->job.history().empty()) *first.mutable_state_change() = *j->job.history().rbegin();
    return std::make_unique<JobWatch>(j->log, j->log->End(), std::move(first));
  }
  BATON_ASSIGN_OR_RETURN(Job job, store_->Get(job_id));
  if (!job.history().empty()) *first.mutable_state_change() = *job.history().rbegin();
  auto log = std::make_shared<JobEventLog>();
  log->Close();
  return std::make_unique<JobWatch>(std::move(log), 0, std::move(first));
}

StateCounts Coordinator::CountStates() {
  StateCounts counts;
  counts.exports = export_caps_.in_use();
  for (const char* state : {"idle", "busy", "dead"}) counts.workers[state] = 0;
  {
    MutexLock lock(mu_);
    for (const baton::v1::WorkerInfo& w : registry_.List()) {
      switch (w.state()) {
        case baton::v1::WORKER_STATE_IDLE:
          ++counts.workers["idle"];
          break;
        case baton::v1::WORKER_STATE_BUSY:
          ++counts.workers["busy"];
          break;
        case baton::v1::WORKER_STATE_DEAD:
          ++counts.workers["dead"];
          break;
        default:
          break;
      }
    }
  }
  // Every state gets a series (0 included); when the store cannot be read, none does
  // rather than wrong zeros.
  absl::StatusOr<std::map<JobState, int64_t>> by_state = store_->CountByState();
  if (!by_state.ok()) {
    LogWarning(absl::StrCat("metrics: ", by_state.status().ToString()));
    return counts;
  }
  for (int s = baton::v1::JOB_STATE_QUEUED; s <= baton::v1::JOB_STATE_PREEMPTED; ++s) {
    const auto it = by_state->find(static_cast<JobState>(s));
    std::string name = absl::AsciiStrToLower(JobState_Name(static_cast<JobState>(s)));
    counts.jobs[name.substr(std::string("job_state_").size())] =
        it == by_state->end() ? 0 : it->second;
  }
  return counts;
}

absl::StatusOr<baton::v1::JobTrace> Coordinator::GetJobTrace(
    const baton::v1::GetJobTraceRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be 0 (the latest) or a 1-based step, got ", request.step()));
  }
  BATON_ASSIGN_OR_RETURN(Job job, GetJob(request.job_id()));
  if (job.workers_size() == 0) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has no trace: it never ran"));
  }
  const int ranks = job.workers_size();
  BATON_ASSIGN_OR_RETURN(JobStore::TraceSteps kept, store_->GetTraceSteps(job.id(), ranks));
  if (kept.last == 0) {
    return absl::NotFoundError(
        absl::StrCat("job ", job.id(), " has no trace: no step has finished"));
  }
  const int64_t step = request.step() == 0 ? kept.last_complete : request.step();
  std::vector<baton::v1::RankTrace> traces;
  if (step > 0) {
    BATON_ASSIGN_OR_RETURN(traces, store_->GetTrace(job.id(), step));
  }
  return AssembleTrace(job, step, kept, std::move(traces));
}

absl::StatusOr<baton::v1::JobHistory> Coordinator::GetJobHistory(
    const baton::v1::GetJobHistoryRequest& request) {
  BATON_ASSIGN_OR_RETURN(const int64_t page_size, HistoryPageSize(request, kMaxHistoryPageSize));
  BATON_ASSIGN_OR_RETURN(Job job, GetJob(request.job_id()));
  // One row more than the page: whether another page follows.
  BATON_ASSIGN_OR_RETURN(
      std::vector<baton::v1::StepProgress> steps,
      store_->GetSteps(job.id(), std::max<int64_t>(1, request.from_step()), page_size + 1));
  return HistoryPage(job.id(), std::move(steps), page_size);
}

std::vector<MeasuredRun> Coordinator::EarlierRunsOf(const baton::v1::JobSpec& spec) {
  std::vector<MeasuredRun> out;
  if (spec.name().empty()) return out;
  // The newest jobs first; a bounded look back (traces are kept for recent jobs only).
  absl::StatusOr<JobStore::Page> page = store_->List(200, "");
  if (!page.ok()) return out;
  for (const Job& job : page->jobs) {
    const int64_t rows = MicrobatchRows(job);
    if (job.spec().name() != spec.name() || job.workers_size() == 0 || rows < 1 ||
        !google::protobuf::util::MessageDifferencer::Equals(job.spec().model(), spec.model())) {
      continue;
    }
    // A second run only if its micro-batch size differs (it is what fits the overhead).
    if (!out.empty() && out.front().rows == rows) continue;
    baton::v1::GetJobTraceRequest req;
    req.set_job_id(job.id());
    absl::StatusOr<baton::v1::JobTrace> trace = GetJobTrace(req);
    if (!trace.ok()) continue;
    absl::StatusOr<MeasuredRun> run = MeasuredRunFromJob(job, *trace);
    if (!run.ok()) continue;
    out.push_back(*std::move(run));
    if (out.size() == 2) break;
  }
  return out;
}

baton::v1::ListWorkersResponse Coordinator::ListWorkers() {
  MutexLock lock(mu_);
  baton::v1::ListWorkersResponse response;
  for (baton::v1::WorkerInfo& w : registry_.List()) *response.add_workers() = std::move(w);
  return response;
}

}  // namespace baton
