#include "coordinator/job_events.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/log_text.h"
#include "common/nn/model.h"
#include "common/rpc/failure_cause.h"
#include "common/rpc/rpc.h"
#include "coordinator/job_lifecycle.h"

namespace baton {

using baton::v1::JobState;

namespace {

constexpr size_t kMaxReasonChars = 1024;

// "1 rank", "all 4 ranks".
std::string Ranks(size_t n) { return n == 1 ? "1 rank" : absl::StrCat("all ", n, " ranks"); }

std::string WorkerName(const PlacedWorker& w) {
  return absl::StrCat("worker ", w.worker_id, " (", w.address, ")");
}

void Append(Decision* to, Decision from) {
  for (Effect& e : from.effects) to->effects.push_back(std::move(e));
}

// Counts `rank`'s part of a checkpoint; one it completes is the decision's.
void TallyCheckpoint(ActiveJob* j, int rank, const baton::v1::CheckpointWrite& write,
                     const EventContext& c, Decision* d) {
  // Replica 0's ranks write a data-parallel job's checkpoints (every replica holds the same
  // weights and optimizer state); the others write none, but with a sharded optimizer every
  // replica writes a part of its rank's blocks.
  const int replicas = std::max(1, j->job.spec().pipeline().data_parallel());
  const int writers = j->layout.schedule.num_ranks *
                      (j->job.spec().optimizer().shard() && replicas > 1 ? replicas : 1);
  const std::optional<CheckpointTally> t =
      TallyCheckpointWrite(rank, write, writers, j->job.spec().checkpoint().keep(), c.now,
                           &j->checkpoints, j->job.mutable_checkpoints());
  if (t.has_value()) d->Add(effect::CheckpointComplete{write.step(), *t});
}

// Carries out a transition job_lifecycle.h decided: its effects in order, then the state
// change. `facts` and `what` describe the failure for a recovery record.
Decision TransitionDecision(const ActiveJob& j, const JobTransition& t, const FailureFacts& facts,
                            const std::string& what, const EventContext& c) {
  using E = JobTransition::Effect;
  if (std::find(t.effects.begin(), t.effects.end(), E::kEnd) != t.effects.end()) {
    return EndEvent(j, t.next, t.reason, c);
  }
  // Stages, not workers: a data-parallel job has data_parallel workers per stage.
  const int replicas = std::max(1, j.job.spec().pipeline().data_parallel());
  const int stages_before =
      (j.ranks.empty() ? j.job.workers_size() : static_cast<int>(j.ranks.size())) / replicas;
  Decision d;
  for (E e : t.effects) {
    switch (e) {
      case E::kRecordRecovery: {
        baton::v1::Recovery r;
        r.set_reason(TruncateReason(what));
        r.set_cause(facts.cause);
        *r.mutable_detected() = ToProtoTime(c.now);
        r.set_from_step(facts.resume_step);
        r.set_lost_steps(std::max<int64_t>(0, facts.steps_done - facts.resume_step));
        r.set_stages_before(stages_before);
        r.set_preempted_by(t.preempted_by);
        d.Add(effect::RecordRecovery{std::move(r)});
        break;
      }
      case E::kStopRanks:
        d.Add(effect::StopRanks{
            TruncateReason(absl::StrCat(
                t.next == baton::v1::JOB_STATE_PREEMPTED ? "preempted: " : "recovering: ", what)),
            /*counted=*/true});
        break;
      case E::kForgetAttempt:
        d.Add(effect::ForgetAttempt{facts.resume_step});
        break;
      case E::kQueueFirst:
        d.Add(effect::Requeue{/*first=*/true});
        break;
      case E::kQueue:
        d.Add(effect::Requeue{/*first=*/false});
        break;
      case E::kEnd:
        break;  // handled above
    }
  }
  d.Add(effect::SetState{t.next, t.reason});
  return d;
}

// Every rank finished every step: the final digests and peaks, SUCCEEDED.
Decision SucceedDecision(ActiveJob* j, const EventContext& c) {
  baton::v1::Job& job = j->job;
  SetFinalDigests(j->layout, j->digests, &job);
  job.set_steps_done(job.spec().steps());
  job.mutable_pipeline()->clear_peak_inflight();
  for (int p : j->peak_inflight) job.mutable_pipeline()->add_peak_inflight(p);
  const JobTransition t =
      OnSuccess(absl::StrCat(Ranks(j->ranks.size()), " finished ", job.spec().steps(),
                             job.spec().steps() == 1 ? " step" : " steps"));
  return EndEvent(*j, t.next, t.reason, c);
}

// Every rank of a job being preempted stopped as asked: PREEMPTED (OnPreempted).
Decision PreemptedDecision(const ActiveJob& j, const EventContext& c) {
  FailureFacts facts = FailureFactsOf(j.job, baton::v1::FAILURE_CAUSE_UNSPECIFIED);
  facts.steps_done = j.preempt_step;
  const JobTransition t = OnPreempted(facts, j.preempted_for);
  return TransitionDecision(j, t, facts, absl::StrCat("preempted by ", j.preempted_for), c);
}

// Why a rank's final report (without an error of its own) fails the job; "" when it
// does not. Marks the rank stopped (a preemption's stop) or finished.
std::string ResultFailure(ActiveJob* j, RankSlot* slot,
                          const baton::v1::ReportResultRequest& request) {
  const std::string who = absl::StrCat("rank ", request.rank(), " on worker ", request.worker_id());
  if (!request.error().empty()) return absl::StrCat(who, ": ", request.error());
  if (request.stopped_after_step() > 0) {
    if (request.stopped_after_step() == j->preempt_step) {
      slot->stopped = true;
      return "";
    }
    return absl::StrCat(who, " stopped after step ", request.stopped_after_step(),
                        j->preempt_step > 0
                            ? absl::StrCat(", not after step ", j->preempt_step, " as asked")
                            : std::string(" unasked"));
  }
  std::string failure = TallyResultDigests(request, j->layout, &j->digests);
  slot->finished = failure.empty();
  return failure;
}

// The step every replica's last rank reported (`request`, its loss their mean): its
// progress to the history and watchers.
void StepDoneDecision(ActiveJob* j, const baton::v1::ReportProgressRequest& request,
                      const EventContext& c, Decision* d) {
  const int64_t k = request.step();
  if (k <= j->job.steps_done()) return;  // a repeat
  std::vector<std::string> worker_ids;
  std::vector<baton::v1::DeviceInfo> devices;
  for (const RankSlot& slot : j->ranks) {
    worker_ids.push_back(slot.worker.worker_id);
    devices.push_back(slot.worker.device);
  }
  const baton::v1::JobSpec& spec = j->job.spec();
  StepExtras extras;
  extras.learning_rate = request.learning_rate();
  if (request.has_grad_norm()) extras.grad_norm = request.grad_norm();
  if (request.has_val_loss()) extras.val_loss = request.val_loss();
  extras.model_flops_per_step = TrainingFlops(
      j->layout.blocks, 0, static_cast<int>(j->layout.blocks.size()), spec.data().batch_size());
  if (spec.eval().only()) {
    // Its step is eval.batches batches forward: a third of a training step's FLOPs each.
    extras.model_flops_per_step *= std::max(1, spec.eval().batches()) / 3.0;
  }
  extras.peak_flops = PeakFlopsOf(devices, spec.precision() == baton::v1::PRECISION_BF16);
  baton::v1::StepProgress step = MakeStepProgress(
      spec, k, request.has_loss() ? std::optional<float>(request.loss()) : std::nullopt,
      StepDuration(request.timing(), c.now - j->last_step_at), j->timings[k], worker_ids, extras);
  j->job.set_steps_done(k);
  if (request.has_loss()) j->job.set_last_loss(request.loss());
  j->last_step_at = c.now;
  j->preempted_others = false;  // it trained on the workers it took
  d->Add(effect::StepDone{std::move(step), c.now - j->last_persist >= c.progress_persist_interval});
  PruneStepTimings(k, &j->timings);
}

// The first report of a recovered attempt ends its recovery (Recovery.resumed).
void NoteResumed(ActiveJob* j, const EventContext& c, Decision* d) {
  if (j->attempt() == 0) return;
  baton::v1::Recovery* r = j->job.mutable_recoveries(j->attempt() - 1);
  if (r->has_resumed()) return;
  *r->mutable_resumed() = ToProtoTime(c.now);
  if (r->preempted_by().empty()) {
    d->Add(effect::RecoveryResumed{c.now - FromProtoTime(r->detected())});
  }
}

// A step's report tallied: resume, links, groups, checkpoints, peaks, the replicas'
// losses. False when the resume failed the job (the decision ends it).
bool TallyProgress(ActiveJob* j, const baton::v1::ReportProgressRequest& request,
                   const EventContext& c, Decision* d) {
  if (request.resumed_from_step() > 0) {
    const ResumeTally resume = TallyResume(request, &j->resumed_from, &j->job);
    if (!resume.failure.empty()) {
      Append(d, EndEvent(*j, baton::v1::JOB_STATE_FAILED, resume.failure, c));
      return false;
    }
    if (!resume.note.empty()) d->Add(effect::Note{resume.note});
  }
  j->timings[request.step()][request.rank()] = request.timing();
  // The ranks' word on their links and data-parallel groups, kept once, in the job's
  // pipeline report and (what is new) its history.
  for (const std::string& note : {TallyLinks(request, j->job.mutable_pipeline()),
                                  TallyGroups(request, j->job.mutable_pipeline())}) {
    if (!note.empty()) d->Add(effect::Note{note});
  }
  for (const baton::v1::CheckpointWrite& w : request.checkpoints()) {
    TallyCheckpoint(j, request.rank(), w, c, d);
  }
  int& peak = j->peak_inflight[request.rank()];
  peak = std::max(peak, request.timing().peak_inflight());
  // Ranks are global (replica * S + rank); the last stage's rank of every replica reports
  // a loss, and the step is done once all of them have: their mean, in replica order.
  const int S = j->layout.schedule.num_ranks;
  const int D = static_cast<int>(j->ranks.size()) / std::max(1, S);
  if (request.rank() % S != j->layout.last_rank) return true;
  if (D <= 1) {
    StepDoneDecision(j, request, c, d);
  } else if (const std::optional<float> mean = TallyReplicaLoss(
                 request.step(), request.rank() / S, request.loss(), D, &j->replica_losses)) {
    baton::v1::ReportProgressRequest combined = request;
    combined.set_loss(*mean);
    StepDoneDecision(j, combined, c, d);
  }
  return true;
}

}  // namespace

std::string TruncateReason(std::string s) {
  if (s.size() > kMaxReasonChars) {
    s.resize(kMaxReasonChars);
    s += "...";
  }
  return s;
}

std::string ShortStateName(JobState state) {
  std::string name = baton::v1::JobState_Name(state);
  if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
  return name;
}

absl::StatusOr<RankSlot*> RankOf(ActiveJob* j, int rank, const std::string& worker_id) {
  if (rank < 0 || rank >= static_cast<int>(j->ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", rank, " is out of range; ", j->job.id(), " has ", j->ranks.size(), " ranks"));
  }
  RankSlot* slot = &j->ranks[rank];
  if (slot->worker.worker_id != worker_id) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of ", j->job.id(),
                                                      " runs on ", slot->worker.worker_id, ", not ",
                                                      EchoInput(worker_id)));
  }
  return slot;
}

Decision EndEvent(const ActiveJob& j, JobState state, const std::string& reason,
                  const EventContext& c) {
  Decision d;
  if (j.preempted_others && state != baton::v1::JOB_STATE_SUCCEEDED) {
    // It stopped other jobs and never trained on their workers: that counts against its
    // user, whose jobs may not preempt for a while.
    d.Add(effect::BarPreemptions{j.job.submitted_by(), c.now + c.preempt_penalty, state});
  }
  d.Add(effect::SetState{state, reason});
  d.Add(effect::StopRanks{TruncateReason(reason), /*counted=*/false});
  d.Add(effect::Remove{});
  return d;
}

Decision FailureEvent(const ActiveJob& j, const std::string& reason, baton::v1::FailureCause cause,
                      const EventContext& c) {
  const FailureFacts facts = FailureFactsOf(j.job, cause);
  if (j.preempt_step > 0 && IsPlacedState(j.job.state())) {
    return TransitionDecision(j, OnPreemptionFailure(facts, j.preempted_for, reason), facts, reason,
                              c);
  }
  return TransitionDecision(j, OnFailure(facts, reason), facts, reason, c);
}

absl::StatusOr<Decision> RankResultEvent(ActiveJob* j,
                                         const baton::v1::ReportResultRequest& request,
                                         const EventContext& c) {
  Decision d;
  // An earlier attempt's rank (a worker stopped and continued) has nothing to say.
  if (request.attempt() != j->attempt()) return d;
  absl::StatusOr<RankSlot*> found = RankOf(j, request.rank(), request.worker_id());
  if (!found.ok()) return found.status();
  RankSlot* slot = *found;
  if (slot->finished || !slot->held) return d;
  // The reporting rank has stopped either way.
  slot->held = false;
  d.Add(effect::FreeWorker{request.worker_id()});
  for (const baton::v1::CheckpointWrite& w : request.checkpoints()) {
    TallyCheckpoint(j, request.rank(), w, c, &d);
  }
  const std::string failure = ResultFailure(j, slot, request);
  d.Add(effect::Wake{});
  const auto all = [j](bool RankSlot::*field) {
    return std::all_of(j->ranks.begin(), j->ranks.end(),
                       [field](const RankSlot& s) { return s.*field; });
  };
  if (all(&RankSlot::stopped)) {
    Append(&d, PreemptedDecision(*j, c));  // every rank stopped where asked, without error
    return d;
  }
  const bool all_reported =
      std::none_of(j->ranks.begin(), j->ranks.end(), [](const RankSlot& s) { return s.held; });
  const ResultVerdict verdict =
      OnRankResult(request, failure, all_reported, all(&RankSlot::finished), c.now, &j->echo);
  switch (verdict.action) {
    case ResultVerdict::Action::kFail:
      Append(&d, FailureEvent(*j, verdict.reason, verdict.cause, c));
      break;
    case ResultVerdict::Action::kSucceed:
      Append(&d, SucceedDecision(j, c));
      break;
    case ResultVerdict::Action::kNone:
      break;
  }
  return d;
}

absl::StatusOr<ProgressDecision> ProgressEvent(ActiveJob* j,
                                               const baton::v1::ReportProgressRequest& request,
                                               const EventContext& c) {
  ProgressDecision out;
  out.response.set_keep_running(false);
  if (j == nullptr || !IsPlacedState(j->job.state())) return out;
  if (request.step() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be at least 1 (1-based), got ", request.step()));
  }
  absl::StatusOr<RankSlot*> slot = RankOf(j, request.rank(), request.worker_id());
  if (!slot.ok()) {
    // Not this worker's rank (any more): it stops; a rank out of range is an error.
    if (slot.status().code() == absl::StatusCode::kFailedPrecondition) return out;
    return slot.status();
  }
  if (!(*slot)->held || !j->echo.reason.empty() || request.attempt() != j->attempt()) {
    return out;
  }
  // Past a preemption's step cannot happen: each rank waits for its report's answer before
  // its next step.
  if (j->preempt_step > 0 && request.step() > j->preempt_step) return out;
  (*slot)->reported_step = std::max((*slot)->reported_step, request.step());
  NoteResumed(j, c, &out.decision);
  if (!TallyProgress(j, request, c, &out.decision)) return out;
  out.response.set_keep_running(true);
  // Being preempted: the step chosen is this rank's last; it writes that step's checkpoint.
  if (j->preempt_step > 0 && request.step() == j->preempt_step) {
    out.response.set_checkpoint_and_stop(true);
    j->stop_sent = true;  // the preemption can no longer be withdrawn
  }
  return out;
}

Decision WorkerGoneEvent(ActiveJob* j, const std::string& worker_id, const std::string& why,
                         bool name_rank, const EventContext& c) {
  int rank = -1;
  for (size_t r = 0; r < j->ranks.size(); ++r) {
    if (j->ranks[r].worker.worker_id == worker_id && j->ranks[r].held) {
      j->ranks[r].held = false;  // gone: not contacted
      rank = static_cast<int>(r);
    }
  }
  if (rank < 0) return Decision();  // it ran an earlier attempt of a recovering job
  return FailureEvent(*j, name_rank ? absl::StrCat(why, " while running rank ", rank) : why,
                      baton::v1::FAILURE_CAUSE_WORKER_LOST, c);
}

Decision StartAnsweredEvent(ActiveJob* j, const std::string& job_id,
                            const std::vector<PlacedWorker>& workers,
                            const std::vector<absl::Status>& results, const EventContext& c) {
  Decision d;
  if (j == nullptr || OnStartAnswered(j->job.state()) == StartAnswer::kAbortAgain) {
    // The job ended while its plans were on the way (cancelled, a worker died): an abort
    // may have reached a worker before its plan did. Abort again, then free them all.
    AbortCall again;
    again.job_id = job_id;
    again.reason = "the job ended while it was being started";
    again.workers = workers;
    if (j != nullptr) {  // recovering: it waits for these workers
      again.counted = true;
      ++j->pending_aborts;
    }
    return d.Add(effect::AbortWorkers{std::move(again)});
  }
  // The first failure that is not a rank left uncalled (CANCELLED), else the first.
  int failed = -1;
  for (size_t i = 0; i < results.size() && failed < 0; ++i) {
    if (!results[i].ok() && results[i].code() != absl::StatusCode::kCancelled) {
      failed = static_cast<int>(i);
    }
  }
  for (size_t i = 0; i < results.size() && failed < 0; ++i) {
    if (!results[i].ok()) failed = static_cast<int>(i);
  }
  if (failed < 0) {
    j->last_step_at = c.now;
    j->running_since = c.now;
    j->attempt_first_step = j->job.steps_done();
    return d.Add(effect::SetState{baton::v1::JOB_STATE_RUNNING,
                                  absl::StrCat(Ranks(workers.size()), " started")});
  }
  const absl::Status& s = results[failed];
  return FailureEvent(
      *j,
      absl::StrCat("StartJob on ", WorkerName(workers[failed]), " for rank ", failed,
                   " failed: ", absl::StatusCodeToString(s.code()), ": ", s.message()),
      FailureCauseOf(s, FailureSite::kStartCall), c);
}

Decision EchoWaitedEvent(const ActiveJob& j, const std::map<int, absl::Duration>& quiet,
                         absl::Duration silent_after, absl::Duration settle_after,
                         const EventContext& c) {
  std::vector<std::string> silent;
  for (const auto& [rank, q] : quiet) {
    if (rank >= static_cast<int>(j.ranks.size()) || !j.ranks[rank].held || q <= silent_after) {
      continue;
    }
    silent.push_back(absl::StrCat(WorkerName(j.ranks[rank].worker), " silent for ",
                                  absl::FormatDuration(absl::Trunc(q, absl::Milliseconds(1)))));
  }
  if (!silent.empty()) {
    return FailureEvent(
        j,
        absl::StrCat(absl::StrJoin(silent, ", "),
                     " (no heartbeat; presumed lost); first report: ", j.echo.reason),
        baton::v1::FAILURE_CAUSE_WORKER_LOST, c);
  }
  if (c.now - j.echo.since < settle_after) return Decision();
  return FailureEvent(j, j.echo.reason, j.echo.cause, c);
}

Decision CancelEvent(const ActiveJob& j, const std::string& why, const EventContext& c) {
  const JobTransition t =
      OnCancel(why.empty() ? "cancelled by request" : absl::StrCat("cancelled: ", why));
  return EndEvent(j, t.next, t.reason, c);
}

PreemptDecision PreemptEvent(ActiveJob* v, ActiveJob* for_job) {
  int64_t newest = 0;
  for (const RankSlot& slot : v->ranks) newest = std::max(newest, slot.reported_step);
  // A rank may have finished the step after its newest report, but none can have started
  // the one after that: it waits for the answer to that step's report first.
  v->preempt_step = newest + 1;
  v->preempted_for = for_job->job.id();
  for_job->preempted_others = true;
  PreemptDecision out;
  out.victim.Add(effect::Note{absl::StrCat(
      "preempting for ", for_job->job.id(), " (priority ", for_job->job.spec().priority(), " > ",
      v->job.spec().priority(), "): every rank stops after step ", v->preempt_step,
      " with its checkpoint, then gives its worker to it")});
  out.for_job.Add(effect::Note{absl::StrCat(
      "preempting ", v->job.id(), " (priority ", v->job.spec().priority(), ", ", v->ranks.size(),
      " workers): it stops after step ", v->preempt_step, " with its checkpoint")});
  return out;
}

Decision PreemptionWithdrawnEvent(ActiveJob* v, const std::string& by, JobState ended) {
  if (v->preempted_for != by || v->preempt_step == 0 || v->stop_sent) return Decision();
  v->preempt_step = 0;
  v->preempted_for.clear();
  return Decision().Add(
      effect::Note{absl::StrCat("preemption withdrawn: ", by, " ended (", ShortStateName(ended),
                                ") before any rank stopped")});
}

}  // namespace baton
