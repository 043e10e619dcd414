// Independent checks of the LLaMA pieces (llama.h): forward against double-precision
// references, backward against central finite differences (method:
// grad_check_test_util.h), the Module contract, and the block's cost figures against what
// it really does (parameters, allocator).
#include "common/nn/llama.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/grad_check_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::testing::BitEqual;
using ::baton::testing::CheckModuleGradients;
using ::baton::testing::ExpectError;
using ::baton::testing::ModuleCase;
using ::baton::testing::PerturbParameters;
using ::baton::testing::RandomTensor;
using ::baton::testing::Tolerance;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Gradient-check tolerance, as transformer_test's for the composite modules (h = 1e-2 on
// O(1) values): truncation h^2/6 |f'''| = O(1e-4) for softmax, RMSNorm, SiLU and the
// rotations (|f'''| = O(1) with parameters perturbed by N(0, 0.2-0.3)); rounding through ~10
// float32 kernels ~1e-5-1e-4 in the difference quotient. atol 1e-3, rtol 1e-2.
// Observed: worst |error| 7.9e-4 (attention qkv.weight, on a gradient of ~10), at most 11%
// of the bound (a 9x margin); the block's at most 5%.
constexpr double kH = 1e-2;
constexpr Tolerance kTol{1e-3, 1e-2};

// ------------------------------------------------------------------ forward references

using DVec = std::vector<double>;

// y = x W^T in double; W [out, in].
DVec LinearRef(const DVec& in, int64_t rows, int64_t n_in, int64_t n_out, const Parameter* w) {
  DVec out(static_cast<size_t>(rows * n_out));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      double z = 0.0;
      for (int64_t i = 0; i < n_in; ++i) z += in[r * n_in + i] * w->value.f32()[o * n_in + i];
      out[r * n_out + o] = z;
    }
  }
  return out;
}

// Rotates, in double, the `heads` head vectors starting at column `offset` of each row
// (row width `stride`), transformers' rotate_half with the float32 angle t * inv_freq.
void RotateRef(DVec* x, int64_t B, int64_t T, int64_t heads, int64_t D, int64_t stride,
               int64_t offset, float theta) {
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float t = static_cast<float>(bt % T);
    for (int64_t n = 0; n < heads; ++n) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const float inv_freq =
            1.0f / static_cast<float>(std::pow(
                       double{theta}, double{static_cast<float>(2 * i) / static_cast<float>(D)}));
        const double angle = t * inv_freq;
        double& lo = (*x)[bt * stride + offset + n * D + i];
        double& hi = (*x)[bt * stride + offset + n * D + i + D / 2];
        const double x1 = lo, x2 = hi;
        lo = x1 * std::cos(angle) - x2 * std::sin(angle);
        hi = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
    }
  }
}

// The whole attention module in double: qkv, rotary on q and k, grouped-query causal
// softmax attention (query head h reads kv head h / (H / KVH)), output projection.
DVec LlamaAttentionRef(LlamaAttention& attn, const Tensor& x, int64_t H, int64_t KVH, float theta) {
  const std::vector<Parameter*> p = attn.Parameters();  // qkv.weight, proj.weight
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), D = C / H, W = (H + 2 * KVH) * D;
  DVec qkv = LinearRef(DVec(x.f32(), x.f32() + x.numel()), B * T, C, W, p[0]);
  RotateRef(&qkv, B, T, H, D, W, 0, theta);
  RotateRef(&qkv, B, T, KVH, D, W, H * D, theta);
  DVec mixed(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = h / (H / KVH);
      for (int64_t i = 0; i < T; ++i) {
        DVec s(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += qkv[(b * T + i) * W + h * D + d] * qkv[(b * T + j) * W + C + kv * D + d];
          }
          s[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) {
            acc += s[j] / sum * qkv[(b * T + j) * W + C + KVH * D + kv * D + d];
          }
          mixed[(b * T + i) * C + h * D + d] = acc;
        }
      }
    }
  }
  return LinearRef(mixed, B * T, C, C, p[1]);
}

TEST(RmsNormTest, ForwardMatchesReferenceAndHasOneWeight) {
  RmsNorm norm("block.0.attn_norm", 8, 1e-5f);
  const std::vector<Parameter*> p = norm.Parameters();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0]->name, "block.0.attn_norm.weight");
  EXPECT_EQ(p[0]->value.shape(), Shape({8}));
  for (int c = 0; c < 8; ++c) EXPECT_EQ(p[0]->value.f32()[c], 1.0f);
  PerturbParameters(norm, 3, 0.3f);
  const Tensor x = RandomTensor({2, 3, 8}, 3, "x");
  Tensor y;
  ASSERT_TRUE(norm.Forward({0, nullptr}, x, &y).ok());
  for (int64_t r = 0; r < 6; ++r) {
    double sq = 0;
    for (int c = 0; c < 8; ++c) sq += double{x.f32()[r * 8 + c]} * x.f32()[r * 8 + c];
    const double rstd = 1.0 / std::sqrt(sq / 8 + 1e-5);
    for (int c = 0; c < 8; ++c) {
      EXPECT_NEAR(y.f32()[r * 8 + c], x.f32()[r * 8 + c] * rstd * p[0]->value.f32()[c], 1e-5);
    }
  }
}

// The attention with rotary embedding and grouped kv heads against the double reference
// (atol 2e-5, as CausalSelfAttention's), for kv_heads < heads and kv_heads == heads, with a
// small theta (large rotations) and LLaMA 3's 500000.
TEST(LlamaAttentionTest, ForwardMatchesNaiveReference) {
  struct Case {
    int64_t heads, kv_heads;
    float theta;
  };
  for (const Case& c : {Case{4, 2, 10.0f}, Case{4, 1, 500000.0f}, Case{2, 2, 100.0f}}) {
    SCOPED_TRACE(absl::StrCat("heads ", c.heads, " kv ", c.kv_heads, " theta ", c.theta));
    const int64_t C = 16;
    LlamaAttention attn("attn", C, c.heads, c.kv_heads, c.theta, 0.02f, 5);
    const std::vector<Parameter*> p = attn.Parameters();
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0]->name, "attn.qkv.weight");
    EXPECT_EQ(p[0]->value.shape(), Shape({(c.heads + 2 * c.kv_heads) * (C / c.heads), C}));
    EXPECT_EQ(p[1]->name, "attn.proj.weight");
    EXPECT_EQ(p[1]->value.shape(), Shape({C, C}));
    PerturbParameters(attn, 5, 0.3f);
    const Tensor x = RandomTensor({2, 6, C}, 5, "x");
    Tensor y;
    ASSERT_TRUE(attn.Forward({0, nullptr}, x, &y).ok());
    ASSERT_EQ(y.shape(), Shape({2, 6, C}));
    const DVec want = LlamaAttentionRef(attn, x, c.heads, c.kv_heads, c.theta);
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.f32()[i], want[i], 2e-5) << i;
  }
}

// Rotary embedding turns q and k, never v: with the same vector at every position each
// output is a convex mix of identical values, so every position's output equals position
// 0's (its own v, projected) whatever the rotated scores are (atol 1e-6).
TEST(LlamaAttentionTest, RotaryLeavesValuesAlone) {
  LlamaAttention attn("attn", 8, 2, 1, 10.0f, 0.02f, 7);
  PerturbParameters(attn, 7, 0.5f);
  Tensor x = Tensor::Empty({1, 4, 8});
  const Tensor row = RandomTensor({8}, 7, "row");
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < 8; ++c) x.f32()[t * 8 + c] = row.f32()[c];
  }
  Tensor y;
  ASSERT_TRUE(attn.Forward({0, nullptr}, x, &y).ok());
  for (int t = 1; t < 4; ++t) {
    for (int c = 0; c < 8; ++c) EXPECT_NEAR(y.f32()[t * 8 + c], y.f32()[c], 1e-6) << t;
  }
}

TEST(LlamaAttentionTest, IsCausal) {
  LlamaAttention attn("attn", 8, 2, 1, 10000.0f, 0.02f, 5);
  PerturbParameters(attn, 5, 0.3f);
  const Tensor x = RandomTensor({1, 5, 8}, 6, "x");
  Tensor x2 = x.Clone();
  for (int c = 0; c < 8; ++c) x2.f32()[4 * 8 + c] += 1.0f;  // change only the last position
  Tensor y, y2;
  ASSERT_TRUE(attn.Forward({0, nullptr}, x, &y).ok());
  ASSERT_TRUE(attn.Forward({1, nullptr}, x2, &y2).ok());
  for (int i = 0; i < 4 * 8; ++i) EXPECT_EQ(y.f32()[i], y2.f32()[i]) << i;
  bool last_changed = false;
  for (int i = 4 * 8; i < 5 * 8; ++i) last_changed |= y.f32()[i] != y2.f32()[i];
  EXPECT_TRUE(last_changed);
}

TEST(SwiGluTest, ForwardIsSiluOfGateTimesUp) {
  SwiGlu act("act", 3);
  const Tensor x = RandomTensor({2, 6}, 8, "x", 3.0f);
  Tensor y;
  ASSERT_TRUE(act.Forward({0, nullptr}, x, &y).ok());
  ASSERT_EQ(y.shape(), Shape({2, 3}));
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 3; ++i) {
      const double g = x.f32()[r * 6 + i], u = x.f32()[r * 6 + 3 + i];
      EXPECT_NEAR(y.f32()[r * 3 + i], g / (1.0 + std::exp(-g)) * u, 1e-5);
    }
  }
}

// ------------------------------------------------------------------ parameters and init

TEST(LlamaBlockTest, ParametersInCanonicalOrderWithTheirInit) {
  const int64_t C = 16, H = 4, KVH = 2, I = 24, layers = 8;
  LlamaBlock block("block.3", C, H, KVH, I, 10000.0f, 1e-5f, layers, 9);
  const std::vector<Parameter*> p = block.Parameters();
  ASSERT_EQ(p.size(), 6u);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"block.3.attn_norm.weight", {C}},
      {"block.3.attn.qkv.weight", {(H + 2 * KVH) * 4, C}},
      {"block.3.attn.proj.weight", {C, C}},
      {"block.3.mlp_norm.weight", {C}},
      {"block.3.mlp.gate_up.weight", {2 * I, C}},
      {"block.3.mlp.down.weight", {C, I}}};
  int64_t total = 0, operands = 0, largest = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i]->name, want[i].first);
    EXPECT_EQ(p[i]->value.shape(), want[i].second) << p[i]->name;
    total += p[i]->value.numel();
    largest = std::max(largest, p[i]->value.numel());
    // The projections are Linears, read only as bf16 operands in bf16; the norms are not.
    EXPECT_EQ(p[i]->bf16_operand, p[i]->value.shape().size() == 2) << p[i]->name;
    if (p[i]->bf16_operand) operands += p[i]->value.numel();
  }
  EXPECT_EQ(LlamaBlockCosts(32, C, H, KVH, I).parameters, total);
  EXPECT_EQ(LlamaBlockCosts(32, C, H, KVH, I).operand_parameters, operands);
  EXPECT_EQ(LlamaBlockCosts(32, C, H, KVH, I).largest_parameter, largest);
  // Norms start at one; the Linear weights' sample deviations are near 0.02, scaled by
  // 1/sqrt(2 layers) = 1/4 for attn.proj and mlp.down (within 15%: 256-768 samples).
  for (int idx : {0, 3}) {
    for (int64_t i = 0; i < p[idx]->value.numel(); ++i) EXPECT_EQ(p[idx]->value.f32()[i], 1.0f);
  }
  const std::vector<std::pair<int, double>> stddevs = {
      {1, 0.02}, {2, 0.005}, {4, 0.02}, {5, 0.005}};
  for (const auto& [idx, sd] : stddevs) {
    double ss = 0;
    for (int64_t i = 0; i < p[idx]->value.numel(); ++i) ss += std::pow(p[idx]->value.f32()[i], 2);
    EXPECT_NEAR(std::sqrt(ss / p[idx]->value.numel()), sd, 0.15 * sd) << p[idx]->name;
  }
}

// ------------------------------------------------------------------ gradient checks

TEST(RmsNormGradTest, MatchesFiniteDifferences) {
  RmsNorm norm("norm", 8, 1e-5f);
  PerturbParameters(norm, 20, 0.3f);
  CheckModuleGradients(norm, RandomTensor({2, 4, 8}, 20, "x"), nullptr, 41, kH, kTol);
}

TEST(SwiGluGradTest, MatchesFiniteDifferences) {
  SwiGlu act("act", 6);
  CheckModuleGradients(act, RandomTensor({2, 4, 12}, 21, "x", 2.0f), nullptr, 42, kH, kTol);
}

TEST(LlamaAttentionGradTest, GroupedQueryMatchesFiniteDifferences) {
  // 16 channels, 4 query heads sharing 2 kv heads (D = 4); qkv.weight has 512 elements.
  LlamaAttention attn("attn", 16, 4, 2, 10.0f, 0.02f, 5);
  PerturbParameters(attn, 22, 0.3f);
  CheckModuleGradients(attn, RandomTensor({2, 4, 16}, 22, "x"), nullptr, 43, kH, kTol);
}

TEST(LlamaAttentionGradTest, MultiHeadMatchesFiniteDifferences) {
  LlamaAttention attn("attn", 8, 2, 2, 10.0f, 0.02f, 5);
  PerturbParameters(attn, 23, 0.3f);
  CheckModuleGradients(attn, RandomTensor({2, 4, 8}, 23, "x"), nullptr, 44, kH, kTol);
}

TEST(LlamaBlockGradTest, MatchesFiniteDifferences) {
  // C = 8, H = 2 sharing KVH = 1 (D = 4), I = 12: every parameter element is checked.
  LlamaBlock block("block.0", 8, 2, 1, 12, 10.0f, 1e-5f, 2, 6);
  PerturbParameters(block, 24, 0.2f);
  CheckModuleGradients(block, RandomTensor({2, 4, 8}, 24, "x"), nullptr, 45, kH, kTol);
}

// ------------------------------------------------------------------ module contract

std::vector<ModuleCase> LlamaCases() {
  std::vector<ModuleCase> cases;
  const std::vector<Tensor> x = {RandomTensor({2, 4, 16}, 40, "x0"),
                                 RandomTensor({2, 4, 16}, 40, "x1")};
  cases.push_back({"rms norm",
                   [] {
                     auto m = std::make_unique<RmsNorm>("block.0.attn_norm", 16, 1e-5f);
                     PerturbParameters(*m, 1, 0.3f);
                     return m;
                   },
                   x,
                   {},
                   false,
                   "block.0.attn_norm"});
  cases.push_back({"swiglu",
                   [] { return std::make_unique<SwiGlu>("block.0.mlp.act", 8); },
                   x,
                   {},
                   false,
                   "block.0.mlp.act"});
  cases.push_back({"gqa attention",
                   [] {
                     auto m = std::make_unique<LlamaAttention>("block.0.attn", 16, 4, 2, 10.0f,
                                                               0.02f, 1);
                     PerturbParameters(*m, 1, 0.3f);
                     return m;
                   },
                   x,
                   {},
                   false,
                   "block.0.attn"});
  cases.push_back({"llama block",
                   [] {
                     auto m =
                         std::make_unique<LlamaBlock>("block.1", 16, 4, 2, 24, 10.0f, 1e-5f, 2, 1);
                     PerturbParameters(*m, 1, 0.2f);
                     return m;
                   },
                   x,
                   {},
                   false,
                   "block.1"});
  return cases;
}

TEST(LlamaContractTest, SplitAndInterleavedBackwardAreBitIdentical) {
  for (const ModuleCase& c : LlamaCases()) {
    SCOPED_TRACE(c.label);
    testing::CheckScheduleInvariance(c);
  }
}

TEST(LlamaContractTest, StashMisuseIsFailedPrecondition) {
  for (const ModuleCase& c : LlamaCases()) {
    SCOPED_TRACE(c.label);
    testing::CheckStashErrors(c);
  }
}

// Discard drops a micro-batch in flight everywhere in the block; the others go on and give
// the bits they give alone.
TEST(LlamaContractTest, DiscardDropsOneMicroBatch) {
  const auto make = [] {
    auto m = std::make_unique<LlamaBlock>("block.2", 16, 4, 2, 24, 10.0f, 1e-5f, 2, 3);
    PerturbParameters(*m, 3, 0.2f);
    return m;
  };
  const Tensor x0 = RandomTensor({2, 4, 16}, 50, "x0"), x1 = RandomTensor({2, 4, 16}, 50, "x1");
  const Tensor dy = RandomTensor({2, 4, 16}, 50, "dy");
  std::unique_ptr<LlamaBlock> a = make(), b = make();
  Tensor y, dxa, dxb;
  ASSERT_TRUE(a->Forward({0, nullptr}, x0, &y).ok());
  ASSERT_TRUE(a->Forward({1, nullptr}, x1, &y).ok());
  EXPECT_EQ(a->InFlight(), 2);
  a->Discard(0);
  EXPECT_EQ(a->InFlight(), 1);
  Tensor dx;
  EXPECT_EQ(a->BackwardInput({0, nullptr}, dy, &dx).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a->Backward({1, nullptr}, dy, &dxa).ok());
  EXPECT_EQ(a->InFlight(), 0);
  ASSERT_TRUE(b->Forward({1, nullptr}, x1, &y).ok());
  ASSERT_TRUE(b->Backward({1, nullptr}, dy, &dxb).ok());
  EXPECT_TRUE(BitEqual(dxa, dxb));
  const std::vector<Parameter*> pa = a->Parameters(), pb = b->Parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(BitEqual(pa[i]->grad, pb[i]->grad)) << i;
  // Discarding what is not there is a no-op; the discarded micro-batch may run again.
  a->Discard(7);
  ASSERT_TRUE(a->Forward({0, nullptr}, x0, &y).ok());
  ASSERT_TRUE(a->Backward({0, nullptr}, dy, &dx).ok());
}

// ------------------------------------------------------------------ bad input

TEST(LlamaAttentionTest, RefusesBadShapesAndHeadCounts) {
  LlamaAttention attn("block.2.attn", 8, 2, 1, 10000.0f, 0.02f, 1);
  Tensor y;
  ExpectError(attn.Forward({0, nullptr}, RandomTensor({8, 8}, 1, "x"), &y), kInvalid,
              "block.2.attn", "rank 2");
  ExpectError(attn.Forward({0, nullptr}, RandomTensor({2, 4, 6}, 1, "x"), &y), kInvalid,
              "block.2.attn", "wrong width");
  EXPECT_EQ(attn.InFlight(), 0);
  LlamaAttention odd("block.3.attn", 6, 2, 1, 10000.0f, 0.02f, 1);  // D = 3
  ExpectError(odd.Forward({0, nullptr}, RandomTensor({1, 2, 6}, 1, "x"), &y), kInvalid,
              "block.3.attn", "odd head size");
  LlamaAttention ungrouped("block.4.attn", 12, 3, 2, 10000.0f, 0.02f, 1);  // 2 does not divide 3
  ExpectError(ungrouped.Forward({0, nullptr}, RandomTensor({1, 2, 12}, 1, "x"), &y), kInvalid,
              "block.4.attn", "kv heads not dividing heads");
  EXPECT_EQ(odd.InFlight() + ungrouped.InFlight(), 0);
}

TEST(LlamaBlockTest, RefusesBadShapes) {
  LlamaBlock block("block.3", 8, 2, 1, 12, 10000.0f, 1e-5f, 2, 1);
  Tensor y, dx;
  ExpectError(block.Forward({0, nullptr}, RandomTensor({2, 4, 4}, 1, "x"), &y), kInvalid, "block.3",
              "wrong width");
  EXPECT_EQ(block.InFlight(), 0);
  ASSERT_TRUE(block.Forward({0, nullptr}, RandomTensor({2, 4, 8}, 1, "x"), &y).ok());
  ExpectError(block.BackwardInput({0, nullptr}, RandomTensor({2, 4, 4}, 1, "dy"), &dx), kInvalid,
              "block.3", "gradient of the wrong width");
}

// ------------------------------------------------------------------ costs

// LlamaBlockCosts' activations are what the block really keeps between forward and
// backward, in fp32 and in bf16: run one micro-batch forward, drop everything but the
// block's stash, and the allocator's bytes in use grew by exactly that (times the batch).
// Shapes are multiples of 32 elements, the allocator's 64-byte rounding for bf16 bits.
TEST(LlamaBlockCostsTest, ActivationBytesAreWhatTheBlockKeeps) {
  struct Case {
    int64_t T, C, H, KVH, I;
  };
  for (bool bf16 : {false, true}) {
    for (const Case& c :
         {Case{16, 32, 4, 2, 48}, Case{16, 32, 2, 2, 64}, Case{32, 64, 8, 1, 96}}) {
      SCOPED_TRACE(absl::StrCat("T ", c.T, " C ", c.C, " H ", c.H, " KVH ", c.KVH, " I ", c.I,
                                bf16 ? " bf16" : " fp32"));
      const int64_t rows = 2;
      LlamaBlock block("block.0", c.C, c.H, c.KVH, c.I, 10000.0f, 1e-5f, 4, 1);
      MicroBatch mb{0, nullptr};
      mb.precision = bf16 ? Precision::kBf16 : Precision::kFp32;
      Allocator* alloc = CpuAllocator();
      Tensor x = RandomTensor({rows, c.T, c.C}, 52, "act");
      RoundIfBf16(mb, BackendOrDie(Device::kCpu), &x);  // in bf16 activations are bf16
      const int64_t base = alloc->Stats().bytes_in_use - x.numel() * 4;
      Tensor y;
      ASSERT_TRUE(block.Forward(mb, x, &y).ok());
      x = Tensor();
      y = Tensor();
      const int64_t held = alloc->Stats().bytes_in_use - base;
      const LlamaCosts costs = LlamaBlockCosts(c.T, c.C, c.H, c.KVH, c.I);
      EXPECT_EQ(held, rows * (4 * costs.activation_floats - (bf16 ? 2 * costs.activation_bf16 : 0)));
      block.Discard(0);
      EXPECT_EQ(alloc->Stats().bytes_in_use, base);  // nothing else stays behind
    }
  }
}

// The FLOP count against the GEMM shapes written out for a LLaMA-2-7B-like layer, and the
// GPT block's formula (24TC^2 + 4T^2C) as the special case KVH = H, I = 4C without the
// MLP's third matrix: 2TC*3C + 4T^2C + 2TC^2 + 6TC*I.
TEST(LlamaBlockCostsTest, FlopsAndParametersByHand) {
  const LlamaCosts c = LlamaBlockCosts(4096, 4096, 32, 32, 11008);
  EXPECT_EQ(c.parameters, 2 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 11008LL);
  const int64_t T = 4096, C = 4096, I = 11008;
  EXPECT_EQ(c.forward_flops, 2 * T * C * 3 * C + 4 * T * T * C + 2 * T * C * C + 6 * T * C * I);
  // Grouped kv heads shrink k and v: 8 kv heads of 128 of 32 query heads.
  const LlamaCosts g = LlamaBlockCosts(T, C, 32, 8, I);
  EXPECT_EQ(c.parameters - g.parameters, 2 * (C - 8 * 128) * C);
  EXPECT_EQ(c.activation_floats - g.activation_floats, 2 * T * (C - 8 * 128));
}

}  // namespace
}  // namespace baton
