#include "coordinator/job_lifecycle.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

using baton::v1::JobState;

constexpr JobState Q = baton::v1::JOB_STATE_QUEUED;
constexpr JobState P = baton::v1::JOB_STATE_PLACING;
constexpr JobState R = baton::v1::JOB_STATE_RUNNING;
constexpr JobState S = baton::v1::JOB_STATE_SUCCEEDED;
constexpr JobState F = baton::v1::JOB_STATE_FAILED;
constexpr JobState C = baton::v1::JOB_STATE_CANCELLED;
constexpr JobState V = baton::v1::JOB_STATE_RECOVERING;
constexpr JobState E = baton::v1::JOB_STATE_PREEMPTED;

TEST(JobLifecycleTest, TransitionsAreExactlyTheDiagram) {
  const std::vector<JobState> all = {Q, P, R, S, F, C, V, E};
  // from -> the states it may go to.
  const std::vector<std::pair<JobState, std::vector<JobState>>> allowed = {
      {Q, {Q, P, C, F}},
      {P, {P, R, F, C, V, S}},
      {R, {R, S, F, C, V, E}},
      {V, {V, P, F, C}},
      {E, {E, P, C, F}},
      {S, {}},
      {F, {}},
      {C, {}},
  };
  for (const auto& [from, tos] : allowed) {
    for (JobState to : all) {
      const bool want = std::find(tos.begin(), tos.end(), to) != tos.end();
      EXPECT_EQ(TransitionAllowed(from, to), want)
          << baton::v1::JobState_Name(from) << " -> " << baton::v1::JobState_Name(to);
    }
  }
}

// Reports that arrive before the StartJob answers are counted are notes under PLACING,
// never a change the answers then misread as the job having ended.
TEST(JobLifecycleTest, NotesKeepTheStateAndOnlyAPlacingJobCountsItsStartAnswers) {
  for (JobState s : {Q, P, R, V, E}) {
    EXPECT_EQ(NoteState(s), s);
    EXPECT_TRUE(TransitionAllowed(s, NoteState(s)));
  }
  EXPECT_EQ(OnStartAnswered(P), StartAnswer::kCount);
  for (JobState s : {R, S, F, C, V}) {
    EXPECT_EQ(OnStartAnswered(s), StartAnswer::kAbortAgain) << baton::v1::JobState_Name(s);
  }
}

TEST(JobLifecycleTest, FailureRecoversOnlyWhenAllowedAndWorthIt) {
  using baton::v1::FailureCause;
  struct Case {
    const char* name;
    JobState state;
    FailureCause cause;
    int max_restarts, done;
    bool diverged_before;
    bool recover;
    std::string why_not;
  };
  const std::vector<Case> cases = {
      {"no restart spec", R, baton::v1::FAILURE_CAUSE_WORKER_LOST, 0, 0, false, false, ""},
      {"worker lost", R, baton::v1::FAILURE_CAUSE_WORKER_LOST, 2, 0, false, true, ""},
      {"peer link", R, baton::v1::FAILURE_CAUSE_PEER, 2, 1, false, true, ""},
      {"shutdown", R, baton::v1::FAILURE_CAUSE_SHUTDOWN, 1, 0, false, true, ""},
      {"echo with no root cause", R, baton::v1::FAILURE_CAUSE_ABORTED, 1, 0, false, true, ""},
      {"internal", R, baton::v1::FAILURE_CAUSE_INTERNAL, 1, 0, false, true, ""},
      {"start failed while placing", P, baton::v1::FAILURE_CAUSE_WORKER_LOST, 1, 0, false, true,
       ""},
      {"restarts used up", R, baton::v1::FAILURE_CAUSE_WORKER_LOST, 2, 2, false, false,
       "no restarts left (2 of 2 used)"},
      {"config error", R, baton::v1::FAILURE_CAUSE_CONFIG, 3, 0, false, false,
       "not recovering: a configuration error would fail again"},
      {"diverged once: roll back", R, baton::v1::FAILURE_CAUSE_DIVERGED, 3, 0, false, true, ""},
      {"diverged again", R, baton::v1::FAILURE_CAUSE_DIVERGED, 3, 1, true, false,
       "not recovering: it diverged again after a roll-back"},
      {"worker lost after a divergence roll-back", R, baton::v1::FAILURE_CAUSE_WORKER_LOST, 3, 1,
       true, true, ""},
      {"not running", Q, baton::v1::FAILURE_CAUSE_WORKER_LOST, 1, 0, false, false,
       "the job was not running"},
  };
  for (const Case& c : cases) {
    FailureFacts f;
    f.state = c.state;
    f.cause = c.cause;
    f.max_restarts = c.max_restarts;
    f.restarts_done = c.done;
    f.diverged_before = c.diverged_before;
    const FailureVerdict v = DecideOnFailure(f);
    EXPECT_EQ(v.recover, c.recover) << c.name;
    EXPECT_EQ(v.why_not, c.why_not) << c.name;
  }
}

TEST(JobLifecycleTest, EventsGiveTheNextStateReasonAndEffects) {
  using Effect = JobTransition::Effect;
  FailureFacts f;
  f.state = R;
  f.cause = baton::v1::FAILURE_CAUSE_WORKER_LOST;
  f.max_restarts = 2;
  f.restarts_done = 0;
  f.steps_done = 43;
  f.resume_step = 40;
  JobTransition t = OnFailure(f, "worker w-3 (h:1) lease expired");
  EXPECT_EQ(t.next, V);
  EXPECT_EQ(t.reason,
            "worker w-3 (h:1) lease expired; recovering (1 of 2) from step 40, 3 steps to train "
            "again");
  EXPECT_EQ(t.effects, (std::vector<Effect>{Effect::kRecordRecovery, Effect::kStopRanks,
                                            Effect::kForgetAttempt, Effect::kQueueFirst}));
  f.resume_step = 0;
  f.steps_done = 1;
  f.restarts_done = 1;
  EXPECT_EQ(OnFailure(f, "x").reason, "x; recovering (2 of 2) from the start, 1 step to train again");
  f.restarts_done = 2;
  t = OnFailure(f, "worker w-3 (h:1) lease expired");
  EXPECT_EQ(t.next, F);
  EXPECT_EQ(t.reason, "worker w-3 (h:1) lease expired (no restarts left (2 of 2 used))");
  EXPECT_EQ(t.effects, std::vector<Effect>{Effect::kEnd});
  f.max_restarts = 0;  // no restart spec: the failure as it is
  EXPECT_EQ(OnFailure(f, "rank 1 on worker w-2: INTERNAL: boom").reason,
            "rank 1 on worker w-2: INTERNAL: boom");
  // A preemption: queued again in its order (not first), recorded as a recovery naming the
  // job that took the workers; nothing to stop (every rank already stopped).
  f.steps_done = 12;
  f.resume_step = 12;
  t = OnPreempted(f, "job-000009");
  EXPECT_EQ(t.next, E);
  EXPECT_EQ(t.preempted_by, "job-000009");
  EXPECT_EQ(t.reason,
            "preempted by job-000009: stopped after step 12 with its checkpoint written; waits "
            "to resume from it");
  EXPECT_EQ(t.effects, (std::vector<Effect>{Effect::kRecordRecovery, Effect::kForgetAttempt,
                                            Effect::kQueue}));
  EXPECT_TRUE(TransitionAllowed(R, t.next));
  f.resume_step = 10;  // that step's checkpoint did not complete: the one before
  EXPECT_EQ(OnPreempted(f, "job-000009").reason,
            "preempted by job-000009: stopped after step 12; waits to resume from step 10 (its "
            "newest complete checkpoint), 2 steps to train again");
  // A failure while it stops for a preemption: PREEMPTED all the same (its other ranks
  // stopped), unless the failure would repeat on resuming.
  f.cause = baton::v1::FAILURE_CAUSE_PEER;
  f.max_restarts = 0;
  t = OnPreemptionFailure(f, "job-000009", "rank 1 on worker w-2: UNAVAILABLE: rank 0 left");
  EXPECT_EQ(t.next, E);
  EXPECT_EQ(t.preempted_by, "job-000009");
  EXPECT_EQ(t.reason,
            "rank 1 on worker w-2: UNAVAILABLE: rank 0 left; preempted by job-000009 while it "
            "stopped: waits to resume from step 10 (its newest complete checkpoint), 2 steps to "
            "train again");
  EXPECT_EQ(t.effects, (std::vector<Effect>{Effect::kRecordRecovery, Effect::kStopRanks,
                                            Effect::kForgetAttempt, Effect::kQueue}));
  for (auto cause : {baton::v1::FAILURE_CAUSE_CONFIG, baton::v1::FAILURE_CAUSE_DIVERGED}) {
    f.cause = cause;
    EXPECT_EQ(OnPreemptionFailure(f, "job-000009", "x").next, F);
  }
  t = OnCancel("cancelled by request");
  EXPECT_EQ(t.next, C);
  EXPECT_EQ(t.effects, std::vector<Effect>{Effect::kEnd});
  t = OnSuccess("all 2 ranks finished 10 steps");
  EXPECT_EQ(t.next, S);
  EXPECT_EQ(t.reason, "all 2 ranks finished 10 steps");
  // Whatever an event decides is an allowed transition from where it can happen.
  for (JobState from : {P, R, V}) {
    f.state = from;
    f.max_restarts = 2;
    f.restarts_done = 0;
    EXPECT_TRUE(TransitionAllowed(from, OnFailure(f, "x").next));
    EXPECT_TRUE(TransitionAllowed(from, OnCancel("c").next));
  }
  EXPECT_TRUE(TransitionAllowed(R, OnSuccess("s").next));
}

baton::v1::JobSpec Gpt(int stages, int min_stages, int layers = 4) {
  baton::v1::JobSpec spec;
  auto* g = spec.mutable_model()->mutable_gpt();
  g->set_vocab_size(32);
  g->set_context(8);
  g->set_d_model(16);
  g->set_heads(2);
  g->set_layers(layers);  // layers + 2 blocks
  spec.mutable_data()->mutable_text()->set_inline_text("abcdefghijklmnopqrstuvwxyz");
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_microbatches(4);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.set_steps(10);
  spec.mutable_restart()->set_max_restarts(1);
  spec.mutable_restart()->set_min_stages(min_stages);
  return spec;
}

TEST(JobLifecycleTest, RecoveryStagesAreTheSpecsOrFewerDownToMinStages) {
  // (stages, min_stages, idle) -> stages of the recovery (0: wait).
  struct Case {
    int stages, min_stages, idle, want;
  };
  for (const Case& c : std::vector<Case>{{4, 2, 6, 4},
                                         {4, 2, 4, 4},
                                         {4, 2, 3, 3},
                                         {4, 2, 2, 2},
                                         {4, 2, 1, 0},
                                         {4, 4, 3, 0},
                                         {4, 1, 1, 1},
                                         {3, 1, 0, 0}}) {
    EXPECT_EQ(RecoveryStages(Gpt(c.stages, c.min_stages), c.idle), c.want)
        << c.stages << " stages, min " << c.min_stages << ", " << c.idle << " idle";
  }
  // Fewer stages must still make a valid pipeline: interleaving 2 chunks per stage over
  // 6 blocks fits 3 stages but not... every count down to min is tried, largest first.
  baton::v1::JobSpec interleaved = Gpt(3, 1, /*layers=*/4);
  interleaved.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_INTERLEAVED_1F1B);
  interleaved.mutable_pipeline()->set_virtual_stages(2);
  EXPECT_EQ(RecoveryStages(interleaved, 3), 3);
  const int two = RecoveryStages(interleaved, 2);
  EXPECT_TRUE(two == 2 || two == 1) << two;
  // Replicas: each stage needs data_parallel workers, so 3 idle hold one stage of 2 replicas.
  baton::v1::JobSpec dp = Gpt(2, 1);
  dp.mutable_pipeline()->set_data_parallel(2);
  EXPECT_EQ(RecoveryStages(dp, 4), 2);
  EXPECT_EQ(RecoveryStages(dp, 3), 1);
  EXPECT_EQ(RecoveryStages(dp, 1), 0);
}

}  // namespace
}  // namespace baton
