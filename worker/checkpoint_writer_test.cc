#include "worker/checkpoint_writer.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/core/file.h"
#include "common/nn/model.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

const char kMlp[] = R"({
  "model": {"mlp": {"inputDim": 6, "width": 16, "depth": 3, "outputDim": 2}},
  "data": {"synthetic": {"teacherWidth": 8}, "batchSize": 16},
  "pipeline": {"microbatches": 2},
  "optimizer": {"adamw": {"learningRate": 0.01}},
  "steps": 8, "seed": 7})";

class CheckpointWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("writer-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    absl::StatusOr<baton::v1::JobSpec> spec = ParseJobSpecJson(kMlp);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_TRUE(ValidateAndDefaultJobSpec(&*spec).ok());
    absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(*spec);
    ASSERT_TRUE(t.ok()) << t.status();
    trainer_ = *std::move(t);
    for (const BlockInfo& b : DescribeBlocks(spec->model())) names_.push_back(b.name);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string JobDir() const { return (dir_ / "job-000001").string(); }

  fs::path dir_;
  std::unique_ptr<ReferenceTrainer> trainer_;
  std::vector<std::string> names_;
};

// Snapshots taken between steps and written in the background end as the same complete
// checkpoints a synchronous save writes; every write is returned once; pruning keeps `keep`.
TEST_F(CheckpointWriterTest, BackgroundWritesAreCompleteReportedOnceAndPruned) {
  CheckpointWriter writer(JobDir(), names_, /*keep=*/2);
  std::vector<int64_t> reported;
  for (int step = 1; step <= 6; ++step) {
    ASSERT_TRUE(trainer_->Step().ok());
    if (step % 2 == 0) {
      absl::StatusOr<CheckpointSnapshot> snap = trainer_->SnapshotCheckpoint(JobDir(), "job-000001");
      ASSERT_TRUE(snap.ok()) << snap.status();
      writer.Start(*std::move(snap), step, absl::Milliseconds(1));
    }
    for (const CheckpointWriter::Done& d : writer.Poll()) {
      ASSERT_TRUE(d.status.ok()) << d.status;
      EXPECT_GT(d.bytes, 0);
      EXPECT_GE(d.stall, absl::Milliseconds(1));
      reported.push_back(d.step);
    }
  }
  for (const CheckpointWriter::Done& d : writer.Wait()) reported.push_back(d.step);
  EXPECT_EQ(reported, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_TRUE(writer.Wait().empty()) << "each write is returned once";
  // The model moved on after each snapshot; the files hold the state at the snapshot.
  EXPECT_TRUE(VerifyCheckpoint(CheckpointStepDir(JobDir(), 6), names_).ok());
  EXPECT_EQ(ListCheckpointSteps(JobDir()), (std::vector<int64_t>{4, 6}));
  const std::string async_dir = (dir_ / "async").string();
  fs::rename(CheckpointStepDir(JobDir(), 6), async_dir);
  ASSERT_TRUE(trainer_->SaveCheckpoint(JobDir(), "job-000001").ok());  // step 6, synchronously
  for (const BlockInfo& b : DescribeBlocks(trainer_->spec().model())) {
    const std::string file = b.name + ".safetensors";
    absl::StatusOr<std::string> a = ReadFile((fs::path(async_dir) / file).string());
    absl::StatusOr<std::string> s = ReadFile((fs::path(CheckpointStepDir(JobDir(), 6)) / file).string());
    ASSERT_TRUE(a.ok() && s.ok()) << file;
    EXPECT_TRUE(*a == *s) << file << " differs between the background and the synchronous save";
  }
}

TEST_F(CheckpointWriterTest, AFailedWriteIsReportedWithItsStep) {
  const fs::path blocker = dir_ / "file";
  fs::create_directories(dir_);
  { std::ofstream(blocker.string()) << "x"; }
  const std::string job_dir = (blocker / "job").string();  // under a regular file
  CheckpointWriter writer(job_dir, names_, 2);
  ASSERT_TRUE(trainer_->Step().ok());
  absl::StatusOr<CheckpointSnapshot> snap = trainer_->SnapshotCheckpoint(job_dir, "job-000001");
  ASSERT_TRUE(snap.ok());
  writer.Start(*std::move(snap), 1, absl::ZeroDuration());
  std::vector<CheckpointWriter::Done> done = writer.Wait();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].status.ok());
  EXPECT_EQ(std::string(done[0].status.message()).rfind("checkpoint after step 1: ", 0), 0u)
      << done[0].status;
}

}  // namespace
}  // namespace baton
