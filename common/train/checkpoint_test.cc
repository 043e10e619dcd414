// Checkpoints (common/checkpoint/checkpoint.h) of models trained by the reference trainer:
// written, verified, read back and resumed bit-exact. Beside the trainer, which it needs.
#include "common/checkpoint/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "common/checkpoint/safetensors.h"
#include "common/core/file.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

baton::v1::JobSpec Spec(const std::string& json) {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(json);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// SGD with momentum: the first update is special (momentum starts from the gradient), so a
// resume must restore the step count as well as the buffers.
const char kMlpSgd[] = R"({
  "model": {"mlp": {"inputDim": 6, "width": 16, "depth": 3, "outputDim": 2}},
  "data": {"synthetic": {"teacherWidth": 8}, "batchSize": 16},
  "pipeline": {"microbatches": 2},
  "optimizer": {"sgd": {"learningRate": 0.05, "momentum": 0.9}},
  "steps": 6, "seed": 7})";

// AdamW: bias correction depends on the step count.
const char kGptAdamW[] = R"({
  "model": {"gpt": {"vocabSize": 40, "context": 16, "dModel": 32, "heads": 2, "layers": 2}},
  "data": {"text": {"inlineText": "the quick brown fox jumps over the lazy dog, again and again."},
           "batchSize": 8},
  "pipeline": {"microbatches": 2},
  "optimizer": {"adamw": {"learningRate": 0.003}},
  "steps": 5, "seed": 3})";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("ckpt-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<ReferenceTrainer> Trainer(const char* json) {
    absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(Spec(json));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  static void Steps(ReferenceTrainer& t, int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(t.Step().ok());
  }
  static std::vector<std::string> BlockNames(const ReferenceTrainer& t) {
    std::vector<std::string> out;
    for (const BlockInfo& b : DescribeBlocks(t.spec().model())) out.push_back(b.name);
    return out;
  }
  std::string JobDir() const { return (dir_ / "job-000001").string(); }

  fs::path dir_;
};

// The headline: stop after k steps, resume in a fresh trainer, finish; the weights are the
// uninterrupted run's, bit for bit, for every stopping point and both optimizers.
TEST_F(CheckpointTest, ResumeEndsWithTheUninterruptedDigest) {
  for (const char* json : {kMlpSgd, kGptAdamW}) {
    auto straight = Trainer(json);
    const int steps = static_cast<int>(straight->spec().steps());
    Steps(*straight, steps);
    const std::string want = DigestHex(straight->WeightsDigest());
    for (int k = 1; k < steps; ++k) {
      fs::remove_all(dir_);
      auto first = Trainer(json);
      Steps(*first, k);
      absl::StatusOr<std::vector<CheckpointBlockFile>> files =
          first->SaveCheckpoint(JobDir(), "job-000001");
      ASSERT_TRUE(files.ok()) << files.status();
      EXPECT_EQ(files->size(), BlockNames(*first).size());
      auto resumed = Trainer(json);
      ASSERT_TRUE(resumed->LoadCheckpoint(CheckpointStepDir(JobDir(), k)).ok());
      EXPECT_EQ(resumed->steps_done(), k);
      EXPECT_EQ(DigestHex(resumed->WeightsDigest()), DigestHex(first->WeightsDigest()));
      Steps(*resumed, steps - k);
      EXPECT_EQ(DigestHex(resumed->WeightsDigest()), want) << "resumed after step " << k;
    }
  }
}

// Without the optimizer state a resumed run differs, so the check above can fail: resume
// the same checkpoint, then forget the moments and the step count as a weights-only resume
// would.
TEST_F(CheckpointTest, OptimizerStateMatters) {
  auto straight = Trainer(kGptAdamW);
  Steps(*straight, 4);
  auto first = Trainer(kGptAdamW);
  Steps(*first, 2);
  ASSERT_TRUE(first->SaveCheckpoint(JobDir(), "j").ok());
  auto weights_only = Trainer(kGptAdamW);
  ASSERT_TRUE(weights_only->LoadCheckpoint(CheckpointStepDir(JobDir(), 2)).ok());
  for (const Optimizer::Slot& slot : weights_only->optimizer().Slots()) slot.state->SetZero();
  weights_only->optimizer().set_steps_taken(0);
  Steps(*weights_only, 2);
  EXPECT_NE(DigestHex(weights_only->WeightsDigest()), DigestHex(straight->WeightsDigest()));
}

TEST_F(CheckpointTest, FilesAreSafetensorsWithManifestHashes) {
  auto t = Trainer(kMlpSgd);
  Steps(*t, 2);
  absl::StatusOr<std::vector<CheckpointBlockFile>> files = t->SaveCheckpoint(JobDir(), "job-7");
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string step_dir = CheckpointStepDir(JobDir(), 2);
  EXPECT_TRUE(fs::exists(fs::path(step_dir) / "manifest.rank-0.json"));
  absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(step_dir);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->step, 2);
  EXPECT_EQ(index->blocks.size(), 4u);  // hidden.0..2, out
  EXPECT_EQ(index->num_blocks, 4);
  EXPECT_EQ(*CheckpointBlockOrder(*index), BlockNames(*t));
  const CheckpointBlockFile& f = index->blocks.at("hidden.1");
  EXPECT_EQ(f.file, "hidden.1.safetensors");
  EXPECT_EQ(f.index, 1);
  absl::StatusOr<std::string> bytes = ReadFile((fs::path(step_dir) / f.file).string());
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(static_cast<int64_t>(bytes->size()), f.bytes);
  absl::StatusOr<Safetensors> st = ParseSafetensors(*bytes);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->metadata.at("format"), kCheckpointFormat);
  EXPECT_EQ(st->metadata.at("job"), "job-7");
  EXPECT_EQ(st->metadata.at("step"), "2");
  EXPECT_EQ(st->metadata.at("block"), "hidden.1");
  EXPECT_EQ(st->metadata.at("optimizer_steps"), "2");
  EXPECT_THAT(st->order, ::testing::ElementsAre(
                             "hidden.1.weight", "hidden.1.bias",
                             "optimizer.momentum_buffer.hidden.1.weight",
                             "optimizer.momentum_buffer.hidden.1.bias"));
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(step_dir)) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr(".tmp")));
  }
  EXPECT_TRUE(VerifyCheckpoint(step_dir, BlockNames(*t)).ok());
}

TEST_F(CheckpointTest, ACorruptedFileIsSkippedForAnOlderCheckpoint) {
  auto t = Trainer(kMlpSgd);
  for (int s = 1; s <= 3; ++s) {
    Steps(*t, 1);
    ASSERT_TRUE(t->SaveCheckpoint(JobDir(), "j").ok());
  }
  // Flip one byte of step 3's "out" block.
  const fs::path victim = fs::path(CheckpointStepDir(JobDir(), 3)) / "out.safetensors";
  std::string bytes = *ReadFile(victim.string());
  bytes[bytes.size() - 1] ^= 0x01;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  std::vector<std::string> skipped;
  absl::StatusOr<int64_t> latest = LatestCompleteCheckpoint(JobDir(), BlockNames(*t), -1, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 2);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("step 3 skipped: block out:"));
  EXPECT_THAT(skipped[0], HasSubstr("SHA-256"));
  // Loading the corrupted step directly is refused, naming the file.
  auto fresh = Trainer(kMlpSgd);
  absl::Status s = fresh->LoadCheckpoint(CheckpointStepDir(JobDir(), 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("out.safetensors has SHA-256"));
  // "At or before step 1" picks step 1.
  EXPECT_EQ(*LatestCompleteCheckpoint(JobDir(), BlockNames(*t), 1, nullptr), 1);
  EXPECT_EQ(LatestCompleteCheckpoint(JobDir(), BlockNames(*t), 0, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, AStepMissingABlockIsNotComplete) {
  auto t = Trainer(kMlpSgd);
  Steps(*t, 1);
  ASSERT_TRUE(t->SaveCheckpoint(JobDir(), "j").ok());
  std::vector<std::string> names = BlockNames(*t);
  names.push_back("hidden.9");
  absl::Status s = VerifyCheckpoint(CheckpointStepDir(JobDir(), 1), names);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no file for block hidden.9"));
  EXPECT_EQ(VerifyCheckpoint(CheckpointStepDir(JobDir(), 5), BlockNames(*t)).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, ACheckpointOfAnotherModelOrOptimizerIsRefusedNamingTheTensor) {
  auto t = Trainer(kMlpSgd);
  Steps(*t, 1);
  ASSERT_TRUE(t->SaveCheckpoint(JobDir(), "j").ok());
  const std::string step_dir = CheckpointStepDir(JobDir(), 1);
  // A wider model: the shapes differ.
  std::string wider = kMlpSgd;
  wider.replace(wider.find("\"width\": 16"), 11, "\"width\": 24");
  auto w = ReferenceTrainer::Create(Spec(wider));
  ASSERT_TRUE(w.ok());
  absl::Status s = (*w)->LoadCheckpoint(step_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("hidden.0.weight is f32[16,6] in the checkpoint but f32[24,6]"));
  // AdamW instead of SGD: its moments are missing.
  std::string adam = kMlpSgd;
  adam.replace(adam.find("\"sgd\": {\"learningRate\": 0.05, \"momentum\": 0.9}"),
               std::string("\"sgd\": {\"learningRate\": 0.05, \"momentum\": 0.9}").size(),
               "\"adamw\": {\"learningRate\": 0.01}");
  auto a = ReferenceTrainer::Create(Spec(adam));
  ASSERT_TRUE(a.ok()) << a.status();
  s = (*a)->LoadCheckpoint(step_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has no tensor optimizer.exp_avg.hidden.0.weight"));
  // SGD without momentum: the checkpoint has tensors it does not.
  std::string plain = kMlpSgd;
  plain.replace(plain.find("\"momentum\": 0.9"), 15, "\"momentum\": 0");
  auto p = ReferenceTrainer::Create(Spec(plain));
  ASSERT_TRUE(p.ok()) << p.status();
  s = (*p)->LoadCheckpoint(step_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("which this model and optimizer do not"));
}

TEST_F(CheckpointTest, PruneKeepsTheNewestCompleteOnes) {
  auto t = Trainer(kMlpSgd);
  for (int s = 1; s <= 4; ++s) {
    Steps(*t, 1);
    ASSERT_TRUE(t->SaveCheckpoint(JobDir(), "j").ok());
  }
  // Step 5 is being written: a directory with no manifest yet.
  fs::create_directories(CheckpointStepDir(JobDir(), 5));
  absl::StatusOr<std::vector<int64_t>> deleted = PruneCheckpoints(JobDir(), BlockNames(*t), 2);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ListCheckpointSteps(JobDir()), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_FALSE(PruneCheckpoints(JobDir(), BlockNames(*t), 0).ok());
  EXPECT_TRUE(ListCheckpointSteps((dir_ / "nothing").string()).empty());
}

TEST_F(CheckpointTest, ExportHoldsEveryWeightInBlockOrderAndNoOptimizerState) {
  auto t = Trainer(kGptAdamW);
  Steps(*t, 2);
  ASSERT_TRUE(t->SaveCheckpoint(JobDir(), "job-9").ok());
  absl::StatusOr<std::string> bytes = ExportWeights(CheckpointStepDir(JobDir(), 2));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Safetensors> st = ParseSafetensors(*bytes);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->metadata.at("job"), "job-9");
  EXPECT_EQ(st->metadata.at("step"), "2");
  std::vector<Parameter*> params = t->model().Parameters();
  ASSERT_EQ(st->order.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(st->order[i], params[i]->name);
    const SafetensorsEntry& e = st->tensors.at(params[i]->name);
    ASSERT_EQ(e.shape, params[i]->value.shape());
    EXPECT_EQ(std::memcmp(e.data.data(), params[i]->value.f32(), e.data.size()), 0)
        << params[i]->name;
  }
}

TEST_F(CheckpointTest, WritesAreAtomicAndTheDirectoryIsChecked) {
  const std::string path = (dir_ / "a" / "f.bin").string();
  fs::create_directories(dir_ / "a");
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "world!").ok());
  EXPECT_EQ(*ReadFile(path), "world!");
  EXPECT_EQ(ReadFile((dir_ / "none").string()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(CheckCheckpointDirWritable((dir_ / "new" / "deeper").string()).ok());
  // A path under a regular file cannot be a directory.
  absl::Status s = CheckCheckpointDirWritable(path + "/sub");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint directory"));
  EXPECT_FALSE(WriteFileAtomically((dir_ / "missing" / "f").string(), "x").ok());
}

}  // namespace
}  // namespace baton
