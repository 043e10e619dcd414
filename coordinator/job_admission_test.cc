#include "coordinator/job_admission.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

baton::v1::SubmitJobRequest Request(int stages = 2) {
  baton::v1::SubmitJobRequest r;
  baton::v1::JobSpec* spec = r.mutable_spec();
  spec->set_name("test");
  baton::v1::MlpSpec* mlp = spec->mutable_model()->mutable_mlp();
  mlp->set_input_dim(4);
  mlp->set_width(8);
  mlp->set_depth(3);
  mlp->set_output_dim(2);
  spec->mutable_data()->mutable_synthetic();
  spec->mutable_data()->set_batch_size(8);
  spec->mutable_pipeline()->set_stages(stages);
  spec->mutable_pipeline()->set_microbatches(2);
  spec->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec->set_steps(4);
  spec->set_seed(3);
  return r;
}

TEST(AdmitTest, ValidatesAndDefaultsOnce) {
  baton::v1::SubmitJobRequest r = Request();
  r.set_submission_id("run-1");
  r.mutable_spec()->mutable_checkpoint()->set_every_steps(2);
  r.mutable_spec()->mutable_checkpoint()->set_dir("/shared/ckpt");
  const absl::StatusOr<AdmittedJob> a = Admit(r, "alice", AdmissionOptions{}, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->submission_id, "run-1");
  EXPECT_EQ(a->rank_needs.size(), 2u);
  EXPECT_EQ(a->spec->checkpoint().keep(), 2);  // defaulted
  EXPECT_TRUE(SameSubmission(*a->spec, *a->spec));
}

TEST(AdmitTest, RefusesWhatCannotRunNamingTheField) {
  struct Case {
    const char* name;
    baton::v1::SubmitJobRequest request;
    std::string starts;
  };
  baton::v1::SubmitJobRequest long_id = Request();
  long_id.set_submission_id(std::string(129, 'x'));
  baton::v1::SubmitJobRequest climbing = Request();
  climbing.mutable_spec()->mutable_init()->set_from_hf("models/../../etc");
  baton::v1::SubmitJobRequest no_steps = Request();
  no_steps.mutable_spec()->set_steps(0);
  const std::vector<Case> cases = {
      {"no spec", baton::v1::SubmitJobRequest(), "spec: required"},
      {"a long submission id", long_id, "submission_id: at most 128"},
      {"a model path climbing out", climbing, "init.from_hf:"},
      {"no steps", no_steps, "steps:"},
  };
  AdmissionOptions options;
  options.data_roots = {"/data"};
  for (const Case& c : cases) {
    const absl::StatusOr<AdmittedJob> a = Admit(c.request, "alice", options, nullptr);
    ASSERT_FALSE(a.ok()) << c.name;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(a.status().message().substr(0, c.starts.size()), c.starts)
        << c.name << ": " << a.status();
  }
}

TEST(CheckQuotaTest, PriorityAndQueuedJobs) {
  QuotaLimits limits;
  limits.max_priority = 5;
  limits.max_queued = 2;
  EXPECT_TRUE(CheckQuota(limits, "bob", "submitter", 5, 1).ok());
  EXPECT_EQ(CheckQuota(limits, "bob", "submitter", 6, 0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckQuota(limits, "bob", "submitter", 1, 2).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckQuota(QuotaLimits(), "bob", "admin", 100, 1000).ok());
}

TEST(NewJobRecordTest, QueuedWithItsCheckpointDirectory) {
  baton::v1::SubmitJobRequest r = Request();
  r.set_submission_id("run-1");
  r.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt/alice");
  r.mutable_spec()->mutable_checkpoint()->set_every_steps(2);
  absl::StatusOr<AdmittedJob> a = Admit(r, "alice", AdmissionOptions{}, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  const baton::v1::Job job =
      NewJobRecord("job-000003", "alice", "submitter", baton::v1::JobCheckpoints(), now, &*a);
  EXPECT_EQ(job.id(), "job-000003");
  EXPECT_EQ(job.state(), baton::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.submission_id(), "run-1");
  EXPECT_EQ(job.submitted_role(), "submitter");
  EXPECT_EQ(job.checkpoints().job_dir(), "/ckpt/alice/job-000003");
  ASSERT_EQ(job.history_size(), 1);
  EXPECT_EQ(job.history(0).reason(), "submitted");
}

}  // namespace
}  // namespace baton
