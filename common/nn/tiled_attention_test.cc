// The tiled bf16 attention (common/core/flash_tiles.h) on the CPU, which runs the CUDA
// kernels' blocks one thread at a time: against the float32 materialised kernels on the same
// bf16 inputs, across tile edges, grouped heads and both head sizes the models use;
// determinism; and which jobs the modules run it in. cuda_kernels_test checks the CUDA
// kernels against these on a GPU.
//
// This binary runs with BATON_FUSED_ATTENTION=tiled (set before main).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/bf16.h"
#include "common/core/flash_tiles.h"
#include "common/nn/attention_core.h"
#include "common/nn/block_memory_test_util.h"
#include "common/nn/grad_check_test_util.h"
#include "common/nn/llama.h"
#include "common/nn/transformer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

const bool kTiledRequested = [] { return setenv("BATON_FUSED_ATTENTION", "tiled", 1) == 0; }();

using ::baton::testing::RandomTensor;

struct Shape5 {
  int64_t B, T, H, KVH, D;
};

std::string Name(const Shape5& s) {
  return absl::StrCat("B", s.B, " T", s.T, " H", s.H, " KVH", s.KVH, " D", s.D);
}

// A normal tensor rounded to bf16 values, as a bf16 job's q, k, v and gradients are.
Tensor RandomBf16Values(const Shape& shape, uint64_t seed, const std::string& name) {
  Tensor t = RandomTensor(shape, seed, name);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = RoundToBf16(t.f32()[i]);
  return t;
}

float MaxAbs(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// Within `rel` of the reference's largest magnitude, element by element.
void ExpectClose(const float* got, const float* want, int64_t n, float rel,
                 const std::string& what) {
  const float bound = rel * MaxAbs(want, n);
  float worst = 0.0f;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = std::fabs(got[i] - want[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, bound) << what << ": worst at " << at << " (" << got[at] << " against "
                          << want[at] << "), bound " << bound;
}

// The shapes: one row; a partial tile; exactly one tile; a tile and one row; several tiles
// with grouped heads, at head sizes 16, 32, 64 and 128.
const std::vector<Shape5>& Shapes() {
  static const auto* shapes =
      new std::vector<Shape5>{{2, 1, 2, 2, 16},  {2, 7, 4, 2, 16},   {1, 64, 2, 1, 32},
                              {1, 65, 4, 4, 64}, {2, 130, 4, 2, 64}, {1, 150, 2, 1, 128}};
  return *shapes;
}

// The tiled kernels round the probabilities (and their gradients) to bf16 as the matrix
// units' operands: a relative error of at most 2^-9 per probability, so the output is within
// about 2^-9 of the values' scale of the float32 kernels' output, and the input gradients
// (a sum of two such products) within a few times that. Seen on the CPU: at most 0.13% of
// the largest magnitude for y, 0.25% for dqkv. The bounds, 0.5% and 1%, leave room for a
// GPU's accumulation order; a wrong mask, tile edge or head is off by the values' scale. lse reads
// only exact bf16 products, summed in another order: float32 rounding.
TEST(TiledAttentionTest, AgreesWithTheFloatKernelsToBf16Rounding) {
  Backend* be = CpuBackend();
  for (const Shape5& s : Shapes()) {
    const int64_t W = (s.H + 2 * s.KVH) * s.D, C = s.H * s.D;
    const Tensor qkv = RandomBf16Values({s.B, s.T, W}, 1, "qkv " + Name(s));
    const Tensor dy = RandomBf16Values({s.B, s.T, C}, 2, "dy " + Name(s));
    Tensor y_ref = Tensor::Empty({s.B, s.T, C}), att = Tensor::Empty({s.B, s.H, s.T, s.T});
    Tensor y_rows = Tensor::Empty({s.B, s.T, C}), lse_rows = Tensor::Empty({s.B, s.H, s.T});
    Tensor y = Tensor::Empty({s.B, s.T, C}), lse = Tensor::Empty({s.B, s.H, s.T});
    be->AttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), att.f32(), y_ref.f32());
    be->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y_rows.f32(), lse_rows.f32());
    be->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y.f32(), lse.f32());
    ExpectClose(y.f32(), y_ref.f32(), y.numel(), 5e-3f, Name(s) + " y");
    for (int64_t i = 0; i < lse.numel(); ++i) {
      ASSERT_NEAR(lse.f32()[i], lse_rows.f32()[i], 1e-5 * (1 + std::fabs(lse_rows.f32()[i])))
          << Name(s) << " lse " << i;
    }
    Tensor d_ref = Tensor::Empty(qkv.shape()), scratch = Tensor::Empty({s.H, s.T, s.T});
    be->AttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), att.f32(), dy.f32(), d_ref.f32(),
                          scratch.f32());
    // Every element is written: start from NaN.
    Tensor d = Tensor::Empty(qkv.shape()), delta = Tensor::Empty({s.B, s.H, s.T});
    std::fill(d.f32(), d.f32() + d.numel(), NAN);
    be->TiledAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y.f32(), lse.f32(), dy.f32(),
                               d.f32(), delta.f32());
    // q, k and v columns apart: their scales differ.
    for (int part = 0; part < 3; ++part) {
      const int64_t first = part == 0 ? 0 : part == 1 ? C : C + s.KVH * s.D;
      const int64_t width = part == 0 ? C : s.KVH * s.D;
      std::vector<float> got, want;
      for (int64_t r = 0; r < s.B * s.T; ++r) {
        for (int64_t c = first; c < first + width; ++c) {
          got.push_back(d.f32()[r * W + c]);
          want.push_back(d_ref.f32()[r * W + c]);
        }
      }
      ExpectClose(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-2f,
                  Name(s) + " d" + "qkv"[part]);
    }
    // The same bits again.
    Tensor y2 = Tensor::Empty(y.shape()), lse2 = Tensor::Empty(lse.shape());
    Tensor d2 = Tensor::Empty(d.shape());
    be->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y2.f32(), lse2.f32());
    be->TiledAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), y2.f32(), lse2.f32(), dy.f32(),
                               d2.f32(), delta.f32());
    EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.nbytes()), 0) << Name(s);
    EXPECT_EQ(std::memcmp(lse.raw(), lse2.raw(), lse.nbytes()), 0) << Name(s);
    EXPECT_EQ(std::memcmp(d.raw(), d2.raw(), d.nbytes()), 0) << Name(s);
  }
}

// The probabilities are the products' bf16 operands: a probability that bf16 cannot hold
// moves the output. Two keys whose weights are 1 and e^-x with e^-x between bf16 values:
// the tiled output is the float32 one with that weight rounded.
TEST(TiledAttentionTest, RoundsTheProbabilitiesToBf16) {
  const int64_t T = 2, D = 16, W = 3 * D;
  Tensor qkv = Tensor::Zeros({1, T, W});
  // q of row 1 along dimension 0; k_0 . q_1 = 0 and k_1 . q_1 = a, so the weights are
  // (1, e^(a/4)) after the 1/sqrt(16) scale; v_0 = 0 and v_1 = 1 in dimension 0.
  const float a = 1.0f;
  qkv.f32()[1 * W + 0] = 1.0f;
  qkv.f32()[1 * W + D + 0] = a;
  qkv.f32()[1 * W + 2 * D + 0] = 1.0f;
  Tensor y = Tensor::Empty({1, T, D}), lse = Tensor::Empty({1, 1, T});
  CpuBackend()->TiledAttentionForward(1, T, 1, 1, D, qkv.f32(), y.f32(), lse.f32());
  // Row 1: the running max is a/4 (key 1), so p_0 = e^(-a/4) rounded, p_1 = 1; l sums the
  // float32 weights.
  const float p0 = std::exp(0.0f - a / 4), l = p0 + 1.0f;
  const float want = (RoundToBf16(p0) * 0.0f + 1.0f * 1.0f) * (1.0f / l);
  EXPECT_EQ(y.f32()[1 * D + 0], want);
  EXPECT_NE(RoundToBf16(p0), p0);  // the case exercises a rounding
  EXPECT_EQ(y.f32()[0], 0.0f);     // row 0 sees key 0 alone, whose value is 0
}

// The CUDA blocks' shared memory at the head sizes the models use: within the 227 KiB a
// block may take on sm_90 (H100, H200) at D = 128, and within an sm_80's 163 KiB at D = 64
// (the CUDA backend asks the device before it takes the tiled kernels).
TEST(TiledAttentionTest, TheBlocksFitTheSharedMemoryOfTheirDevices) {
  const int64_t sm90 = 227 * 1024, sm80 = 163 * 1024;
  for (const auto bytes : {flash_tiles::ForwardSmemBytes, flash_tiles::QueryGradSmemBytes,
                           flash_tiles::KeyGradSmemBytes}) {
    EXPECT_LE(bytes(128), sm90);
    EXPECT_LE(bytes(64), sm80);
    EXPECT_LT(bytes(64), bytes(128));
  }
  EXPECT_GT(flash_tiles::KeyGradSmemBytes(128), sm80);  // why the backend asks
}

TEST(TiledAttentionTest, HeadSizesAreMultiplesOf16UpTo128) {
  ASSERT_TRUE(kTiledRequested);
  EXPECT_TRUE(TiledAttentionRequested());
  EXPECT_FALSE(FusedAttentionRequested());
  const Backend& be = *CpuBackend();
  for (int64_t D : {16, 32, 64, 128}) {
    EXPECT_EQ(AttentionKernelFor(be, D, true), AttentionKernel::kTiled) << D;
    EXPECT_EQ(AttentionKernelFor(be, D, false), AttentionKernel::kMaterialised) << D;
  }
  // Head sizes the tiles do not take fall back to the fused rows (the same stash) up to
  // their limit.
  for (int64_t D : {8, 24}) EXPECT_EQ(AttentionKernelFor(be, D, true), AttentionKernel::kFused);
  EXPECT_EQ(AttentionKernelFor(be, 144, true), AttentionKernel::kMaterialised);
}

// bf16 modules take the tiled kernels (no T x T matrix kept), float32 ones the materialised
// kernels (one per head kept): the tiled contract is for bf16 values only.
TEST(TiledAttentionTest, OnlyBf16ModulesTakeIt) {
  const int64_t T = 512, C = 32;
  for (const Precision precision : {Precision::kBf16, Precision::kFp32}) {
    CausalSelfAttention attn("attn", C, 2, 0.02f, 5);
    Tensor x = RandomBf16Values({1, T, C}, 12, "x");
    const AllocatorStats before = CpuAllocator()->Stats();
    Tensor y;
    ASSERT_TRUE(attn.Forward({0, nullptr, precision}, x, &y).ok());
    const int64_t held = CpuAllocator()->Stats().bytes_in_use - before.bytes_in_use;
    const int64_t square = 2 * T * T * 4;  // two heads' probabilities
    if (precision == Precision::kBf16) {
      EXPECT_LT(held, square / 4) << held << " bytes held";
    } else {
      EXPECT_GE(held, square) << held << " bytes held";
    }
    attn.Discard(0);
  }
}

// What a block keeps is what the planner counts (DescribeBlocks with the tiled kernels):
// in bf16 each row's logsumexp and the core's float32 output, not the probabilities; in
// fp32 the materialised kernels' probabilities.
TEST(TiledAttentionTest, ABlockKeepsWhatThePlannerCounts) {
  ASSERT_EQ(CpuBackend()->attention_kernel(), AttentionKernel::kTiled);
  ::baton::testing::ExpectBlocksKeepWhatIsDescribed(AttentionKernel::kTiled);
}

// The modules wire the tiled kernels in both directions: a bf16 module (tiled) against the
// same module in float32 (materialised), output, input gradient and weight gradients. bf16
// rounds the inputs, the weights and every product's operands, so they agree to a few
// percent of each tensor's largest magnitude (at most 2.4% seen, 5% allowed: the test is
// on the CPU alone, with fixed inputs); a kernel wired to the wrong
// tensor, or a wrong kind, is off by the whole scale. Two tiles (T = 70), grouped heads.
template <typename M, typename Make>
void ExpectBf16ModuleNearFp32(const std::string& what, Make make) {
  const int64_t T = 70, C = 64;
  const Tensor x = RandomBf16Values({2, T, C}, 13, "x");
  const Tensor dy = RandomBf16Values({2, T, C}, 14, "dy");
  struct Run {
    Tensor y, dx;
    std::vector<Tensor> grads;
  };
  std::vector<Run> runs;
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    M m = make();
    std::vector<Parameter*> params;
    m.CollectParameters(&params);
    // Larger weights than the init's 0.02, so that the scores spread the probabilities.
    for (Parameter* p : params) {
      const Tensor r = RandomTensor(p->value.shape(), 15, p->name, 0.3f);
      std::memcpy(p->value.f32(), r.f32(), r.nbytes());
      p->grad = Tensor::Zeros(p->value.shape());
    }
    const MicroBatch mb{0, nullptr, precision};
    Run run;
    ASSERT_TRUE(m.Forward(mb, x, &run.y).ok()) << what;
    ASSERT_TRUE(m.BackwardInput(mb, dy, &run.dx).ok()) << what;
    ASSERT_TRUE(m.BackwardWeight(mb).ok()) << what;
    for (Parameter* p : params) run.grads.push_back(p->grad);
    runs.push_back(std::move(run));
  }
  ExpectClose(runs[1].y.f32(), runs[0].y.f32(), runs[0].y.numel(), 5e-2f, what + " y");
  ExpectClose(runs[1].dx.f32(), runs[0].dx.f32(), runs[0].dx.numel(), 5e-2f, what + " dx");
  for (size_t i = 0; i < runs[0].grads.size(); ++i) {
    ExpectClose(runs[1].grads[i].f32(), runs[0].grads[i].f32(), runs[0].grads[i].numel(), 5e-2f,
                absl::StrCat(what, " grad ", i));
  }
}

TEST(TiledAttentionTest, Bf16ModulesAgreeWithTheirFloat32Selves) {
  ExpectBf16ModuleNearFp32<CausalSelfAttention>(
      "gpt", [] { return CausalSelfAttention("attn", 64, 4, 0.02f, 5); });
  ExpectBf16ModuleNearFp32<LlamaAttention>(
      "llama", [] { return LlamaAttention("attn", 64, 4, 2, 10000.0f, 0.02f, 7); });
}

}  // namespace
}  // namespace baton
