// Independent checks of the transformer pieces (transformer.h): forward against
// double-precision references, backward against central finite differences (method:
// grad_check_test_util.h), and the Module contract.
#include "common/nn/transformer.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/grad_check_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::testing::CheckModuleGradients;
using ::baton::testing::ExpectError;
using ::baton::testing::ModuleCase;
using ::baton::testing::PerturbParameters;
using ::baton::testing::RandomIds;
using ::baton::testing::RandomTensor;
using ::baton::testing::ScalarTensor;
using ::baton::testing::Tolerance;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Gradient-check tolerance for the composite modules, with h = 1e-2 on O(1) values.
//  - Truncation h^2/6 |f'''|: softmax, LayerNorm and GELU have |f'''| = O(1) on the inputs
//    here (parameters perturbed by N(0, 0.2-0.3), unit-variance activations): ~1e-4 at most.
//  - Rounding: outputs pass through up to ~10 float32 kernels (a few ulps each); the probe
//    sums 64 of them, so the difference quotient is off by ~1e-5-1e-4.
// Observed: worst |error| 3.1e-4 (TransformerBlock, on a gradient of ~5), at most 9% of the
// bound atol = 1e-3, rtol = 1e-2 (an 11x margin). Checked gradients are O(0.1-5).
constexpr double kH = 1e-2;
constexpr Tolerance kTol{1e-3, 1e-2};
// The loss heads average over 8 rows (LmHead) or 12 elements (MseLoss), so their gradients
// are ~10x smaller (O(0.01-0.5)), and their L is one float32 value (ulp 2.4e-7 at |L| ~ 2):
// observed worst |error| 1.3e-5, at most 3% of the bound atol = 2e-4, rtol = 1e-2.
constexpr Tolerance kLossTol{2e-4, 1e-2};

// ------------------------------------------------------------------ forward references

// Naive causal attention in double: y = proj(concat_h softmax(q k^T / sqrt(D)) v).
std::vector<double> AttentionRef(CausalSelfAttention& attn, const Tensor& x, int64_t H) {
  const std::vector<Parameter*> p = attn.Parameters();  // qkv.w, qkv.b, proj.w, proj.b
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), D = C / H;
  auto linear = [](const std::vector<double>& in, int64_t rows, int64_t n_in, int64_t n_out,
                   const Parameter* w, const Parameter* b) {
    std::vector<double> out(static_cast<size_t>(rows * n_out));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < n_out; ++o) {
        double z = b->value.f32()[o];
        for (int64_t i = 0; i < n_in; ++i) z += in[r * n_in + i] * w->value.f32()[o * n_in + i];
        out[r * n_out + o] = z;
      }
    }
    return out;
  };
  std::vector<double> xin(x.f32(), x.f32() + x.numel());
  const std::vector<double> qkv = linear(xin, B * T, C, 3 * C, p[0], p[1]);
  std::vector<double> mixed(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += qkv[(b * T + i) * 3 * C + h * D + d] * qkv[(b * T + j) * 3 * C + C + h * D + d];
          }
          s[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) {
            acc += s[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * D + d];
          }
          mixed[(b * T + i) * C + h * D + d] = acc;
        }
      }
    }
  }
  return linear(mixed, B * T, C, C, p[2], p[3]);
}

TEST(CausalSelfAttentionTest, ForwardMatchesNaiveReference) {
  CausalSelfAttention attn("attn", 8, 2, 0.02f, 5);
  PerturbParameters(attn, 5, 0.3f);
  const Tensor x = RandomTensor({2, 4, 8}, 5, "x");
  Tensor y;
  ASSERT_TRUE(attn.Forward({0, nullptr}, x, &y).ok());
  ASSERT_EQ(y.shape(), Shape({2, 4, 8}));
  const std::vector<double> want = AttentionRef(attn, x, 2);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.f32()[i], want[i], 2e-5) << i;
}

TEST(CausalSelfAttentionTest, IsCausal) {
  CausalSelfAttention attn("attn", 8, 2, 0.02f, 5);
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

TEST(LmHeadTest, ForwardIsMeanCrossEntropy) {
  std::unique_ptr<LmHead> owned = GptHead("head", 8, 7, /*tied=*/false, 3);
  LmHead& head = *owned;
  PerturbParameters(head, 3, 0.3f);
  const Tensor x = RandomTensor({2, 4, 8}, 3, "x");
  const Tensor targets = RandomIds({2, 4}, 7, 3, "t");
  Tensor loss;
  ASSERT_TRUE(head.Forward({0, &targets}, x, &loss).ok());
  ASSERT_EQ(loss.numel(), 1);
  const std::vector<Parameter*> p = head.Parameters();  // ln.w, ln.b, logits.w
  ASSERT_EQ(p.size(), 3u);
  double total = 0;
  for (int r = 0; r < 8; ++r) {
    const float* xr = x.f32() + r * 8;
    double mean = 0, var = 0;
    for (int c = 0; c < 8; ++c) mean += xr[c];
    mean /= 8;
    for (int c = 0; c < 8; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= 8;
    double h[8];
    for (int c = 0; c < 8; ++c) {
      h[c] = (xr[c] - mean) / std::sqrt(var + 1e-5) * p[0]->value.f32()[c] + p[1]->value.f32()[c];
    }
    double logits[7], mx = -1e300, sum = 0;
    for (int v = 0; v < 7; ++v) {
      logits[v] = 0;
      for (int c = 0; c < 8; ++c) logits[v] += h[c] * p[2]->value.f32()[v * 8 + c];
      mx = std::max(mx, logits[v]);
    }
    for (int v = 0; v < 7; ++v) sum += std::exp(logits[v] - mx);
    total += std::log(sum) + mx - logits[targets.i32()[r]];
  }
  EXPECT_NEAR(*LossValue(loss), total / 8, 1e-5);
}

TEST(MseLossTest, ForwardIsMeanSquaredError) {
  MseLoss mse("out.mse");
  const Tensor x = RandomTensor({3, 4}, 4, "x");
  const Tensor t = RandomTensor({3, 4}, 4, "t");
  Tensor loss;
  ASSERT_TRUE(mse.Forward({0, &t}, x, &loss).ok());
  double want = 0;
  for (int i = 0; i < 12; ++i) want += std::pow(double{x.f32()[i]} - t.f32()[i], 2);
  EXPECT_NEAR(*LossValue(loss), want / 12, 1e-6);
  EXPECT_EQ(loss.shape(), Shape({1}));
  EXPECT_EQ(loss.device(), Device::kCpu);  // the module's device
  EXPECT_TRUE(mse.Parameters().empty());
}

// ------------------------------------------------------------------ gradient checks

TEST(CausalSelfAttentionGradTest, MatchesFiniteDifferences) {
  CausalSelfAttention attn("attn", 8, 2, 0.02f, 5);
  PerturbParameters(attn, 10, 0.3f);  // attention scores O(1): a non-trivial softmax
  CheckModuleGradients(attn, RandomTensor({2, 4, 8}, 10, "x"), nullptr, 31, kH, kTol);
}

TEST(TransformerBlockGradTest, MatchesFiniteDifferences) {
  TransformerBlock block("block.0", 8, 2, 2, 6);
  PerturbParameters(block, 11, 0.2f);
  const std::vector<Parameter*> p = block.Parameters();
  ASSERT_EQ(p.size(), 12u);
  EXPECT_EQ(p[0]->name, "block.0.ln1.weight");
  EXPECT_EQ(p[2]->name, "block.0.attn.qkv.weight");
  EXPECT_EQ(p[11]->name, "block.0.mlp.proj.bias");
  // fc.weight has 256 elements, the others at most 256: every element is checked.
  CheckModuleGradients(block, RandomTensor({2, 4, 8}, 11, "x"), nullptr, 32, kH, kTol);
}

TEST(LmHeadGradTest, MatchesFiniteDifferences) {
  std::unique_ptr<LmHead> owned = GptHead("head", 8, 7, /*tied=*/false, 7);
  LmHead& head = *owned;
  PerturbParameters(head, 12, 0.3f);
  const Tensor targets = RandomIds({2, 4}, 7, 12, "t");
  CheckModuleGradients(head, RandomTensor({2, 4, 8}, 12, "x"), &targets, 33, kH, kLossTol);
}

TEST(MseLossGradTest, MatchesFiniteDifferences) {
  MseLoss mse("out.mse");
  const Tensor targets = RandomTensor({3, 4}, 13, "t");
  CheckModuleGradients(mse, RandomTensor({3, 4}, 13, "x"), &targets, 34, kH, kLossTol);
}

TEST(LossHeadTest, GradientScalesWithTheLossScale) {
  // dy is the loss scale (1/M in training): gradients are linear in it.
  MseLoss mse("out.mse");
  const Tensor t = RandomTensor({3, 4}, 14, "t");
  const Tensor x = RandomTensor({3, 4}, 14, "x");
  Tensor loss, d1, d4;
  ASSERT_TRUE(mse.Forward({0, &t}, x, &loss).ok());
  ASSERT_TRUE(mse.Backward({0, &t}, ScalarTensor(1.0f), &d1).ok());
  ASSERT_TRUE(mse.Forward({0, &t}, x, &loss).ok());
  ASSERT_TRUE(mse.Backward({0, &t}, ScalarTensor(0.25f), &d4).ok());
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(d4.f32()[i], 0.25f * d1.f32()[i]);
}

// ------------------------------------------------------------------ module contract

std::vector<ModuleCase> TransformerCases() {
  std::vector<ModuleCase> cases;
  const std::vector<Tensor> x = {RandomTensor({2, 4, 8}, 40, "x0"),
                                 RandomTensor({2, 4, 8}, 40, "x1")};
  cases.push_back({"attention",
                   [] {
                     auto m = std::make_unique<CausalSelfAttention>("block.0.attn", 8, 2, 0.02f, 1);
                     PerturbParameters(*m, 1, 0.3f);
                     return m;
                   },
                   x, {}, false, "block.0.attn"});
  cases.push_back({"transformer block",
                   [] {
                     auto m = std::make_unique<TransformerBlock>("block.1", 8, 2, 2, 1);
                     PerturbParameters(*m, 1, 0.2f);
                     return m;
                   },
                   x, {}, false, "block.1"});
  cases.push_back({"lm head",
                   [] {
                     auto m = GptHead("head", 8, 7, /*tied=*/false, 1);
                     PerturbParameters(*m, 1, 0.3f);
                     return m;
                   },
                   x, {RandomIds({2, 4}, 7, 41, "t0"), RandomIds({2, 4}, 7, 41, "t1")}, true,
                   "head"});
  cases.push_back({"mse", [] { return std::make_unique<MseLoss>("out.mse"); }, x,
                   {RandomTensor({2, 4, 8}, 42, "t0"), RandomTensor({2, 4, 8}, 42, "t1")}, true,
                   "out.mse"});
  return cases;
}

TEST(TransformerContractTest, SplitAndInterleavedBackwardAreBitIdentical) {
  for (const ModuleCase& c : TransformerCases()) {
    SCOPED_TRACE(c.label);
    testing::CheckScheduleInvariance(c);
  }
}

TEST(TransformerContractTest, StashMisuseIsFailedPrecondition) {
  for (const ModuleCase& c : TransformerCases()) {
    SCOPED_TRACE(c.label);
    testing::CheckStashErrors(c);
  }
}

// ------------------------------------------------------------------ bad input

TEST(CausalSelfAttentionTest, RefusesBadShapes) {
  CausalSelfAttention attn("block.2.attn", 8, 2, 0.02f, 1);
  Tensor y;
  ExpectError(attn.Forward({0, nullptr}, RandomTensor({8, 8}, 1, "x"), &y), kInvalid,
              "block.2.attn", "rank 2");
  ExpectError(attn.Forward({0, nullptr}, RandomTensor({2, 4, 6}, 1, "x"), &y), kInvalid,
              "block.2.attn", "wrong width");
  EXPECT_EQ(attn.InFlight(), 0);
}

TEST(TransformerBlockTest, RefusesBadShapes) {
  TransformerBlock block("block.3", 8, 2, 2, 1);
  Tensor y, dx;
  ExpectError(block.Forward({0, nullptr}, RandomTensor({2, 4, 4}, 1, "x"), &y), kInvalid,
              "block.3", "wrong width");
  EXPECT_EQ(block.InFlight(), 0);
  ASSERT_TRUE(block.Forward({0, nullptr}, RandomTensor({2, 4, 8}, 1, "x"), &y).ok());
  ExpectError(block.BackwardInput({0, nullptr}, RandomTensor({2, 4, 4}, 1, "dy"), &dx),
              kInvalid, "block.3", "gradient of the wrong width");
}

TEST(LmHeadTest, RefusesBadTargetsAndScale) {
  std::unique_ptr<LmHead> owned = GptHead("head", 8, 7, /*tied=*/false, 1);
  LmHead& head = *owned;
  const Tensor x = RandomTensor({2, 4, 8}, 1, "x");
  Tensor y, dx;
  ExpectError(head.Forward({0, nullptr}, x, &y), kInvalid, "head", "no targets");
  const Tensor f32_targets = Tensor::Zeros({2, 4});
  ExpectError(head.Forward({0, &f32_targets}, x, &y), kInvalid, "head", "f32 targets");
  const Tensor short_targets = Tensor::Zeros({2, 3}, DType::kInt32);
  ExpectError(head.Forward({0, &short_targets}, x, &y), kInvalid, "head", "too few targets");
  for (int32_t bad : {7, -1}) {
    Tensor t = Tensor::Zeros({2, 4}, DType::kInt32);
    t.i32()[3] = bad;
    const absl::Status s = head.Forward({0, &t}, x, &y);
    ExpectError(s, kInvalid, "head", absl::StrCat("target id ", bad));
    EXPECT_NE(std::string(s.message()).find("vocabulary"), std::string::npos) << s;
  }
  ExpectError(head.Forward({0, nullptr}, RandomTensor({2, 4, 6}, 1, "x"), &y), kInvalid, "head",
              "wrong width");
  EXPECT_EQ(head.InFlight(), 0) << "refused forwards stash nothing";
  const Tensor targets = Tensor::Zeros({2, 4}, DType::kInt32);
  ASSERT_TRUE(head.Forward({0, &targets}, x, &y).ok());
  ExpectError(head.BackwardInput({0, &targets}, Tensor::Zeros({2}), &dx), kInvalid, "head",
              "a 2-element loss scale");
  EXPECT_TRUE(head.Backward({0, &targets}, ScalarTensor(1.0f), &dx).ok());
  EXPECT_EQ(dx.shape(), x.shape());
}

TEST(MseLossTest, RefusesBadTargetsAndScale) {
  MseLoss mse("out.mse");
  const Tensor x = RandomTensor({3, 2}, 1, "x");
  Tensor y, dx;
  ExpectError(mse.Forward({0, nullptr}, x, &y), kInvalid, "out.mse", "no targets");
  const Tensor wrong_shape = Tensor::Zeros({2, 3});
  ExpectError(mse.Forward({0, &wrong_shape}, x, &y), kInvalid, "out.mse", "targets of 2x3");
  const Tensor int_targets = Tensor::Zeros({3, 2}, DType::kInt32);
  ExpectError(mse.Forward({0, &int_targets}, x, &y), kInvalid, "out.mse", "int32 targets");
  const Tensor empty = Tensor::Zeros({0, 2});
  ExpectError(mse.Forward({0, &empty}, empty, &y), kInvalid, "out.mse", "no elements");
  EXPECT_EQ(mse.InFlight(), 0);
  const Tensor t = Tensor::Zeros({3, 2});
  ASSERT_TRUE(mse.Forward({0, &t}, x, &y).ok());
  ExpectError(mse.BackwardInput({0, &t}, Tensor(), &dx), kInvalid, "out.mse",
              "undefined loss scale");
}

}  // namespace
}  // namespace baton
