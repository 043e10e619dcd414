#include "coordinator/job_tallies.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/core/digest.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

baton::v1::CheckpointWrite Write(int64_t step, int64_t bytes, absl::Duration took) {
  baton::v1::CheckpointWrite w;
  w.set_step(step);
  w.set_bytes(bytes);
  *w.mutable_duration() = ToProtoDuration(took);
  return w;
}

std::vector<int64_t> CompleteSteps(const baton::v1::JobCheckpoints& c) {
  std::vector<int64_t> out;
  for (const auto& r : c.complete()) out.push_back(r.step());
  return out;
}

// ---- Checkpoints ----

TEST(CheckpointTallyTest, CompleteOnceEveryWriterWroteItsPart) {
  CheckpointTallies tallies;
  baton::v1::JobCheckpoints c;
  EXPECT_FALSE(TallyCheckpointWrite(0, Write(4, 100, absl::Seconds(1)), 3, 2, kNow, &tallies, &c));
  EXPECT_FALSE(TallyCheckpointWrite(2, Write(4, 50, absl::Seconds(3)), 3, 2, kNow, &tallies, &c));
  // A repeat counts once.
  EXPECT_FALSE(TallyCheckpointWrite(2, Write(4, 50, absl::Seconds(3)), 3, 2, kNow, &tallies, &c));
  EXPECT_TRUE(c.complete().empty());
  const std::optional<CheckpointTally> t =
      TallyCheckpointWrite(1, Write(4, 25, absl::Seconds(2)), 3, 2, kNow, &tallies, &c);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->bytes, 175);
  EXPECT_EQ(t->write_time, absl::Seconds(3));  // the slowest rank's
  EXPECT_EQ(t->ranks, (std::set<int>{0, 1, 2}));
  ASSERT_EQ(c.complete_size(), 1);
  EXPECT_EQ(c.complete(0).step(), 4);
  EXPECT_EQ(c.complete(0).bytes(), 175);
  EXPECT_EQ(FromProtoTime(c.complete(0).time()), kNow);
  EXPECT_EQ(FromProtoDuration(c.complete(0).write_time()), absl::Seconds(3));
  EXPECT_TRUE(tallies.empty());
}

TEST(CheckpointTallyTest, KeepsTheNewestAndIgnoresStepsNotNewerThanThem) {
  CheckpointTallies tallies;
  baton::v1::JobCheckpoints c;
  // One writer: every write completes its step; keep 2.
  for (int64_t step : {2, 4, 6}) {
    EXPECT_TRUE(
        TallyCheckpointWrite(0, Write(step, 1, absl::Seconds(1)), 1, 2, kNow, &tallies, &c));
  }
  EXPECT_EQ(CompleteSteps(c), (std::vector<int64_t>{4, 6}));
  // A late write of an older (or the same) step changes nothing.
  EXPECT_FALSE(TallyCheckpointWrite(0, Write(6, 1, absl::Seconds(1)), 1, 2, kNow, &tallies, &c));
  EXPECT_FALSE(TallyCheckpointWrite(0, Write(3, 1, absl::Seconds(1)), 1, 2, kNow, &tallies, &c));
  EXPECT_EQ(CompleteSteps(c), (std::vector<int64_t>{4, 6}));
  EXPECT_TRUE(tallies.empty());
  // keep 0 keeps one.
  EXPECT_TRUE(TallyCheckpointWrite(0, Write(8, 1, absl::Seconds(1)), 1, 0, kNow, &tallies, &c));
  EXPECT_EQ(CompleteSteps(c), (std::vector<int64_t>{8}));
}

TEST(CheckpointTallyTest, ACompleteStepDropsTheUnfinishedOlderOnes) {
  CheckpointTallies tallies;
  baton::v1::JobCheckpoints c;
  // Step 2 never completes (rank 1's part was lost); step 4 does.
  EXPECT_FALSE(TallyCheckpointWrite(0, Write(2, 1, absl::Seconds(1)), 2, 3, kNow, &tallies, &c));
  EXPECT_FALSE(TallyCheckpointWrite(0, Write(4, 1, absl::Seconds(1)), 2, 3, kNow, &tallies, &c));
  EXPECT_FALSE(TallyCheckpointWrite(0, Write(6, 1, absl::Seconds(1)), 2, 3, kNow, &tallies, &c));
  EXPECT_TRUE(TallyCheckpointWrite(1, Write(4, 1, absl::Seconds(1)), 2, 3, kNow, &tallies, &c));
  EXPECT_EQ(CompleteSteps(c), (std::vector<int64_t>{4}));
  ASSERT_EQ(tallies.size(), 1u);
  EXPECT_EQ(tallies.begin()->first, 6);
  // Rank 1's late part of step 2 is ignored.
  EXPECT_FALSE(TallyCheckpointWrite(1, Write(2, 1, absl::Seconds(1)), 2, 3, kNow, &tallies, &c));
  EXPECT_EQ(tallies.size(), 1u);
}

// ---- Resume points ----

baton::v1::Job JobWith(int recoveries, std::vector<int64_t> complete, std::string resumed_dir,
                       int64_t resumed_step, int64_t asked_step) {
  baton::v1::Job job;
  job.set_id("job-000002");
  for (int i = 0; i < recoveries; ++i) job.add_recoveries();
  baton::v1::JobCheckpoints* c = job.mutable_checkpoints();
  c->set_job_dir("/ckpt/job-000002");
  for (int64_t s : complete) c->add_complete()->set_step(s);
  if (!resumed_dir.empty()) {
    c->set_resumed_from_job("job-000001");
    c->set_resumed_from_dir(resumed_dir);
    c->set_resumed_from_step(resumed_step);
    job.mutable_spec()->mutable_resume_from()->set_job_id("job-000001");
    job.mutable_spec()->mutable_resume_from()->set_step(asked_step);
  }
  return job;
}

TEST(ResumePointTest, ByAttemptAndWhatTheJobHas) {
  struct Case {
    const char* name;
    baton::v1::Job job;
    std::string dir;
    int64_t step;
    int64_t recorded;
  };
  const std::vector<Case> cases = {
      {"a fresh job starts from the seed", JobWith(0, {}, "", 0, 0), "", 0, 0},
      {"a fresh job with checkpoints of its own still starts from the seed",
       JobWith(0, {4}, "", 0, 0), "", 0, 4},
      {"a recovery without a checkpoint: the seed again", JobWith(1, {}, "", 0, 0), "", 0, 0},
      {"a recovery: its own newest, as the ranks find it", JobWith(1, {4, 8}, "", 0, 0),
       "/ckpt/job-000002", 0, 8},
      {"resume, the newest", JobWith(0, {}, "/ckpt/job-000001", 6, 0), "/ckpt/job-000001", 0, 6},
      {"resume, the step asked for", JobWith(0, {}, "/ckpt/job-000001", 6, 6), "/ckpt/job-000001",
       6, 6},
      {"a resumed job recovering before its own checkpoint",
       JobWith(1, {}, "/ckpt/job-000001", 6, 6), "/ckpt/job-000001", 6, 6},
      {"a resumed job recovering after its own checkpoint",
       JobWith(1, {10}, "/ckpt/job-000001", 6, 6), "/ckpt/job-000002", 0, 10},
  };
  for (const Case& c : cases) {
    const ResumePoint p = ResumePointOf(c.job);
    EXPECT_EQ(p.dir, c.dir) << c.name;
    EXPECT_EQ(p.step, c.step) << c.name;
    EXPECT_EQ(RecordedResumeStep(c.job.checkpoints()), c.recorded) << c.name;
  }
}

TEST(FailureFactsTest, FromTheJobsRecord) {
  baton::v1::Job job = JobWith(2, {4, 8}, "", 0, 0);
  job.set_state(baton::v1::JOB_STATE_RUNNING);
  job.set_steps_done(11);
  job.mutable_spec()->mutable_restart()->set_max_restarts(3);
  job.mutable_recoveries(1)->set_cause(baton::v1::FAILURE_CAUSE_DIVERGED);
  const FailureFacts f = FailureFactsOf(job, baton::v1::FAILURE_CAUSE_WORKER_LOST);
  EXPECT_EQ(f.state, baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(f.cause, baton::v1::FAILURE_CAUSE_WORKER_LOST);
  EXPECT_EQ(f.max_restarts, 3);
  EXPECT_EQ(f.restarts_done, 2);
  EXPECT_TRUE(f.diverged_before);
  EXPECT_EQ(f.steps_done, 11);
  EXPECT_EQ(f.resume_step, 8);
  // A preemption is recorded beside the recoveries but uses up no restart.
  job.add_recoveries()->set_preempted_by("job-000009");
  EXPECT_EQ(FailureFactsOf(job, baton::v1::FAILURE_CAUSE_WORKER_LOST).restarts_done, 2);

  baton::v1::Job plain;
  const FailureFacts none = FailureFactsOf(plain, baton::v1::FAILURE_CAUSE_CONFIG);
  EXPECT_EQ(none.max_restarts, 0);
  EXPECT_FALSE(none.diverged_before);
  EXPECT_EQ(none.resume_step, 0);
}

// ---- Resume bookkeeping ----

baton::v1::ReportProgressRequest Resumed(int rank, int64_t step,
                                         std::vector<std::string> skipped = {}) {
  baton::v1::ReportProgressRequest r;
  r.set_rank(rank);
  r.set_step(step + 1);
  r.set_resumed_from_step(step);
  for (const std::string& s : skipped) r.add_checkpoints_skipped(s);
  return r;
}

TEST(ResumeTallyTest, TheFirstRankNotesItAndTheOthersMustAgree) {
  baton::v1::Job job = JobWith(0, {}, "/ckpt/job-000001", 6, 0);
  std::map<int, int64_t> resumed;
  ResumeTally t = TallyResume(Resumed(1, 6), &resumed, &job);
  EXPECT_EQ(t.failure, "");
  EXPECT_EQ(t.note, "resumed from job-000001 step 6");
  EXPECT_EQ(job.steps_done(), 6);
  EXPECT_EQ(job.checkpoints().resumed_from_step(), 6);
  // The others: nothing more to say while they agree; a rank's later reports change nothing.
  t = TallyResume(Resumed(0, 6), &resumed, &job);
  EXPECT_EQ(t.failure, "");
  EXPECT_EQ(t.note, "");
  t = TallyResume(Resumed(1, 4), &resumed, &job);
  EXPECT_EQ(t.failure, "");
  t = TallyResume(Resumed(2, 4), &resumed, &job);
  EXPECT_EQ(t.failure,
            "ranks resumed from different checkpoints: rank 0 from step 6, rank 2 from step 4");
}

TEST(ResumeTallyTest, SaysWhatWasSkipped) {
  {
    baton::v1::Job job = JobWith(0, {}, "/ckpt/job-000001", 8, 8);
    std::map<int, int64_t> resumed;
    const ResumeTally t = TallyResume(Resumed(0, 4, {"step 8: damaged"}), &resumed, &job);
    EXPECT_EQ(t.note,
              "resumed from job-000001 step 4 (asked for step 8; skipped: step 8: damaged)");
    EXPECT_EQ(job.checkpoints().resumed_from_step(), 4);
  }
  {
    baton::v1::Job job = JobWith(0, {}, "/ckpt/job-000001", 8, 0);
    std::map<int, int64_t> resumed;
    const ResumeTally t = TallyResume(Resumed(0, 4, {"a", "b"}), &resumed, &job);
    EXPECT_EQ(t.note, "resumed from job-000001 step 4 (the newest complete; skipped: a; b)");
  }
}

TEST(ResumeTallyTest, ARecoveryCorrectsItsRecordToWhatTheRanksLoaded) {
  baton::v1::Job job = JobWith(1, {8}, "", 0, 0);
  baton::v1::Recovery* r = job.mutable_recoveries(0);
  r->set_from_step(8);
  r->set_lost_steps(3);  // 11 steps done when the failure was detected
  job.set_steps_done(8);
  std::map<int, int64_t> resumed;
  const ResumeTally t = TallyResume(Resumed(0, 10), &resumed, &job);
  EXPECT_EQ(t.note, "resumed from its own checkpoint step 10");
  EXPECT_EQ(job.recoveries(0).from_step(), 10);
  EXPECT_EQ(job.recoveries(0).lost_steps(), 1);
  EXPECT_EQ(job.steps_done(), 10);
  EXPECT_EQ(job.checkpoints().resumed_from_step(), 0);  // the first attempt's, untouched
}

baton::v1::Job EndedSource() {
  baton::v1::Job source;
  source.set_id("job-000001");
  source.set_submitted_by("alice");
  source.set_state(baton::v1::JOB_STATE_SUCCEEDED);
  source.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt");
  source.mutable_spec()->mutable_model()->mutable_mlp()->set_width(8);
  source.mutable_spec()->mutable_optimizer()->mutable_sgd();
  source.mutable_checkpoints()->set_job_dir("/ckpt/job-000001");
  for (int64_t s : {4, 8}) source.mutable_checkpoints()->add_complete()->set_step(s);
  return source;
}

baton::v1::JobSpec Resuming(int64_t step) {
  baton::v1::JobSpec spec;
  spec.set_steps(20);
  spec.mutable_model()->mutable_mlp()->set_width(8);
  spec.mutable_optimizer()->mutable_sgd();
  spec.mutable_resume_from()->set_job_id("job-000001");
  spec.mutable_resume_from()->set_step(step);
  return spec;
}

TEST(ResumeSourceTest, AcceptsAnEndedJobsCompleteCheckpoint) {
  baton::v1::JobCheckpoints c;
  ASSERT_TRUE(CheckResumeSource(Resuming(0), EndedSource(), true, "alice", false, &c).ok());
  EXPECT_EQ(c.resumed_from_job(), "job-000001");
  EXPECT_EQ(c.resumed_from_step(), 8);  // the newest
  EXPECT_EQ(c.resumed_from_dir(), "/ckpt/job-000001");
  baton::v1::JobCheckpoints named;
  ASSERT_TRUE(CheckResumeSource(Resuming(4), EndedSource(), true, "bob", true, &named).ok());
  EXPECT_EQ(named.resumed_from_step(), 4);
}

TEST(ResumeSourceTest, RefusesNamingTheField) {
  auto code_and_message = [](const baton::v1::JobSpec& spec, const baton::v1::Job& source,
                             bool ended, bool admin) {
    baton::v1::JobCheckpoints c;
    const absl::Status s = CheckResumeSource(spec, source, ended, "bob", admin, &c);
    EXPECT_TRUE(c.resumed_from_job().empty());
    return std::make_pair(s.code(), std::string(s.message()));
  };
  using absl::StatusCode;
  auto [code, message] = code_and_message(Resuming(0), EndedSource(), true, false);
  EXPECT_EQ(code, StatusCode::kPermissionDenied);
  EXPECT_EQ(message.rfind("resume_from.job_id: job-000001 was submitted by alice", 0), 0u)
      << message;

  baton::v1::Job running = EndedSource();
  running.set_state(baton::v1::JOB_STATE_RUNNING);
  std::tie(code, message) = code_and_message(Resuming(0), running, false, true);
  EXPECT_EQ(code, StatusCode::kInvalidArgument);
  EXPECT_EQ(message.rfind("resume_from.job_id: job-000001 is still RUNNING", 0), 0u) << message;

  baton::v1::Job empty = EndedSource();
  empty.mutable_checkpoints()->clear_complete();
  std::tie(code, message) = code_and_message(Resuming(0), empty, true, true);
  EXPECT_EQ(message,
            "resume_from.job_id: job-000001 has no complete checkpoint (it ended "
            "before every rank wrote one)");

  std::tie(code, message) = code_and_message(Resuming(6), EndedSource(), true, true);
  EXPECT_EQ(code, StatusCode::kInvalidArgument);
  EXPECT_EQ(message,
            "resume_from.step: job-000001 has no complete checkpoint after step 6 (it "
            "keeps steps 4, 8)");

  baton::v1::JobSpec wider = Resuming(0);
  wider.mutable_model()->mutable_mlp()->set_width(16);
  std::tie(code, message) = code_and_message(wider, EndedSource(), true, true);
  EXPECT_EQ(message.rfind("resume_from: the spec's model differs", 0), 0u) << message;

  baton::v1::JobSpec adam = Resuming(0);
  adam.mutable_optimizer()->mutable_adamw();
  std::tie(code, message) = code_and_message(adam, EndedSource(), true, true);
  EXPECT_EQ(message.rfind("resume_from: the spec's optimizer differs in kind", 0), 0u) << message;

  baton::v1::JobSpec short_run = Resuming(0);
  short_run.set_steps(8);
  std::tie(code, message) = code_and_message(short_run, EndedSource(), true, true);
  EXPECT_EQ(code, StatusCode::kInvalidArgument);
  EXPECT_EQ(message.rfind("steps: 8 leaves nothing to train", 0), 0u) << message;
}

// ---- Progress ----

TEST(ReplicaLossTest, TheMeanOnceEveryReplicaReported) {
  ReplicaLosses losses;
  EXPECT_FALSE(TallyReplicaLoss(1, 1, 3.0f, 2, &losses).has_value());
  EXPECT_FALSE(TallyReplicaLoss(2, 0, 5.0f, 2, &losses).has_value());
  const std::optional<float> mean = TallyReplicaLoss(1, 0, 1.0f, 2, &losses);
  ASSERT_TRUE(mean.has_value());
  EXPECT_FLOAT_EQ(*mean, 2.0f);
  ASSERT_EQ(losses.size(), 1u);  // step 2 still waits
  EXPECT_EQ(losses.begin()->first, 2);
  // A replica reporting again replaces its loss, not adds one.
  EXPECT_FALSE(TallyReplicaLoss(2, 0, 7.0f, 2, &losses).has_value());
  const std::optional<float> second = TallyReplicaLoss(2, 1, 1.0f, 2, &losses);
  ASSERT_TRUE(second.has_value());
  EXPECT_FLOAT_EQ(*second, 4.0f);
  EXPECT_TRUE(losses.empty());
}

TEST(StepProgressTest, DurationThroughputAndTheRanksTimings) {
  baton::v1::JobSpec spec;
  spec.set_steps(10);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_model()->mutable_mlp()->set_width(4);
  baton::v1::RankTiming own;
  *own.mutable_step() = ToProtoDuration(absl::Milliseconds(500));
  EXPECT_EQ(StepDuration(own, absl::Seconds(3)), absl::Milliseconds(500));
  EXPECT_EQ(StepDuration(baton::v1::RankTiming(), absl::Seconds(3)), absl::Seconds(3));

  std::map<int, baton::v1::RankTiming> timings;
  timings[1] = own;
  timings[1].set_peak_inflight(3);
  *timings[0].mutable_forward() = ToProtoDuration(absl::Milliseconds(7));
  const baton::v1::StepProgress p =
      MakeStepProgress(spec, 4, 2.5f, absl::Milliseconds(500), timings, {"w-a", "w-b"});
  EXPECT_EQ(p.step(), 4);
  EXPECT_EQ(p.total_steps(), 10);
  EXPECT_FLOAT_EQ(p.loss(), 2.5f);
  EXPECT_DOUBLE_EQ(p.samples_per_second(), 16.0);
  EXPECT_DOUBLE_EQ(p.tokens_per_second(), 16.0);  // not a language model: samples
  EXPECT_EQ(FromProtoDuration(p.duration()), absl::Milliseconds(500));
  ASSERT_EQ(p.stages_size(), 2);
  EXPECT_EQ(p.stages(0).rank(), 0);
  EXPECT_EQ(p.stages(0).worker_id(), "w-a");
  EXPECT_EQ(FromProtoDuration(p.stages(0).forward()), absl::Milliseconds(7));
  EXPECT_EQ(p.stages(1).worker_id(), "w-b");
  EXPECT_EQ(p.stages(1).peak_inflight(), 3);

  // No loss (not the last rank's word), no duration: neither is made up.
  const baton::v1::StepProgress bare =
      MakeStepProgress(spec, 5, std::nullopt, absl::ZeroDuration(), {}, {});
  EXPECT_EQ(bare.loss(), 0);
  EXPECT_EQ(bare.samples_per_second(), 0);
  EXPECT_EQ(bare.tokens_per_second(), 0);
  EXPECT_EQ(bare.stages_size(), 0);
}

TEST(StepProgressTest, ModelFlopsAndMfuFromTheBlocksAndTheDevicesPeaks) {
  baton::v1::JobSpec spec;
  spec.set_steps(10);
  spec.mutable_data()->set_batch_size(4);
  // Two blocks of 1e9 and 2e9 forward FLOPs per sample: 3 x 3e9 x 4 = 3.6e10 per step.
  const std::vector<BlockInfo> blocks = {{"a", 0, 1'000'000'000, 0}, {"b", 0, 2'000'000'000, 0}};
  EXPECT_DOUBLE_EQ(TrainingFlops(blocks, 0, 2, 4), 3.6e10);
  baton::v1::DeviceInfo gpu;
  gpu.set_peak_flops(67e12);
  baton::v1::DeviceInfo unknown;
  EXPECT_DOUBLE_EQ(PeakFlopsOf({gpu, gpu}), 134e12);
  EXPECT_EQ(PeakFlopsOf({gpu, unknown}), 0);  // one unknown peak: no MFU, not a guess
  // A bf16 job divides by the bf16 peaks.
  gpu.set_peak_flops_bf16(989e12);
  EXPECT_DOUBLE_EQ(PeakFlopsOf({gpu, gpu}, /*bf16=*/true), 1978e12);
  EXPECT_EQ(PeakFlopsOf({gpu, unknown}, /*bf16=*/true), 0);

  StepExtras extras;
  extras.learning_rate = 3e-4f;
  extras.grad_norm = 1.25f;
  extras.val_loss = 2.0f;
  extras.model_flops_per_step = 3.6e10;
  extras.peak_flops = 72e9;
  const baton::v1::StepProgress p =
      MakeStepProgress(spec, 2, 2.5f, absl::Milliseconds(500), {}, {}, extras);
  EXPECT_FLOAT_EQ(p.learning_rate(), 3e-4f);
  EXPECT_FLOAT_EQ(p.grad_norm(), 1.25f);
  EXPECT_FLOAT_EQ(p.val_loss(), 2.0f);
  EXPECT_DOUBLE_EQ(p.model_tflops(), 0.072);  // 3.6e10 / 0.5 s
  EXPECT_DOUBLE_EQ(p.mfu(), 1.0);
  // Without a peak, or a norm or validation that step: absent, not zero-valued fields.
  extras.peak_flops = 0;
  extras.grad_norm.reset();
  extras.val_loss.reset();
  const baton::v1::StepProgress q =
      MakeStepProgress(spec, 3, 2.5f, absl::Milliseconds(500), {}, {}, extras);
  EXPECT_EQ(q.mfu(), 0);
  EXPECT_FALSE(q.has_grad_norm());
  EXPECT_FALSE(q.has_val_loss());
}

TEST(StepTimingsTest, KeepsTheRecentSteps) {
  StepTimings timings;
  for (int64_t s = 1; s <= 20; ++s) timings[s][0] = baton::v1::RankTiming();
  PruneStepTimings(20, &timings);
  EXPECT_EQ(timings.begin()->first, 20 - kKeptStepTimings);
  EXPECT_EQ(timings.rbegin()->first, 20);
}

// ---- Links and groups ----

baton::v1::LinkReport Link(int rank, int peer, const std::string& transport) {
  baton::v1::LinkReport l;
  l.set_rank(rank);
  l.set_peer(peer);
  l.set_transport(transport);
  l.set_reason(transport + ": why");
  return l;
}

TEST(LinkTallyTest, TheLowerRanksWordOncePerPair) {
  baton::v1::PipelineReport report;
  baton::v1::ReportProgressRequest r1;
  r1.set_rank(1);
  *r1.add_links() = Link(0, 1, "grpc");  // rank 1 is the pair's higher rank: not its word
  *r1.add_links() = Link(1, 2, "nccl");
  EXPECT_EQ(TallyLinks(r1, &report), "links: ranks 1-2 nccl: why");
  ASSERT_EQ(report.links_size(), 1);
  EXPECT_EQ(report.links(0).transport(), "nccl");
  // Said again: nothing new.
  EXPECT_EQ(TallyLinks(r1, &report), "");
  baton::v1::ReportProgressRequest r0;
  r0.set_rank(0);
  *r0.add_links() = Link(0, 1, "grpc");
  EXPECT_EQ(TallyLinks(r0, &report), "links: ranks 0-1 grpc: why");
  EXPECT_EQ(report.links_size(), 2);
  EXPECT_EQ(TallyLinks(baton::v1::ReportProgressRequest(), &report), "");
}

TEST(GroupTallyTest, TheFirstReportOfEachGroup) {
  baton::v1::PipelineReport report;
  baton::v1::ReportProgressRequest r;
  for (int rank : {0, 1}) {
    baton::v1::GroupReport* g = r.add_groups();
    g->set_rank(rank);
    g->set_engine("gloo");
    g->set_mode("ordered");
    g->set_reason("cpu");
  }
  EXPECT_EQ(TallyGroups(r, &report),
            "data-parallel groups: rank 0 gloo ordered (cpu); rank 1 gloo ordered (cpu)");
  EXPECT_EQ(report.groups_size(), 2);
  // Another replica's word on the same groups: kept out.
  r.mutable_groups(0)->set_engine("nccl");
  EXPECT_EQ(TallyGroups(r, &report), "");
  EXPECT_EQ(report.groups(0).engine(), "gloo");
}

// ---- Results ----

// Two stages (blocks 0-1 on rank 0, block 2 on rank 1), two replicas: ranks 0-1 and 2-3.
PipelineLayout TwoStages() {
  PipelineLayout l;
  l.schedule.num_ranks = 2;
  l.rank_blocks = {{0, 1}, {2}};
  l.blocks.resize(3);
  for (int b = 0; b < 3; ++b) l.blocks[b].name = "b" + std::to_string(b);
  return l;
}

std::string Hex(char c) { return std::string(64, c); }

baton::v1::ReportResultRequest Result(int rank, std::map<int, std::string> digests) {
  baton::v1::ReportResultRequest r;
  r.set_worker_id("w-" + std::to_string(rank));
  r.set_rank(rank);
  for (const auto& [b, hex] : digests) {
    baton::v1::IndexedBlockDigest* d = r.add_block_digests();
    d->set_index(b);
    d->mutable_digest()->set_sha256(hex);
  }
  return r;
}

TEST(ResultDigestsTest, EveryOwnedBlockWellFormedAndNoOther) {
  const PipelineLayout layout = TwoStages();
  std::map<int, std::string> digests;
  EXPECT_EQ(TallyResultDigests(Result(1, {{1, Hex('a')}}), layout, &digests),
            "rank 1 on worker w-1 reported a digest for block 1, which it does not own");
  EXPECT_EQ(TallyResultDigests(Result(1, {{2, "xyz"}}), layout, &digests),
            "rank 1 on worker w-1 reported a malformed digest for block 2: \"xyz\"");
  EXPECT_EQ(TallyResultDigests(Result(1, {{2, Hex('g')}}), layout, &digests),
            "rank 1 on worker w-1 reported a malformed digest for block 2: \"" + Hex('g') + "\"");
  EXPECT_EQ(TallyResultDigests(Result(0, {{0, Hex('a')}}), layout, &digests),
            "rank 0 on worker w-0 finished without a digest for block 1 (b1)");
  EXPECT_TRUE(digests.empty());
  // Upper-case hex is accepted and kept in lower case.
  EXPECT_EQ(TallyResultDigests(Result(0, {{0, Hex('A')}, {1, Hex('b')}}), layout, &digests), "");
  EXPECT_EQ(digests, (std::map<int, std::string>{{0, Hex('a')}, {1, Hex('b')}}));
}

TEST(ResultDigestsTest, ReplicasMustAgree) {
  const PipelineLayout layout = TwoStages();
  std::map<int, std::string> digests;
  ASSERT_EQ(TallyResultDigests(Result(1, {{2, Hex('c')}}), layout, &digests), "");
  // Rank 3 is replica 1's second stage: the same block 2.
  EXPECT_EQ(TallyResultDigests(Result(3, {{2, Hex('c')}}), layout, &digests), "");
  EXPECT_EQ(TallyResultDigests(Result(3, {{2, Hex('d')}}), layout, &digests),
            "rank 3 on worker w-3 (replica 1) ended block 2 with digest dddddddddddddddd..., "
            "another replica with cccccccccccccccc...: the replicas diverged");
  EXPECT_EQ(digests.at(2), Hex('c'));
}

TEST(ResultDigestsTest, FinalDigestsInBlockOrder) {
  const PipelineLayout layout = TwoStages();
  const std::map<int, std::string> digests = {{2, Hex('c')}, {0, Hex('a')}, {1, Hex('b')}};
  baton::v1::Job job;
  job.add_block_digests()->set_block("stale");
  SetFinalDigests(layout, digests, &job);
  ASSERT_EQ(job.block_digests_size(), 3);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(job.block_digests(b).block(), "b" + std::to_string(b));
    EXPECT_EQ(job.block_digests(b).sha256(), digests.at(b));
  }
  std::vector<Digest> blocks;
  for (char c : {'\xaa', '\xbb', '\xcc'}) {
    Digest d;
    d.fill(static_cast<uint8_t>(c));
    blocks.push_back(d);
  }
  EXPECT_EQ(job.weights_digest(), DigestHex(CombineBlockDigests(blocks)));
}

baton::v1::ReportResultRequest Failed(const std::string& error, baton::v1::FailureCause cause) {
  baton::v1::ReportResultRequest r;
  r.set_error(error);
  r.set_cause(cause);
  return r;
}

TEST(RankResultTest, DecidesFailSucceedOrWait) {
  using Action = ResultVerdict::Action;
  using baton::v1::FailureCause;
  struct Case {
    const char* name;
    std::string error;
    FailureCause cause;
    std::string failure;
    bool all_reported, all_finished;
    Action action;
    FailureCause verdict_cause;
  };
  const FailureCause kUnspecified = baton::v1::FAILURE_CAUSE_UNSPECIFIED;
  const std::vector<Case> cases = {
      {"one finished, others running", "", kUnspecified, "", false, false, Action::kNone,
       kUnspecified},
      {"the last one finished", "", kUnspecified, "", true, true, Action::kSucceed, kUnspecified},
      {"a bad digest fails at once as internal", "", kUnspecified, "rank 0 ...: bad digest", false,
       false, Action::kFail, baton::v1::FAILURE_CAUSE_INTERNAL},
      {"an error without a cause is internal", "boom", kUnspecified, "rank 0: boom", false, false,
       Action::kFail, baton::v1::FAILURE_CAUSE_INTERNAL},
      {"a root cause fails at once", "out of memory", baton::v1::FAILURE_CAUSE_CONFIG,
       "rank 0: out of memory", false, false, Action::kFail, baton::v1::FAILURE_CAUSE_CONFIG},
      {"an echo waits while others run", "aborted", baton::v1::FAILURE_CAUSE_ABORTED,
       "rank 0: aborted", false, false, Action::kNone, kUnspecified},
      {"a peer error waits too", "link broke", baton::v1::FAILURE_CAUSE_PEER, "rank 0: link broke",
       false, false, Action::kNone, kUnspecified},
      {"an echo fails once every rank reported", "aborted", baton::v1::FAILURE_CAUSE_ABORTED,
       "rank 0: aborted", true, false, Action::kFail, baton::v1::FAILURE_CAUSE_ABORTED},
  };
  for (const Case& c : cases) {
    EchoFailure echo;
    const ResultVerdict v = OnRankResult(Failed(c.error, c.cause), c.failure, c.all_reported,
                                         c.all_finished, kNow, &echo);
    EXPECT_EQ(v.action, c.action) << c.name;
    if (c.action == Action::kFail) {
      EXPECT_EQ(v.reason, c.failure) << c.name;
      EXPECT_EQ(v.cause, c.verdict_cause) << c.name;
    }
  }
}

TEST(RankResultTest, ThePeerEchoOutranksTheAbortedOneAndWaitsForTheLastReport) {
  using Action = ResultVerdict::Action;
  EchoFailure echo;
  ResultVerdict v = OnRankResult(Failed("aborted", baton::v1::FAILURE_CAUSE_ABORTED),
                                 "rank 2: aborted", false, false, kNow, &echo);
  EXPECT_EQ(v.action, Action::kNone);
  EXPECT_EQ(echo.reason, "rank 2: aborted");
  EXPECT_EQ(echo.since, kNow);
  v = OnRankResult(Failed("link to rank 1", baton::v1::FAILURE_CAUSE_PEER),
                   "rank 0: link to rank 1", false, false, kNow + absl::Seconds(1), &echo);
  EXPECT_EQ(v.action, Action::kNone);
  EXPECT_EQ(echo.reason, "rank 0: link to rank 1");
  EXPECT_EQ(echo.cause, baton::v1::FAILURE_CAUSE_PEER);
  EXPECT_EQ(echo.since, kNow);  // since the first
  // A later ABORTED one does not replace it.
  v = OnRankResult(Failed("aborted", baton::v1::FAILURE_CAUSE_ABORTED), "rank 3: aborted", false,
                   false, kNow, &echo);
  EXPECT_EQ(echo.reason, "rank 0: link to rank 1");
  // The last rank finishes cleanly: the echo stands.
  v = OnRankResult(baton::v1::ReportResultRequest(), "", true, false, kNow, &echo);
  EXPECT_EQ(v.action, Action::kFail);
  EXPECT_EQ(v.reason, "rank 0: link to rank 1");
  EXPECT_EQ(v.cause, baton::v1::FAILURE_CAUSE_PEER);
}

}  // namespace
}  // namespace baton
