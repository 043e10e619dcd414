// Pipelines with the fused (flash-style) attention core (common/nn/attention_core.h) equal
// the reference trainer bit for bit, as with the materialised one: both take the same
// kernels. Runs with BATON_FUSED_ATTENTION=1 (set before main); built again as
// tiled_pipeline_test with BATON_TEST_TILED_ATTENTION, whose jobs ask for the tiled kernels
// in their spec (JobSpec.attention, nothing in the environment): bf16 jobs with head size
// 16 and sequences of more than one tile (flash_tiles.h).
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/cuda_device.h"
#include "common/core/cuda_test_util.h"
#include "common/core/digest.h"
#include "common/pipeline/local_pipeline.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

#ifdef BATON_TEST_TILED_ATTENTION
const bool kFusedRequested = true;
bool Requested() { return !FusedAttentionRequested() && !TiledAttentionRequested(); }
constexpr baton::v1::AttentionKernel kSpecAttention = baton::v1::ATTENTION_KERNEL_TILED;
constexpr AttentionKernel kTaken = AttentionKernel::kTiled;
// Head size 16 (the tiles' multiple), 72 positions: two query tiles, the second partial.
constexpr const char* kContext = "72";
constexpr const char* kGptWidth = R"("dModel": 32, "heads": 2)";
constexpr const char* kLlamaWidth = R"("dModel": 32, "heads": 2, "kvHeads": 1)";
const std::vector<baton::v1::Precision> kPrecisions = {baton::v1::PRECISION_BF16};
#else
const bool kFusedRequested = [] { return setenv("BATON_FUSED_ATTENTION", "1", 1) == 0; }();
bool Requested() { return FusedAttentionRequested(); }
constexpr baton::v1::AttentionKernel kSpecAttention = baton::v1::ATTENTION_KERNEL_UNSPECIFIED;
constexpr AttentionKernel kTaken = AttentionKernel::kFused;
constexpr const char* kContext = "8";
constexpr const char* kGptWidth = R"("dModel": 16, "heads": 2)";
constexpr const char* kLlamaWidth = R"("dModel": 16, "heads": 4, "kvHeads": 2)";
const std::vector<baton::v1::Precision> kPrecisions = {baton::v1::PRECISION_FP32,
                                                       baton::v1::PRECISION_BF16};
#endif

// Built twice, as pipeline_test: cuda_fused_pipeline_test (label gpu) runs on one GPU and
// skips without one (fails instead under BATON_REQUIRE_GPU).
#ifdef BATON_TEST_DEVICE_CUDA
constexpr baton::v1::DeviceKind kTestDevice = baton::v1::DEVICE_KIND_CUDA;
const testing::Environment* const kRequireCuda =
    testing::AddGlobalTestEnvironment(new RequireCudaEnvironment());
#else
constexpr baton::v1::DeviceKind kTestDevice = baton::v1::DEVICE_KIND_CPU;
#endif

baton::v1::JobSpec Job(const std::string& model) {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(absl::StrCat(R"({"model": )", model, R"(,
    "data": {"text": {"inlineText": "pipelines must agree with the reference to the last bit, always. pipelines must agree with the reference to the last bit, always."},
             "batchSize": 24},
    "optimizer": {"adamw": {"learningRate": 0.01}},
    "pipeline": {"microbatches": 4},
    "steps": 3, "seed": 9})"));
  EXPECT_TRUE(s.ok()) << s.status();
  s->set_device(kTestDevice);
  return *s;
}

TEST(FusedPipelineTest, EveryScheduleFamilyEqualsTheReferenceInFp32AndBf16) {
  ASSERT_TRUE(kFusedRequested && Requested());
  const std::vector<std::string> models = {
      absl::StrCat(R"({"gpt": {"vocabSize": 30, "context": )", kContext, ", ", kGptWidth,
                   R"(, "layers": 4}})"),
      absl::StrCat(R"({"llama": {"vocabSize": 30, "context": )", kContext, ", ", kLlamaWidth,
                   R"(, "layers": 4, "intermediateSize": 24, "tieEmbeddings": true}})")};
  struct P {
    baton::v1::Schedule schedule;
    int stages, virtual_stages;
  };
  for (const std::string& model : models) {
    for (baton::v1::Precision precision : kPrecisions) {
      for (const P& p : {P{baton::v1::SCHEDULE_1F1B, 3, 1}, P{baton::v1::SCHEDULE_ZB_H1, 2, 1},
                         P{baton::v1::SCHEDULE_INTERLEAVED_1F1B, 2, 2},
                         P{baton::v1::SCHEDULE_ZB_V, 2, 2}}) {
        baton::v1::JobSpec spec = Job(model);
        spec.set_precision(precision);
        spec.set_attention(kSpecAttention);
        spec.mutable_pipeline()->set_schedule(p.schedule);
        spec.mutable_pipeline()->set_stages(p.stages);
        spec.mutable_pipeline()->set_virtual_stages(p.virtual_stages);
        const std::string what = absl::StrCat(baton::v1::Schedule_Name(p.schedule), " ",
                                              baton::v1::Precision_Name(precision), " ", model);
        auto ref = ReferenceTrainer::Create(spec);
        ASSERT_TRUE(ref.ok()) << ref.status();
        auto pipe = LocalPipelineTrainer::Create(spec);
        ASSERT_TRUE(pipe.ok()) << pipe.status();
        absl::StatusOr<Backend*> be =
            BackendFor(kTestDevice == baton::v1::DEVICE_KIND_CUDA ? Device::kCuda : Device::kCpu);
        ASSERT_TRUE(be.ok());
        EXPECT_EQ((*be)->attention_kernel(), kTaken) << what;
        for (int i = 0; i < spec.steps(); ++i) {
          auto a = (*ref)->Step();
          auto b = (*pipe)->Step();
          ASSERT_TRUE(a.ok() && b.ok()) << what;
          EXPECT_EQ(a->loss, b->loss) << what << " step " << i;
        }
        EXPECT_EQ(DigestHex((*pipe)->WeightsDigest()), DigestHex((*ref)->WeightsDigest())) << what;
      }
    }
  }
}

}  // namespace
}  // namespace baton
