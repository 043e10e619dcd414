// JobRun end to end in one process: two ranks of a tiny MLP pipeline, each with its own
// inbox and TensorService on loopback, reporting through CoordinatorProgressSink to a fake
// coordinator. The weights a run ends with are compared with the reference trainer's.
#include "worker/job_run.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint.h"
#include "common/rpc/rpc.h"
#include "common/transport/grpc_transport.h"
#include "gtest/gtest.h"
#include "worker/fake_coordinator_client.h"
#include "worker/job_reports.h"
#include "worker/job_test_util.h"

namespace baton {
namespace {

using testing_util::kRanks;
using testing_util::Node;
using testing_util::Plans;
using testing_util::Reference;
using testing_util::StartNode;
using testing_util::TinySpec;
using testing_util::Train;

// The block digests of every rank's result, by block index.
std::map<int, std::string> Digests(const std::vector<JobRun::Outcome>& outcomes) {
  std::map<int, std::string> out;
  for (const JobRun::Outcome& o : outcomes) {
    for (const baton::v1::IndexedBlockDigest& d : o.report.block_digests()) {
      out[d.index()] = d.digest().sha256();
    }
  }
  return out;
}

// The steps rank `rank` reported, in order.
std::vector<int64_t> Steps(const FakeCoordinatorClient& fake, int rank) {
  std::vector<int64_t> steps;
  for (const baton::v1::ReportProgressRequest& p : fake.progress()) {
    if (p.rank() == rank) steps.push_back(p.step());
  }
  return steps;
}

class JobRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < kRanks; ++r) nodes_.push_back(StartNode());
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("job_run_test_", ::testing::UnitTest::GetInstance()->random_seed(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (auto& n : nodes_) n->server->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> a;
    for (const auto& n : nodes_) a.push_back(n->address);
    return a;
  }

  // The jobs' checkpoint.dir: a directory under the checkpoint root (never the root).
  std::string CkptDir() const { return (dir_ / "ckpt").string(); }

  JobRunOptions OptionsFor(int rank) {
    JobRunOptions o;
    o.worker_id = absl::StrCat("w-", rank);
    o.inbox = &nodes_[rank]->inbox;
    o.rendezvous = &nodes_[rank]->box;
    o.channels = MakeTensorChannel;
    o.checkpoint_root = dir_.string();
    return o;
  }

  // Creates and opens a run for each plan in `ranks`, then runs them all at once (as the
  // workers do once every StartJob has been answered); each reports to fake_. `before_run`
  // sees the runs before they start.
  std::vector<JobRun::Outcome> RunRanks(const std::vector<baton::v1::JobPlan>& plans,
                                        const std::vector<int>& ranks) {
    std::vector<std::unique_ptr<JobRun>> runs;
    for (int r : ranks) {
      absl::StatusOr<std::unique_ptr<JobRun>> run = JobRun::Create(plans[r], OptionsFor(r));
      EXPECT_TRUE(run.ok()) << run.status();
      if (!run.ok()) return {};
      runs.push_back(*std::move(run));
    }
    for (auto& run : runs) run->Open();
    std::vector<JobRun::Outcome> outcomes(runs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < runs.size(); ++i) {
      threads.emplace_back([&, i] {
        const int r = ranks[i];
        CoordinatorProgressSink sink(
            &fake_, [r] { return absl::StrCat("w-", r); }, runs[i].get());
        outcomes[i] = runs[i]->Run(&sink);
      });
    }
    for (std::thread& t : threads) t.join();
    return outcomes;
  }

  std::vector<std::unique_ptr<Node>> nodes_;
  std::filesystem::path dir_;
  FakeCoordinatorClient fake_;
};

TEST_F(JobRunTest, TrainsToTheReferenceWeightsAndReportsEveryStep) {
  const baton::v1::JobSpec spec = TinySpec(3);
  const std::vector<JobRun::Outcome> out = RunRanks(Plans(spec, "job-ok", Addresses()), {0, 1});
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(out[r].status.ok()) << out[r].status;
    EXPECT_EQ(out[r].report.job_id(), "job-ok");
    EXPECT_EQ(out[r].report.rank(), r);
    EXPECT_TRUE(out[r].report.error().empty());
    EXPECT_EQ(out[r].report.cause(), baton::v1::FAILURE_CAUSE_UNSPECIFIED);
  }
  const Reference ref = Train(spec, 3);
  EXPECT_EQ(Digests(out), ref.digests);

  // Every rank reported each step once, in order, as its worker; the last stage's rank
  // reported the reference's losses, bit for bit.
  EXPECT_EQ(Steps(fake_, 0), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(Steps(fake_, 1), (std::vector<int64_t>{1, 2, 3}));
  std::vector<float> losses;
  for (const baton::v1::ReportProgressRequest& p : fake_.progress()) {
    EXPECT_EQ(p.worker_id(), absl::StrCat("w-", p.rank()));
    EXPECT_EQ(p.job_id(), "job-ok");
    if (p.rank() == 1) losses.push_back(p.loss());
    // The first step's report says which transport each link uses, and only it.
    if (p.step() == 1) {
      ASSERT_EQ(p.links_size(), 1);
      EXPECT_EQ(p.links(0).rank(), 0);
      EXPECT_EQ(p.links(0).peer(), 1);
      EXPECT_EQ(p.links(0).transport(), "grpc");
      EXPECT_EQ(p.links(0).reason(), "grpc: the job computes on the CPU");
    } else {
      EXPECT_EQ(p.links_size(), 0);
    }
    EXPECT_TRUE(p.has_timing());
  }
  EXPECT_EQ(losses, ref.losses);
}

TEST_F(JobRunTest, APeerThatIsGoneFailsTheRunNamingIt) {
  const baton::v1::JobSpec spec = TinySpec(3);
  std::vector<baton::v1::JobPlan> plans = Plans(spec, "job-peer", Addresses());
  for (baton::v1::JobPlan& p : plans) {
    *p.mutable_recv_timeout() = ToProtoDuration(absl::Seconds(1));
  }
  // Rank 1's worker died before the job started: its port answers no more.
  nodes_[1]->server->Shutdown();
  const std::vector<JobRun::Outcome> out = RunRanks(plans, {0});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].status.ok());
  EXPECT_EQ(out[0].report.cause(), baton::v1::FAILURE_CAUSE_PEER) << out[0].report.error();
  // Rank 0 sends its first activations and waits for their gradient, which never comes
  // (or the send fails first): the error names the rank, and the coordinator blames the peer.
  EXPECT_TRUE(out[0].status.code() == absl::StatusCode::kDeadlineExceeded ||
              out[0].status.code() == absl::StatusCode::kUnavailable)
      << out[0].status;
  EXPECT_NE(out[0].report.error().find("rank 1"), std::string::npos) << out[0].report.error();
  EXPECT_EQ(out[0].report.block_digests_size(), 0);
  EXPECT_TRUE(fake_.progress().empty());
}

TEST_F(JobRunTest, TheCoordinatorStoppingTheJobAbortsEveryRank) {
  const baton::v1::JobSpec spec = TinySpec(1000);
  fake_.StopJobAtStep(2);  // its answer to the step 2 reports: keep_running false
  const std::vector<JobRun::Outcome> out = RunRanks(Plans(spec, "job-abort", Addresses()), {0, 1});
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(out[r].status.code(), absl::StatusCode::kAborted) << out[r].status;
    EXPECT_EQ(out[r].report.cause(), baton::v1::FAILURE_CAUSE_ABORTED);
    EXPECT_EQ(out[r].report.block_digests_size(), 0);
    // No rank goes on past the step the coordinator stopped it at.
    const std::vector<int64_t> steps = Steps(fake_, r);
    ASSERT_FALSE(steps.empty());
    EXPECT_LE(steps.back(), 2);
  }
  // The rank whose step 2 report was answered first stopped with the coordinator's reason;
  // the other either got the same answer or its peer's abort notice, carrying the reason.
  int told = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::string& error = out[r].report.error();
    if (error == "ABORTED: aborted: the coordinator stopped the job") {
      ++told;
    } else {
      EXPECT_NE(
          error.find(absl::StrCat("rank ", 1 - r, " aborted: the coordinator stopped the job")),
          std::string::npos)
          << error;
    }
  }
  EXPECT_GE(told, 1);
}

TEST_F(JobRunTest, AnAbortFromOutsideEndsTheRunWithItsReason) {
  const baton::v1::JobSpec spec = TinySpec(1000);
  std::vector<baton::v1::JobPlan> plans = Plans(spec, "job-stop", Addresses());
  absl::StatusOr<std::unique_ptr<JobRun>> run = JobRun::Create(plans[1], OptionsFor(1));
  ASSERT_TRUE(run.ok()) << run.status();
  (*run)->Open();
  // The worker shuts down while rank 1 waits for rank 0 (which never runs): once its
  // receive is blocked in the inbox (the bound only catches a hang).
  std::thread stop([&] {
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while (nodes_[1]->inbox.Stats().takes_waiting == 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    (*run)->Abort(absl::UnavailableError("worker w-1 is shutting down"));
  });
  CoordinatorProgressSink sink(
      &fake_, [] { return "w-1"; }, run->get());
  const JobRun::Outcome out = (*run)->Run(&sink);
  stop.join();
  EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(out.report.error(), "UNAVAILABLE: aborted: worker w-1 is shutting down");
  EXPECT_EQ(out.report.cause(), baton::v1::FAILURE_CAUSE_SHUTDOWN);
  EXPECT_TRUE((*run)->aborted());
  EXPECT_TRUE(fake_.progress().empty());
}

TEST_F(JobRunTest, ResumesFromACheckpointToTheReferenceWeights) {
  baton::v1::JobSpec spec = TinySpec(4);
  spec.mutable_checkpoint()->set_dir(CkptDir());
  spec.mutable_checkpoint()->set_every_steps(2);
  // The first attempt writes checkpoints after steps 2 and 4.
  std::vector<JobRun::Outcome> first = RunRanks(Plans(spec, "job-ckpt", Addresses()), {0, 1});
  ASSERT_EQ(first.size(), 2u);
  ASSERT_TRUE(first[0].status.ok()) << first[0].status;
  ASSERT_TRUE(first[1].status.ok()) << first[1].status;
  std::vector<int64_t> written;
  for (const baton::v1::ReportProgressRequest& p : fake_.progress()) {
    if (p.rank() == 0) {
      for (const baton::v1::CheckpointWrite& w : p.checkpoints()) written.push_back(w.step());
    }
  }
  EXPECT_EQ(written, (std::vector<int64_t>{2, 4}));

  // A second attempt resumes from step 2 and trains steps 3 and 4 again.
  std::vector<baton::v1::JobPlan> plans = Plans(spec, "job-ckpt", Addresses());
  for (baton::v1::JobPlan& p : plans) {
    p.set_attempt(2);
    p.set_job_key(p.job_key() + 1);
    p.set_resume_job_dir(CheckpointJobDir(CkptDir(), "job-ckpt"));
    p.set_resume_step(2);
  }
  const int64_t reported_before = static_cast<int64_t>(fake_.progress().size());
  std::vector<JobRun::Outcome> second = RunRanks(plans, {0, 1});
  ASSERT_EQ(second.size(), 2u);
  ASSERT_TRUE(second[0].status.ok()) << second[0].status;
  ASSERT_TRUE(second[1].status.ok()) << second[1].status;
  EXPECT_EQ(Digests(second), Train(spec, 4).digests);

  const std::vector<baton::v1::ReportProgressRequest> all = fake_.progress();
  const std::vector<baton::v1::ReportProgressRequest> resumed(all.begin() + reported_before,
                                                              all.end());
  std::vector<int64_t> steps;
  for (const baton::v1::ReportProgressRequest& p : resumed) {
    EXPECT_EQ(p.attempt(), 2);
    if (p.rank() != 0) continue;
    steps.push_back(p.step());
    // The first report after the resume says where it started from.
    EXPECT_EQ(p.resumed_from_step(), p.step() == 3 ? 2 : 0);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4}));
}

// Preempted after step 3 (no checkpoint due then): every rank stops there, rank by rank its
// writes finish and travel with its result, and a later attempt resuming from the job's own
// checkpoints ends with the uninterrupted run's weights.
TEST_F(JobRunTest, APreemptedRunCheckpointsWhereToldAndResumesToTheReferenceWeights) {
  baton::v1::JobSpec spec = TinySpec(6);
  spec.mutable_checkpoint()->set_dir(CkptDir());
  spec.mutable_checkpoint()->set_every_steps(2);
  fake_.PreemptAtStep(3);
  std::vector<JobRun::Outcome> first = RunRanks(Plans(spec, "job-pre", Addresses()), {0, 1});
  ASSERT_EQ(first.size(), 2u);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(first[r].status.ok()) << first[r].status;
    EXPECT_EQ(first[r].report.stopped_after_step(), 3);
    EXPECT_TRUE(first[r].report.error().empty());
    EXPECT_EQ(first[r].report.block_digests_size(), 0);
    EXPECT_EQ(Steps(fake_, r), (std::vector<int64_t>{1, 2, 3}));
    // Step 3's write is in the result (step 2's went with a progress report, or here if
    // it was still in flight then).
    std::vector<int64_t> in_result;
    for (const auto& w : first[r].report.checkpoints()) in_result.push_back(w.step());
    ASSERT_FALSE(in_result.empty());
    EXPECT_EQ(in_result.back(), 3);
  }
  const std::string job_dir = CheckpointJobDir(CkptDir(), "job-pre");
  EXPECT_EQ(ListCheckpointSteps(job_dir), (std::vector<int64_t>{2, 3}));

  fake_.PreemptAtStep(0);
  std::vector<baton::v1::JobPlan> plans = Plans(spec, "job-pre", Addresses());
  for (baton::v1::JobPlan& p : plans) {
    p.set_attempt(1);
    p.set_job_key(p.job_key() + 1);
    p.set_resume_job_dir(job_dir);
    p.set_resume_step(0);  // the newest complete: step 3's
  }
  std::vector<JobRun::Outcome> second = RunRanks(plans, {0, 1});
  ASSERT_EQ(second.size(), 2u);
  ASSERT_TRUE(second[0].status.ok()) << second[0].status;
  ASSERT_TRUE(second[1].status.ok()) << second[1].status;
  EXPECT_EQ(second[0].report.stopped_after_step(), 0);
  EXPECT_EQ(Digests(second), Train(spec, 6).digests);
  for (const baton::v1::ReportProgressRequest& p : fake_.progress()) {
    if (p.attempt() == 1 && p.step() == 4) {
      EXPECT_EQ(p.resumed_from_step(), 3);
    }
  }
}

// Told to stop on a step whose checkpoint was just taken, a rank takes no second one.
TEST_F(JobRunTest, APreemptionOnACheckpointStepWritesItOnce) {
  baton::v1::JobSpec spec = TinySpec(6);
  spec.mutable_checkpoint()->set_dir(CkptDir());
  spec.mutable_checkpoint()->set_every_steps(2);
  fake_.PreemptAtStep(4);
  std::vector<JobRun::Outcome> out = RunRanks(Plans(spec, "job-pre4", Addresses()), {0, 1});
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(out[r].status.ok()) << out[r].status;
    EXPECT_EQ(out[r].report.stopped_after_step(), 4);
    std::vector<int64_t> written;
    for (const auto& p : fake_.progress()) {
      if (p.rank() != r) continue;
      for (const auto& w : p.checkpoints()) written.push_back(w.step());
    }
    for (const auto& w : out[r].report.checkpoints()) written.push_back(w.step());
    EXPECT_EQ(written, (std::vector<int64_t>{2, 4})) << "rank " << r;
  }
  EXPECT_EQ(ListCheckpointSteps(CheckpointJobDir(CkptDir(), "job-pre4")),
            (std::vector<int64_t>{2, 4}));
}

}  // namespace
}  // namespace baton
