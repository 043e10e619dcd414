#include "common/train/reference_trainer.h"

#include <chrono>
#include <cmath>
#include <string>

#include "common/core/backend.h"
#include "common/core/part_profiler.h"
#include "common/spec/spec.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

baton::v1::JobSpec Spec(const std::string& json) {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(json);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

const char kTinyMlp[] = R"({
  "model": {"mlp": {"inputDim": 6, "width": 16, "depth": 3, "outputDim": 2}},
  "data": {"synthetic": {"teacherWidth": 8}, "batchSize": 32},
  "pipeline": {"microbatches": 4},
  "optimizer": {"sgd": {"learningRate": 0.05, "momentum": 0.9}},
  "steps": 60, "seed": 7})";

// Big enough that OpenBLAS splits its GEMMs over two threads.
const char kSmallGpt[] = R"({
  "model": {"gpt": {"vocabSize": 70, "context": 32, "dModel": 64, "heads": 4, "layers": 2}},
  "data": {"text": {"inlineText": "the quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG! 0123456789, again and again and again."},
           "batchSize": 16},
  "pipeline": {"microbatches": 2},
  "optimizer": {"adamw": {"learningRate": 0.003}},
  "steps": 3, "seed": 11})";

struct TrainedRun {
  std::vector<float> losses;
  std::string digest;
};

TrainedRun Train(const baton::v1::JobSpec& spec) {
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  TrainedRun r;
  for (int i = 0; i < spec.steps(); ++i) {
    absl::StatusOr<StepStats> s = (*t)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return r;
    r.losses.push_back(s->loss);
  }
  r.digest = DigestHex((*t)->WeightsDigest());
  return r;
}

TEST(ReferenceTrainerTest, MlpLossFalls) {
  const TrainedRun r = Train(Spec(kTinyMlp));
  ASSERT_EQ(r.losses.size(), 60u);
  EXPECT_LT(r.losses.back(), 0.5f * r.losses.front())
      << "first " << r.losses.front() << " last " << r.losses.back();
}

TEST(ReferenceTrainerTest, SameSpecSameBits) {
  for (const char* json : {kTinyMlp, kSmallGpt}) {
    const TrainedRun a = Train(Spec(json));
    const TrainedRun b = Train(Spec(json));
    EXPECT_EQ(a.digest, b.digest);
    EXPECT_EQ(a.losses, b.losses);  // exact float equality, step by step
  }
}

// The part profiler (gpt_bench --parts) runs the CPU backend's kernels unchanged, and every
// kernel a GPT's step calls falls into its part.
TEST(ReferenceTrainerTest, APartProfiledRunHasTheSameBitsAndCountsEveryPart) {
  for (const char* precision : {"PRECISION_FP32", "PRECISION_BF16"}) {
    baton::v1::JobSpec spec = Spec(kSmallGpt);
    spec.set_precision(precision == std::string("PRECISION_BF16") ? baton::v1::PRECISION_BF16
                                                                  : baton::v1::PRECISION_FP32);
    spec.mutable_optimizer()->set_clip_grad_norm(1.0f);  // the clipping norm: whole-tensor sums
    const TrainedRun plain = Train(spec);
    PartProfiler profiler(CpuBackend(), spec.model().gpt().vocab_size());
    SetBackendOverride(Device::kCpu, &profiler);
    const auto t0 = std::chrono::steady_clock::now();
    const TrainedRun profiled = Train(spec);
    const int64_t run_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    SetBackendOverride(Device::kCpu, nullptr);
    ASSERT_TRUE(profiler.Collect().ok());
    EXPECT_EQ(profiled.digest, plain.digest) << precision;
    EXPECT_EQ(profiled.losses, plain.losses) << precision;
    int64_t timed_ns = 0;
    for (int p = 0; p < kStepParts; ++p) {
      const PartProfiler::Part& part = profiler.totals()[p];
      EXPECT_GT(part.calls, 0) << precision << ": " << StepPartName(static_cast<StepPart>(p));
      timed_ns += part.ns;
    }
    // The calls' times are disjoint intervals of the run: none is counted twice.
    EXPECT_LE(timed_ns, run_ns) << precision;
  }
}

TEST(ReferenceTrainerTest, BlasThreadsDoNotChangeTheBits) {
  const int before = BlasThreads();
  SetBlasThreads(1);
  const TrainedRun one = Train(Spec(kSmallGpt));
  SetBlasThreads(2);
  const TrainedRun two = Train(Spec(kSmallGpt));
  SetBlasThreads(before);
  EXPECT_EQ(one.digest, two.digest);
  EXPECT_EQ(one.losses, two.losses);
}

TEST(ReferenceTrainerTest, SeedChangesTheWeights) {
  baton::v1::JobSpec spec = Spec(kSmallGpt);
  spec.set_steps(1);
  const TrainedRun a = Train(spec);
  spec.set_seed(spec.seed() + 1);
  const TrainedRun b = Train(spec);
  EXPECT_NE(a.digest, b.digest);
}

TEST(ReferenceTrainerTest, GptStartsNearUniformLoss) {
  baton::v1::JobSpec spec = Spec(kSmallGpt);
  spec.set_steps(1);
  const TrainedRun r = Train(spec);
  ASSERT_EQ(r.losses.size(), 1u);
  // Small initial weights give nearly uniform predictions over the 70 token ids.
  EXPECT_NEAR(r.losses[0], std::log(70.0f), 0.1f);
}

TEST(ReferenceTrainerTest, MicroBatchingKeepsTheLossOfTheFirstStep) {
  // The global batch does not depend on M, and equal-size micro-batch means average to the
  // batch mean; only float rounding differs.
  baton::v1::JobSpec spec = Spec(kSmallGpt);
  spec.set_steps(1);
  spec.mutable_pipeline()->set_microbatches(1);
  const TrainedRun m1 = Train(spec);
  spec.mutable_pipeline()->set_microbatches(4);
  const TrainedRun m4 = Train(spec);
  ASSERT_EQ(m1.losses.size(), 1u);
  ASSERT_EQ(m4.losses.size(), 1u);
  EXPECT_NEAR(m1.losses[0], m4.losses[0], 1e-5f);
}

TEST(ReferenceTrainerTest, BadSpecIsRefusedWithTheField) {
  baton::v1::JobSpec spec = Spec(kSmallGpt);
  spec.mutable_model()->mutable_gpt()->set_heads(5);
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("model.gpt.heads"), absl::string_view::npos)
      << t.status();
}

TEST(ReferenceTrainerTest, VocabularyTooSmallForTheTextIsRefused) {
  baton::v1::JobSpec spec = Spec(kSmallGpt);
  spec.mutable_model()->mutable_gpt()->set_vocab_size(10);
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("model.gpt.vocab_size"), absl::string_view::npos)
      << t.status();
}

TEST(ReferenceTrainerTest, ExampleSpecsLoadAndTrainAStep) {
  for (const char* name : {"mlp-tiny.json", "gpt.json"}) {
    const std::string path = std::string(BATON_SOURCE_DIR) + "/client/examples/" + name;
    absl::StatusOr<baton::v1::JobSpec> spec = LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->set_steps(1);
    const TrainedRun r = Train(*spec);
    ASSERT_EQ(r.losses.size(), 1u) << name;
    EXPECT_TRUE(std::isfinite(r.losses[0])) << name;
  }
}

}  // namespace
}  // namespace baton
