#include "coordinator/job_events.h"

#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using baton::v1::JobState;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

EventContext Ctx() {
  EventContext c;
  c.now = kNow;
  c.progress_persist_interval = absl::Seconds(1);
  c.preempt_penalty = absl::Minutes(10);
  return c;
}

// A job of `ranks` pipeline ranks (one replica), on workers w-0, w-1, ..., in `state`,
// whose ranks own no blocks (a result needs no digests).
ActiveJob Job(int ranks = 2, JobState state = baton::v1::JOB_STATE_RUNNING, int restarts = 0) {
  ActiveJob j;
  j.job.set_id("job-000001");
  j.job.set_submitted_by("alice");
  j.job.set_state(state);
  j.job.mutable_spec()->set_steps(10);
  j.job.mutable_spec()->mutable_pipeline()->set_stages(ranks);
  if (restarts > 0) j.job.mutable_spec()->mutable_restart()->set_max_restarts(restarts);
  j.layout.schedule.num_ranks = ranks;
  j.layout.last_rank = ranks - 1;
  j.layout.rank_blocks.assign(ranks, {});
  for (int r = 0; r < ranks; ++r) {
    PlacedWorker w;
    w.worker_id = absl::StrCat("w-", r);
    w.address = absl::StrCat("10.0.0.", r, ":4000");
    j.ranks.push_back(RankSlot{w});
    j.job.add_workers(w.worker_id);
  }
  j.peak_inflight.assign(ranks, 0);
  j.last_step_at = kNow - absl::Seconds(2);
  j.last_persist = kNow - absl::Seconds(5);
  return j;
}

// One line per effect, what the tables compare.
std::string Describe(const Effect& e) {
  struct V {
    std::string operator()(const effect::Note&) { return "Note"; }
    std::string operator()(const effect::SetState& s) {
      return "SetState " + ShortStateName(s.next);
    }
    std::string operator()(const effect::FreeWorker& f) { return "FreeWorker " + f.worker_id; }
    std::string operator()(const effect::CheckpointComplete& c) {
      return absl::StrCat("CheckpointComplete ", c.step);
    }
    std::string operator()(const effect::RecoveryResumed&) { return "RecoveryResumed"; }
    std::string operator()(const effect::StepDone& s) {
      return absl::StrCat("StepDone ", s.step.step(), s.persist ? " persist" : "");
    }
    std::string operator()(const effect::RecordRecovery& r) {
      return r.record.preempted_by().empty() ? "RecordRecovery" : "RecordPreemption";
    }
    std::string operator()(const effect::StopRanks& s) {
      return s.counted ? "StopRanks counted" : "StopRanks";
    }
    std::string operator()(const effect::AbortWorkers& a) {
      return a.call.counted ? "AbortWorkers counted" : "AbortWorkers";
    }
    std::string operator()(const effect::ForgetAttempt& f) {
      return absl::StrCat("ForgetAttempt ", f.steps_done);
    }
    std::string operator()(const effect::Requeue& r) {
      return r.first ? "Requeue first" : "Requeue";
    }
    std::string operator()(const effect::BarPreemptions& b) { return "BarPreemptions " + b.user; }
    std::string operator()(const effect::Remove&) { return "Remove"; }
    std::string operator()(const effect::Wake&) { return "Wake"; }
  };
  return std::visit(V{}, e);
}

std::vector<std::string> Describe(const Decision& d) {
  std::vector<std::string> out;
  for (const Effect& e : d.effects) out.push_back(Describe(e));
  return out;
}

// The reason of the decision's state change ("" without one).
std::string StateReason(const Decision& d) {
  for (const Effect& e : d.effects) {
    if (const auto* s = std::get_if<effect::SetState>(&e)) return s->reason;
  }
  return "";
}

baton::v1::ReportResultRequest Result(
    int rank, const std::string& error = "",
    baton::v1::FailureCause cause = baton::v1::FAILURE_CAUSE_UNSPECIFIED) {
  baton::v1::ReportResultRequest r;
  r.set_job_id("job-000001");
  r.set_rank(rank);
  r.set_worker_id(absl::StrCat("w-", rank));
  r.set_error(error);
  r.set_cause(cause);
  return r;
}

const std::vector<std::string> kEnds = {"SetState FAILED", "StopRanks", "Remove"};

TEST(RankResultEventTest, ByTheJobAndWhatTheRankSays) {
  struct Case {
    const char* name;
    std::function<void(ActiveJob*)> setup;  // may be null
    baton::v1::ReportResultRequest request;
    std::vector<std::string> want;
  };
  auto with = [](std::vector<std::string> head, const std::vector<std::string>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  baton::v1::ReportResultRequest earlier = Result(0);
  earlier.set_attempt(1);
  baton::v1::ReportResultRequest stop = Result(1);
  stop.set_stopped_after_step(5);
  baton::v1::ReportResultRequest unasked = Result(1);
  unasked.set_stopped_after_step(3);
  baton::v1::ReportResultRequest checkpointed = Result(0);
  checkpointed.add_checkpoints()->set_step(4);
  const std::vector<Case> cases = {
      {"an earlier attempt's rank", nullptr, earlier, {}},
      {"a rank that already reported",
       [](ActiveJob* j) { j->ranks[0].held = false; },
       Result(0),
       {}},
      {"the first of two finishes", nullptr, Result(0), {"FreeWorker w-0", "Wake"}},
      {"the last finishes",
       [](ActiveJob* j) { j->ranks[0].held = false, j->ranks[0].finished = true; },
       Result(1),
       {"FreeWorker w-1", "Wake", "SetState SUCCEEDED", "StopRanks", "Remove"}},
      {"an error without restarts", nullptr,
       Result(1, "out of memory", baton::v1::FAILURE_CAUSE_INTERNAL),
       with({"FreeWorker w-1", "Wake"}, kEnds)},
      {"an error with a restart left",
       [](ActiveJob* j) { j->job.mutable_spec()->mutable_restart()->set_max_restarts(1); },
       Result(1, "link lost", baton::v1::FAILURE_CAUSE_WORKER_LOST),
       {"FreeWorker w-1", "Wake", "RecordRecovery", "StopRanks counted", "ForgetAttempt 0",
        "Requeue first", "SetState RECOVERING"}},
      {"an echo waits for the root cause",
       nullptr,
       Result(1, "peer stopped", baton::v1::FAILURE_CAUSE_ABORTED),
       {"FreeWorker w-1", "Wake"}},
      {"an echo is the failure once every rank reported",
       [](ActiveJob* j) { j->ranks[0].held = false; },
       Result(1, "peer stopped", baton::v1::FAILURE_CAUSE_ABORTED),
       with({"FreeWorker w-1", "Wake"}, kEnds)},
      {"every rank stopped where a preemption asked",
       [](ActiveJob* j) {
         j->preempt_step = 5;
         j->preempted_for = "job-000002";
         j->ranks[0].held = false;
         j->ranks[0].stopped = true;
       },
       stop,
       {"FreeWorker w-1", "Wake", "RecordPreemption", "ForgetAttempt 0", "Requeue",
        "SetState PREEMPTED"}},
      {"a stop nobody asked for", nullptr, unasked, with({"FreeWorker w-1", "Wake"}, kEnds)},
      {"a failure of a job that preempted others bars its user",
       [](ActiveJob* j) { j->preempted_others = true; },
       Result(0, "bad", baton::v1::FAILURE_CAUSE_CONFIG),
       with({"FreeWorker w-0", "Wake", "BarPreemptions alice"}, kEnds)},
      {"a checkpoint its only writer completes",
       [](ActiveJob* j) { j->layout.schedule.num_ranks = 1; },
       checkpointed,
       {"FreeWorker w-0", "CheckpointComplete 4", "Wake"}},
  };
  for (const Case& c : cases) {
    ActiveJob j = Job();
    if (c.setup) c.setup(&j);
    const absl::StatusOr<Decision> d = RankResultEvent(&j, c.request, Ctx());
    ASSERT_TRUE(d.ok()) << c.name << ": " << d.status();
    EXPECT_EQ(Describe(*d), c.want) << c.name;
  }
}

TEST(RankResultEventTest, ARankNotTheWorkersIsAnError) {
  ActiveJob j = Job();
  baton::v1::ReportResultRequest other = Result(0);
  other.set_worker_id("w-9");
  EXPECT_EQ(RankResultEvent(&j, other, Ctx()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RankResultEvent(&j, Result(7), Ctx()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(j.ranks[0].held);  // nothing changed
}

TEST(RankResultEventTest, SuccessWritesTheFinalRecord) {
  ActiveJob j = Job();
  j.peak_inflight = {3, 1};
  ASSERT_TRUE(RankResultEvent(&j, Result(0), Ctx()).ok());
  const absl::StatusOr<Decision> d = RankResultEvent(&j, Result(1), Ctx());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(StateReason(*d), "all 2 ranks finished 10 steps");
  EXPECT_EQ(j.job.steps_done(), 10);
  ASSERT_EQ(j.job.pipeline().peak_inflight_size(), 2);
  EXPECT_EQ(j.job.pipeline().peak_inflight(0), 3);
}

baton::v1::ReportProgressRequest Progress(int rank, int64_t step) {
  baton::v1::ReportProgressRequest r;
  r.set_job_id("job-000001");
  r.set_rank(rank);
  r.set_worker_id(absl::StrCat("w-", rank));
  r.set_step(step);
  r.set_loss(2.5f);
  return r;
}

TEST(ProgressEventTest, ByTheJobAndTheStep) {
  struct Case {
    const char* name;
    std::function<void(ActiveJob*)> setup;  // may be null
    baton::v1::ReportProgressRequest request;
    bool keep_running;
    bool checkpoint_and_stop;
    std::vector<std::string> want;
  };
  baton::v1::ReportProgressRequest other = Progress(0, 1);
  other.set_worker_id("w-9");
  baton::v1::ReportProgressRequest earlier = Progress(0, 1);
  earlier.set_attempt(1);
  const std::vector<Case> cases = {
      {"a job not placed",
       [](ActiveJob* j) { j->job.set_state(baton::v1::JOB_STATE_RECOVERING); },
       Progress(0, 1),
       false,
       false,
       {}},
      {"a rank another worker runs", nullptr, other, false, false, {}},
      {"a rank no longer held",
       [](ActiveJob* j) { j->ranks[0].held = false; },
       Progress(0, 1),
       false,
       false,
       {}},
      {"an echo being waited out",
       [](ActiveJob* j) { j->echo.reason = "rank 1: aborted"; },
       Progress(0, 1),
       false,
       false,
       {}},
      {"an earlier attempt", nullptr, earlier, false, false, {}},
      {"a first-stage rank's step", nullptr, Progress(0, 1), true, false, {}},
      {"the last rank's step, persisted when due",
       nullptr,
       Progress(1, 1),
       true,
       false,
       {"StepDone 1 persist"}},
      {"the last rank's step, not yet due",
       [](ActiveJob* j) { j->last_persist = kNow - absl::Milliseconds(10); },
       Progress(1, 1),
       true,
       false,
       {"StepDone 1"}},
      {"a repeated step",
       [](ActiveJob* j) { j->job.set_steps_done(3); },
       Progress(1, 2),
       true,
       false,
       {}},
      {"a preemption's step",
       [](ActiveJob* j) { j->preempt_step = 4; },
       Progress(0, 4),
       true,
       true,
       {}},
      {"past a preemption's step",
       [](ActiveJob* j) { j->preempt_step = 4; },
       Progress(0, 5),
       false,
       false,
       {}},
      {"the first step after a recovery",
       [](ActiveJob* j) {
         *j->job.add_recoveries()->mutable_detected() = ToProtoTime(kNow - absl::Seconds(30));
       },
       [] {
         baton::v1::ReportProgressRequest r = Progress(0, 3);
         r.set_attempt(1);
         return r;
       }(),
       true,
       false,
       {"RecoveryResumed"}},
  };
  for (const Case& c : cases) {
    ActiveJob j = Job();
    if (c.setup) c.setup(&j);
    const absl::StatusOr<ProgressDecision> d = ProgressEvent(&j, c.request, Ctx());
    ASSERT_TRUE(d.ok()) << c.name << ": " << d.status();
    EXPECT_EQ(d->response.keep_running(), c.keep_running) << c.name;
    EXPECT_EQ(d->response.checkpoint_and_stop(), c.checkpoint_and_stop) << c.name;
    EXPECT_EQ(Describe(d->decision), c.want) << c.name;
  }
}

TEST(ProgressEventTest, ErrorsAndAJobNoLongerActive) {
  ActiveJob j = Job();
  EXPECT_EQ(ProgressEvent(&j, Progress(0, 0), Ctx()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProgressEvent(&j, Progress(5, 1), Ctx()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<ProgressDecision> gone = ProgressEvent(nullptr, Progress(0, 1), Ctx());
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->response.keep_running());
}

TEST(ProgressEventTest, AStepDoneIsRecordedOnTheJob) {
  ActiveJob j = Job();
  const absl::StatusOr<ProgressDecision> d = ProgressEvent(&j, Progress(1, 1), Ctx());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(j.job.steps_done(), 1);
  EXPECT_FLOAT_EQ(j.job.last_loss(), 2.5f);
  EXPECT_EQ(j.last_step_at, kNow);
  EXPECT_EQ(j.ranks[1].reported_step, 1);
  ASSERT_EQ(d->decision.effects.size(), 1u);
  const auto& step = std::get<effect::StepDone>(d->decision.effects[0]).step;
  EXPECT_EQ(step.step(), 1);
  EXPECT_FLOAT_EQ(step.loss(), 2.5f);
}

TEST(WorkerGoneEventTest, FailsTheJobItHeldARankOf) {
  struct Case {
    const char* name;
    std::string worker;
    bool name_rank;
    int restarts;
    std::vector<std::string> want;
    std::string reason_starts;
  };
  const std::vector<Case> cases = {
      {"lease expired", "w-1", false, 0, kEnds, "w-1 lost"},
      {"registered again, named by rank", "w-1", true, 0, kEnds, "w-1 lost while running rank 1"},
      {"with a restart left",
       "w-0",
       false,
       1,
       {"RecordRecovery", "StopRanks counted", "ForgetAttempt 0", "Requeue first",
        "SetState RECOVERING"},
       "w-0 lost; recovering (1 of 1)"},
      {"a worker of no rank", "w-7", false, 0, {}, ""},
  };
  for (const Case& c : cases) {
    ActiveJob j = Job(2, baton::v1::JOB_STATE_RUNNING, c.restarts);
    const Decision d = WorkerGoneEvent(&j, c.worker, c.worker + " lost", c.name_rank, Ctx());
    EXPECT_EQ(Describe(d), c.want) << c.name;
    EXPECT_TRUE(absl::StartsWith(StateReason(d), c.reason_starts))
        << c.name << ": " << StateReason(d);
  }
  ActiveJob j = Job();
  WorkerGoneEvent(&j, "w-1", "gone", false, Ctx());
  EXPECT_FALSE(j.ranks[1].held);  // not contacted: it is gone
  EXPECT_TRUE(j.ranks[0].held);   // stopped by the decision's StopRanks
}

TEST(StartAnsweredEventTest, ByTheAnswersAndWhereTheJobIsNow) {
  const ActiveJob placed = Job();
  const std::vector<PlacedWorker> workers = {placed.ranks[0].worker, placed.ranks[1].worker};
  const absl::Status ok;
  const absl::Status refused = absl::UnavailableError("connection refused");
  const absl::Status uncalled = absl::CancelledError("not called");
  struct Case {
    const char* name;
    JobState state;  // UNSPECIFIED: the job is gone
    std::vector<absl::Status> results;
    std::vector<std::string> want;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"every call succeeded",
       baton::v1::JOB_STATE_PLACING,
       {ok, ok},
       {"SetState RUNNING"},
       "all 2 ranks started"},
      {"the first real failure is named",
       baton::v1::JOB_STATE_PLACING,
       {uncalled, refused},
       kEnds,
       "StartJob on worker w-1 (10.0.0.1:4000) for rank 1 failed: UNAVAILABLE: connection "
       "refused"},
      {"only a rank not called",
       baton::v1::JOB_STATE_PLACING,
       {uncalled, ok},
       kEnds,
       "StartJob on worker w-0 (10.0.0.0:4000) for rank 0 failed: CANCELLED: not called"},
      {"cancelled meanwhile", baton::v1::JOB_STATE_UNSPECIFIED, {ok, ok}, {"AbortWorkers"}, ""},
      {"recovering meanwhile",
       baton::v1::JOB_STATE_RECOVERING,
       {ok, ok},
       {"AbortWorkers counted"},
       ""},
  };
  for (const Case& c : cases) {
    ActiveJob j = Job(2, c.state);
    ActiveJob* job = c.state == baton::v1::JOB_STATE_UNSPECIFIED ? nullptr : &j;
    const Decision d = StartAnsweredEvent(job, "job-000001", workers, c.results, Ctx());
    EXPECT_EQ(Describe(d), c.want) << c.name;
    EXPECT_EQ(StateReason(d), c.reason) << c.name;
    EXPECT_EQ(j.pending_aborts, c.state == baton::v1::JOB_STATE_RECOVERING ? 1 : 0) << c.name;
  }
  ActiveJob j = Job(2, baton::v1::JOB_STATE_PLACING);
  j.job.set_steps_done(4);
  StartAnsweredEvent(&j, "job-000001", workers, {ok, ok}, Ctx());
  EXPECT_EQ(j.running_since, kNow);
  EXPECT_EQ(j.attempt_first_step, 4);
}

TEST(EchoWaitedEventTest, NamesASilentWorkerElseSettlesForTheEchoInTime) {
  const absl::Duration silent_after = absl::Milliseconds(2500);
  const absl::Duration settle_after = absl::Seconds(3);
  struct Case {
    const char* name;
    std::map<int, absl::Duration> quiet;
    absl::Duration echo_age;
    bool rank1_held;
    std::vector<std::string> want;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"every worker heartbeats, the echo is young",
       {{0, absl::Seconds(1)}, {1, absl::Seconds(1)}},
       absl::Seconds(1),
       true,
       {},
       ""},
      {"every worker heartbeats, the echo is old enough",
       {{0, absl::Seconds(1)}},
       absl::Seconds(3),
       true,
       kEnds,
       "rank 0 on worker w-0: aborted"},
      {"a held rank's worker is silent",
       {{0, absl::Seconds(1)}, {1, absl::Seconds(4)}},
       absl::Seconds(1),
       true,
       kEnds,
       "worker w-1 (10.0.0.1:4000) silent for 4s (no heartbeat; presumed lost); first report: "
       "rank 0 on worker w-0: aborted"},
      {"a silent worker whose rank already reported is not the cause",
       {{1, absl::Seconds(4)}},
       absl::Seconds(1),
       false,
       {},
       ""},
  };
  for (const Case& c : cases) {
    ActiveJob j = Job();
    j.ranks[1].held = c.rank1_held;
    j.echo.reason = "rank 0 on worker w-0: aborted";
    j.echo.cause = baton::v1::FAILURE_CAUSE_ABORTED;
    j.echo.since = kNow - c.echo_age;
    const Decision d = EchoWaitedEvent(j, c.quiet, silent_after, settle_after, Ctx());
    EXPECT_EQ(Describe(d), c.want) << c.name;
    EXPECT_EQ(StateReason(d), c.reason) << c.name;
  }
}

TEST(CancelEventTest, EndsTheJobWithTheClientsReason) {
  const ActiveJob j = Job();
  const Decision d = CancelEvent(j, "", Ctx());
  EXPECT_EQ(Describe(d), (std::vector<std::string>{"SetState CANCELLED", "StopRanks", "Remove"}));
  EXPECT_EQ(StateReason(d), "cancelled by request");
  EXPECT_EQ(StateReason(CancelEvent(j, "wrong data", Ctx())), "cancelled: wrong data");
  ActiveJob preempting = Job();
  preempting.preempted_others = true;
  const Decision barred = CancelEvent(preempting, "", Ctx());
  ASSERT_EQ(Describe(barred).front(), "BarPreemptions alice");
  EXPECT_EQ(std::get<effect::BarPreemptions>(barred.effects[0]).until, kNow + absl::Minutes(10));
}

TEST(PreemptEventTest, StopsAfterTheStepAfterTheNewestReportedAndCanBeWithdrawn) {
  ActiveJob victim = Job();
  victim.ranks[0].reported_step = 6;
  victim.ranks[1].reported_step = 5;
  ActiveJob head = Job();
  head.job.set_id("job-000002");
  const PreemptDecision d = PreemptEvent(&victim, &head);
  EXPECT_EQ(victim.preempt_step, 7);
  EXPECT_EQ(victim.preempted_for, "job-000002");
  EXPECT_TRUE(head.preempted_others);
  EXPECT_EQ(Describe(d.victim), std::vector<std::string>{"Note"});
  EXPECT_EQ(Describe(d.for_job), std::vector<std::string>{"Note"});

  // Withdrawn only for the job it was made for, and only before a rank was told to stop.
  EXPECT_TRUE(PreemptionWithdrawnEvent(&victim, "job-000003", baton::v1::JOB_STATE_FAILED).empty());
  victim.stop_sent = true;
  EXPECT_TRUE(PreemptionWithdrawnEvent(&victim, "job-000002", baton::v1::JOB_STATE_FAILED).empty());
  victim.stop_sent = false;
  const Decision w =
      PreemptionWithdrawnEvent(&victim, "job-000002", baton::v1::JOB_STATE_CANCELLED);
  ASSERT_EQ(Describe(w), std::vector<std::string>{"Note"});
  EXPECT_EQ(std::get<effect::Note>(w.effects[0]).reason,
            "preemption withdrawn: job-000002 ended (CANCELLED) before any rank stopped");
  EXPECT_EQ(victim.preempt_step, 0);
}

TEST(FailureEventTest, AJobBeingPreemptedIsPreemptedNotFailed) {
  ActiveJob j = Job();
  j.preempt_step = 5;
  j.preempted_for = "job-000002";
  const Decision d = FailureEvent(j, "link lost", baton::v1::FAILURE_CAUSE_PEER, Ctx());
  EXPECT_EQ(Describe(d),
            (std::vector<std::string>{"RecordPreemption", "StopRanks counted", "ForgetAttempt 0",
                                      "Requeue", "SetState PREEMPTED"}));
  const Decision config = FailureEvent(j, "bad spec", baton::v1::FAILURE_CAUSE_CONFIG, Ctx());
  EXPECT_EQ(Describe(config), kEnds);
}

TEST(EndEventTest, AReasonIsCutToItsBound) {
  const Decision d = EndEvent(Job(), baton::v1::JOB_STATE_FAILED, std::string(5000, 'x'), Ctx());
  const auto& stop = std::get<effect::StopRanks>(d.effects[1]);
  EXPECT_EQ(stop.reason.size(), 1024u + 3);
}

}  // namespace
}  // namespace baton
