#include "coordinator/placement_round.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

// A RUNNING job that writes checkpoints, on two workers that each reported `step`.
ActiveJob Running(int64_t step) {
  ActiveJob j;
  j.job.set_id("job-000001");
  j.job.set_state(baton::v1::JOB_STATE_RUNNING);
  j.job.mutable_spec()->set_steps(100);
  j.job.mutable_spec()->set_priority(3);
  j.job.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  for (int r = 0; r < 2; ++r) {
    RankSlot slot;
    slot.worker.worker_id = absl::StrCat("w-", r);
    slot.reported_step = step;
    j.ranks.push_back(slot);
  }
  j.running_since = kNow - absl::Minutes(5);
  j.placed_at = kNow - absl::Minutes(6);
  return j;
}

TEST(RunningJobOfTest, PreemptibleOnlyWhenItCanStopAtACheckpointSoon) {
  struct Case {
    const char* name;
    void (*setup)(ActiveJob*);  // may be null
    bool preemptible;
    bool protected_now;
  };
  const std::vector<Case> cases = {
      {"running, checkpointing, every rank reported", nullptr, true, false},
      {"writes no checkpoints", [](ActiveJob* j) { j->job.mutable_spec()->clear_checkpoint(); },
       false, false},
      {"still placing", [](ActiveJob* j) { j->job.set_state(baton::v1::JOB_STATE_PLACING); }, false,
       false},
      {"already being preempted", [](ActiveJob* j) { j->preempt_step = 9; }, false, false},
      {"waiting out an echo", [](ActiveJob* j) { j->echo.reason = "aborted"; }, false, false},
      {"a rank not yet reported", [](ActiveJob* j) { j->ranks[1].reported_step = 0; }, false,
       false},
      {"no step left after the next", [](ActiveJob* j) { j->job.mutable_spec()->set_steps(11); },
       false, false},
      {"just resumed", [](ActiveJob* j) { j->running_since = kNow - absl::Seconds(10); }, true,
       true},
      {"trained too few steps", [](ActiveJob* j) { j->attempt_first_step = 10; }, true, true},
  };
  for (const Case& c : cases) {
    ActiveJob j = Running(10);
    if (c.setup) c.setup(&j);
    const RunningJob r = RunningJobOf(j, {}, kNow, absl::Minutes(1), 1);
    EXPECT_EQ(r.id, "job-000001");
    EXPECT_EQ(r.priority, 3);
    EXPECT_EQ(r.started, kNow - absl::Minutes(6));
    EXPECT_EQ(r.preemptible, c.preemptible) << c.name;
    EXPECT_EQ(!r.protection.empty(), c.protected_now) << c.name << ": " << r.protection;
  }
}

TEST(NoPreemptReasonTest, UntilTheBarEnds) {
  EXPECT_EQ(NoPreemptReason("bob", "job-000007", kNow + absl::Minutes(1), kNow),
            "bob's job-000007 preempted other jobs and ended without training a step, so bob's "
            "jobs may not preempt until 2023-11-14 22:14:20 UTC");
  EXPECT_EQ(NoPreemptReason("bob", "job-000007", kNow, kNow), "");
}

TEST(QueuedJobOfTest, ReadsTheJobsOwnSpecAndNeeds) {
  ActiveJob j = Running(0);
  j.job.set_state(baton::v1::JOB_STATE_QUEUED);
  j.job.set_submitted_by("carol");
  j.rank_needs = {100, 300};
  j.seq = 12;
  const QueuedJob q = QueuedJobOf(j, false, true, QuotaLimits(), "");
  EXPECT_EQ(q.spec.get(), &j.job.spec());
  EXPECT_EQ(q.rank_needs.get(), &j.rank_needs);
  EXPECT_EQ(q.rank_need_bytes, 300);
  EXPECT_EQ(q.user, "carol");
  EXPECT_EQ(q.seq, 12);
  EXPECT_FALSE(q.recovering);
  EXPECT_TRUE(q.preempting);
  j.job.set_state(baton::v1::JOB_STATE_RECOVERING);
  const QueuedJob again = QueuedJobOf(j, true, false, QuotaLimits(), "barred");
  EXPECT_TRUE(again.recovering);
  EXPECT_TRUE(again.stopping);
  EXPECT_EQ(again.rank_needs, nullptr);  // re-planned: the stages may change
  EXPECT_EQ(again.no_preempt, "barred");
}

TEST(WaitIsNewsTest, OnlyWhatItWaitsForCounts) {
  baton::v1::Job job;
  job.set_state(baton::v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(WaitIsNews(job, "waiting for 2 workers (0 idle)"));
  baton::v1::StateChange* last = job.add_history();
  last->set_state(baton::v1::JOB_STATE_QUEUED);
  last->set_reason("waiting for 2 workers (0 idle)");
  EXPECT_FALSE(WaitIsNews(job, "waiting for 2 workers (1 idle)"));
  EXPECT_TRUE(WaitIsNews(job, "over max_workers (4 held)"));
  job.set_state(baton::v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(WaitIsNews(job, "waiting for 2 workers (1 idle)"));
}

TEST(RecordPlacementTest, RecordsTheRanksAndARecoverysStagesAfter) {
  ActiveJob j;
  j.job.set_id("job-000001");
  baton::v1::Recovery* r = j.job.add_recoveries();
  r->set_stages_before(3);
  baton::v1::JobSpec spec;
  spec.mutable_pipeline()->set_stages(2);
  std::vector<PlacedWorker> placed(2);
  placed[0].worker_id = "w-4";
  placed[1].worker_id = "w-5";
  Placement placement;
  placement.plans.resize(2);
  const std::string reason =
      RecordPlacement(spec, placed, /*again=*/true, ResumePoint{"/ckpt/job-000001", 40},
                      "cpu: any worker", &placement, &j);
  EXPECT_EQ(reason,
            "placing on w-4, w-5 (recovery 1: 3 -> 2 stages, from step 40; cpu: any worker)");
  ASSERT_EQ(j.ranks.size(), 2u);
  EXPECT_EQ(j.ranks[1].worker.worker_id, "w-5");
  EXPECT_EQ(j.job.workers_size(), 2);
  EXPECT_EQ(j.job.recoveries(0).stages_after(), 2);
  EXPECT_EQ(j.job.recoveries(0).workers_after_size(), 2);
  for (const baton::v1::JobPlan& plan : placement.plans) {
    EXPECT_EQ(plan.attempt(), 1);
    EXPECT_EQ(plan.resume_job_dir(), "/ckpt/job-000001");
    EXPECT_EQ(plan.resume_step(), 40);
  }
}

}  // namespace
}  // namespace baton
