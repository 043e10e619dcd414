// The fused (flash-style) attention core: the CPU's fused kernels against its materialised
// ones, gradient checks of the attention modules running fused, and determinism. The CUDA
// kernels run the same row functions (flash_attention_math.h); cuda_kernels_test checks
// them against these on a GPU.
//
// This binary runs with BATON_FUSED_ATTENTION=1 (set before main), so the modules take the
// fused path on the CPU.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/flash_attention_math.h"
#include "common/nn/attention_core.h"
#include "common/nn/block_memory_test_util.h"
#include "common/nn/grad_check_test_util.h"
#include "common/nn/llama.h"
#include "common/nn/transformer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

const bool kFusedRequested = [] { return setenv("BATON_FUSED_ATTENTION", "1", 1) == 0; }();

using ::baton::testing::CheckModuleGradients;
using ::baton::testing::PerturbParameters;
using ::baton::testing::RandomTensor;
using ::baton::testing::Tolerance;

struct Shape5 {
  int64_t B, T, H, KVH, D;
};

std::string Name(const Shape5& s) {
  return absl::StrCat("B", s.B, " T", s.T, " H", s.H, " KVH", s.KVH, " D", s.D);
}

// The fused kernels give the materialised kernels' values to float32 rounding: outputs
// within 2e-6 + 1e-5 relative, input gradients within 1e-5 + 1e-4 relative (the backward
// recomputes exp(s - lse) where the materialised one normalises by the row sum: a few ulps
// per probability, summed over up to T = 65 keys).
TEST(FusedAttentionTest, AgreesWithTheMaterialisedKernels) {
  Backend* be = CpuBackend();
  for (const Shape5& s : {Shape5{2, 1, 2, 2, 4}, Shape5{2, 7, 4, 2, 8}, Shape5{1, 33, 3, 1, 16},
                          Shape5{2, 17, 2, 2, 128}, Shape5{1, 65, 4, 4, 32}}) {
    const int64_t W = (s.H + 2 * s.KVH) * s.D, C = s.H * s.D;
    const Tensor qkv = RandomTensor({s.B, s.T, W}, 1, "qkv " + Name(s));
    const Tensor dy = RandomTensor({s.B, s.T, C}, 2, "dy " + Name(s));
    Tensor y_ref = Tensor::Empty({s.B, s.T, C}), att = Tensor::Empty({s.B, s.H, s.T, s.T});
    Tensor y = Tensor::Empty({s.B, s.T, C}), lse = Tensor::Empty({s.B, s.H, s.T});
    be->AttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), att.f32(), y_ref.f32());
    be->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y.f32(), lse.f32());
    for (int64_t i = 0; i < y.numel(); ++i) {
      ASSERT_NEAR(y.f32()[i], y_ref.f32()[i], 2e-6 + 1e-5 * std::fabs(y_ref.f32()[i]))
          << Name(s) << " y " << i;
    }
    Tensor d_ref = Tensor::Empty(qkv.shape()), d = Tensor::Empty(qkv.shape());
    Tensor scratch = Tensor::Empty({s.H, s.T, s.T}), delta = Tensor::Empty({s.B, s.H, s.T});
    be->AttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), att.f32(), dy.f32(), d_ref.f32(),
                          scratch.f32());
    be->FusedAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y.f32(), lse.f32(),
                               dy.f32(), d.f32(), delta.f32());
    for (int64_t i = 0; i < d.numel(); ++i) {
      ASSERT_NEAR(d.f32()[i], d_ref.f32()[i], 1e-5 + 1e-4 * std::fabs(d_ref.f32()[i]))
          << Name(s) << " dqkv " << i;
    }
    // The same bits again.
    Tensor y2 = Tensor::Empty(y.shape()), lse2 = Tensor::Empty(lse.shape());
    Tensor d2 = Tensor::Empty(d.shape());
    be->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y2.f32(), lse2.f32());
    be->FusedAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y2.f32(), lse2.f32(),
                               dy.f32(), d2.f32(), delta.f32());
    EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.nbytes()), 0) << Name(s);
    EXPECT_EQ(std::memcmp(d.raw(), d2.raw(), d.nbytes()), 0) << Name(s);
  }
}

TEST(FusedAttentionTest, TheModulesTakeItForHeadsUpToTheLimit) {
  ASSERT_TRUE(kFusedRequested);
  EXPECT_TRUE(FusedAttentionRequested());
  const Backend& be = *CpuBackend();
  for (bool bf16 : {false, true}) {
    EXPECT_EQ(AttentionKernelFor(be, flash::kMaxHeadSize, bf16), AttentionKernel::kFused);
    EXPECT_EQ(AttentionKernelFor(be, flash::kMaxHeadSize + 1, bf16),
              AttentionKernel::kMaterialised);
  }
}

// Gradient checks of the attention modules on the fused path (tolerances as
// transformer_test's and llama_test's).
constexpr double kH = 1e-2;
constexpr Tolerance kTol{1e-3, 1e-2};

TEST(FusedAttentionGradTest, GptAttentionMatchesFiniteDifferences) {
  CausalSelfAttention attn("attn", 8, 2, 0.02f, 5);
  PerturbParameters(attn, 10, 0.3f);
  CheckModuleGradients(attn, RandomTensor({2, 4, 8}, 10, "x"), nullptr, 31, kH, kTol);
}

TEST(FusedAttentionGradTest, GroupedQueryLlamaAttentionMatchesFiniteDifferences) {
  LlamaAttention attn("attn", 8, 2, 1, 10.0f, 0.02f, 7);
  PerturbParameters(attn, 11, 0.3f);
  CheckModuleGradients(attn, RandomTensor({2, 5, 8}, 11, "x"), nullptr, 32, kH, kTol);
}

// What a block keeps is what the planner counts (DescribeBlocks with the fused kernels):
// each row's logsumexp, and in bf16 the core's float32 output, not the probabilities.
TEST(FusedAttentionTest, ABlockKeepsWhatThePlannerCounts) {
  ASSERT_EQ(CpuBackend()->attention_kernel(), AttentionKernel::kFused);
  ::baton::testing::ExpectBlocksKeepWhatIsDescribed(AttentionKernel::kFused);
}

// The module's fused forward equals the kernel's (nothing else in between) and keeps no
// T x T matrix: the stash of a long sequence is linear in T.
TEST(FusedAttentionTest, TheModuleStashesNoSquareMatrix) {
  const int64_t T = 256;
  CausalSelfAttention attn("attn", 8, 2, 0.02f, 5);
  const Tensor x = RandomTensor({1, T, 8}, 12, "x");
  const AllocatorStats before = CpuAllocator()->Stats();
  Tensor y;
  ASSERT_TRUE(attn.Forward({0, nullptr}, x, &y).ok());
  const int64_t held = CpuAllocator()->Stats().bytes_in_use - before.bytes_in_use;
  // qkv (3C), the output (C), lse (H) per position, the projections' stash (their input,
  // shared), and y: far below one T x T matrix per head (2 * 256 * 256 * 4 bytes = 512 KiB).
  EXPECT_LT(held, 64 * 1024) << held << " bytes held";
  attn.Discard(0);
}

}  // namespace
}  // namespace baton
