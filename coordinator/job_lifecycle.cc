#include "coordinator/job_lifecycle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/spec/spec.h"
#include "coordinator/placement.h"

namespace baton {

using baton::v1::JobState;

bool IsTerminalState(JobState s) {
  return s == baton::v1::JOB_STATE_SUCCEEDED || s == baton::v1::JOB_STATE_FAILED ||
         s == baton::v1::JOB_STATE_CANCELLED;
}

bool IsWaitingState(JobState s) {
  return s == baton::v1::JOB_STATE_QUEUED || s == baton::v1::JOB_STATE_RECOVERING ||
         s == baton::v1::JOB_STATE_PREEMPTED;
}

bool IsPlacedState(JobState s) {
  return s == baton::v1::JOB_STATE_PLACING || s == baton::v1::JOB_STATE_RUNNING;
}

bool TransitionAllowed(JobState from, JobState to) {
  using baton::v1::JOB_STATE_CANCELLED;
  using baton::v1::JOB_STATE_FAILED;
  using baton::v1::JOB_STATE_PLACING;
  using baton::v1::JOB_STATE_PREEMPTED;
  using baton::v1::JOB_STATE_QUEUED;
  using baton::v1::JOB_STATE_RECOVERING;
  using baton::v1::JOB_STATE_RUNNING;
  using baton::v1::JOB_STATE_SUCCEEDED;
  switch (from) {
    case JOB_STATE_QUEUED:
      return to == JOB_STATE_QUEUED || to == JOB_STATE_PLACING || to == JOB_STATE_CANCELLED ||
             to == JOB_STATE_FAILED;  // placement itself failed
    case JOB_STATE_PLACING:
      return to == JOB_STATE_PLACING || to == JOB_STATE_RUNNING || to == JOB_STATE_FAILED ||
             to == JOB_STATE_CANCELLED || to == JOB_STATE_RECOVERING ||
             to == JOB_STATE_SUCCEEDED;
    case JOB_STATE_RUNNING:
      return to == JOB_STATE_RUNNING || to == JOB_STATE_SUCCEEDED || to == JOB_STATE_FAILED ||
             to == JOB_STATE_CANCELLED || to == JOB_STATE_RECOVERING ||
             to == JOB_STATE_PREEMPTED;
    case JOB_STATE_PREEMPTED:  // waits in the queue like a QUEUED job
      return to == JOB_STATE_PREEMPTED || to == JOB_STATE_PLACING || to == JOB_STATE_CANCELLED ||
             to == JOB_STATE_FAILED;  // placement itself failed
    case JOB_STATE_RECOVERING:
      return to == JOB_STATE_RECOVERING || to == JOB_STATE_PLACING || to == JOB_STATE_FAILED ||
             to == JOB_STATE_CANCELLED;
    default:
      return false;  // terminal states end here
  }
}

JobState NoteState(JobState current) { return current; }

StartAnswer OnStartAnswered(JobState state) {
  return state == baton::v1::JOB_STATE_PLACING ? StartAnswer::kCount : StartAnswer::kAbortAgain;
}

FailureVerdict DecideOnFailure(const FailureFacts& f) {
  FailureVerdict v;
  if (f.max_restarts <= 0) return v;
  if (!IsPlacedState(f.state) && f.state != baton::v1::JOB_STATE_RECOVERING) {
    v.why_not = "the job was not running";
    return v;
  }
  if (f.cause == baton::v1::FAILURE_CAUSE_CONFIG) {
    v.why_not = "not recovering: a configuration error would fail again";
    return v;
  }
  if (f.cause == baton::v1::FAILURE_CAUSE_DIVERGED && f.diverged_before) {
    v.why_not = "not recovering: it diverged again after a roll-back";
    return v;
  }
  if (f.restarts_done >= f.max_restarts) {
    v.why_not = absl::StrCat("no restarts left (", f.restarts_done, " of ", f.max_restarts,
                             " used)");
    return v;
  }
  v.recover = true;
  return v;
}

JobTransition OnFailure(const FailureFacts& facts, const std::string& what) {
  using Effect = JobTransition::Effect;
  JobTransition t;
  const FailureVerdict v = DecideOnFailure(facts);
  if (!v.recover) {
    t.next = baton::v1::JOB_STATE_FAILED;
    t.reason = v.why_not.empty() ? what : absl::StrCat(what, " (", v.why_not, ")");
    t.effects = {Effect::kEnd};
    return t;
  }
  const int64_t lost = std::max<int64_t>(0, facts.steps_done - facts.resume_step);
  t.next = baton::v1::JOB_STATE_RECOVERING;
  t.reason = absl::StrCat(what, "; recovering (", facts.restarts_done + 1, " of ",
                          facts.max_restarts, ") from ",
                          facts.resume_step > 0 ? absl::StrCat("step ", facts.resume_step)
                                                : std::string("the start"),
                          ", ", lost, lost == 1 ? " step" : " steps", " to train again");
  t.effects = {Effect::kRecordRecovery, Effect::kStopRanks, Effect::kForgetAttempt,
               Effect::kQueueFirst};
  return t;
}

JobTransition OnPreempted(const FailureFacts& facts, const std::string& by) {
  using Effect = JobTransition::Effect;
  JobTransition t;
  t.next = baton::v1::JOB_STATE_PREEMPTED;
  t.preempted_by = by;
  const int64_t lost = std::max<int64_t>(0, facts.steps_done - facts.resume_step);
  t.reason = absl::StrCat("preempted by ", by, ": stopped after step ", facts.steps_done);
  if (lost == 0) {
    absl::StrAppend(&t.reason, " with its checkpoint written; waits to resume from it");
  } else {
    absl::StrAppend(&t.reason, "; waits to resume from ",
                    facts.resume_step > 0 ? absl::StrCat("step ", facts.resume_step)
                                          : std::string("the start"),
                    " (its newest complete checkpoint), ", lost, lost == 1 ? " step" : " steps",
                    " to train again");
  }
  t.effects = {Effect::kRecordRecovery, Effect::kForgetAttempt, Effect::kQueue};
  return t;
}

JobTransition OnPreemptionFailure(const FailureFacts& facts, const std::string& by,
                                  const std::string& what) {
  using Effect = JobTransition::Effect;
  if (facts.cause == baton::v1::FAILURE_CAUSE_CONFIG ||
      facts.cause == baton::v1::FAILURE_CAUSE_DIVERGED) {
    return OnFailure(facts, what);  // it would fail the same way when it resumes
  }
  JobTransition t;
  t.next = baton::v1::JOB_STATE_PREEMPTED;
  t.preempted_by = by;
  const int64_t lost = std::max<int64_t>(0, facts.steps_done - facts.resume_step);
  t.reason = absl::StrCat(what, "; preempted by ", by, " while it stopped: waits to resume from ",
                          facts.resume_step > 0 ? absl::StrCat("step ", facts.resume_step)
                                                : std::string("the start"),
                          " (its newest complete checkpoint), ", lost,
                          lost == 1 ? " step" : " steps", " to train again");
  t.effects = {Effect::kRecordRecovery, Effect::kStopRanks, Effect::kForgetAttempt,
               Effect::kQueue};
  return t;
}

JobTransition OnCancel(const std::string& reason) {
  return JobTransition{baton::v1::JOB_STATE_CANCELLED, reason, {JobTransition::Effect::kEnd}, ""};
}

JobTransition OnSuccess(const std::string& reason) {
  return JobTransition{baton::v1::JOB_STATE_SUCCEEDED, reason, {JobTransition::Effect::kEnd}, ""};
}

int RecoveryStages(const baton::v1::JobSpec& spec, int idle) {
  // Every replica needs its own copy of each stage: D workers per stage.
  idle /= std::max(1, spec.pipeline().data_parallel());
  const int want = spec.pipeline().stages();
  if (idle >= want) return want;
  const int floor = spec.has_restart() && spec.restart().min_stages() > 0
                        ? spec.restart().min_stages()
                        : want;
  for (int s = std::min(idle, want); s >= floor && s >= 1; --s) {
    baton::v1::JobSpec fewer = spec;
    SetPipelineStages(&fewer, s);
    if (ValidateAndDefaultJobSpec(&fewer).ok() && BuildPipelineLayout(fewer).ok()) return s;
  }
  return 0;
}

}  // namespace baton
