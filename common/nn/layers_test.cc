// Independent checks of the basic layers (layers.h): forward against double-precision
// formulas, backward against central finite differences (method: grad_check_test_util.h), and the
// Module contract (split backward, interleaved micro-batches, stash errors, bad input).
#include "common/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
using ::baton::testing::Tolerance;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Tolerance of the layer gradient checks, with h = 1e-2 on O(1) values.
//  - Truncation: the central difference is exact for the parts that are linear in the
//    perturbed element (Linear without GELU, Embedding, LayerNorm's bias) and errs by
//    h^2/6 |f'''| ~ 2e-5 |f'''| for GELU and LayerNorm's input and gain, with |f'''| = O(1)
//    on the inputs used here (unit-variance rows, |x| <= ~5).
//  - Rounding: each output carries a few float32 ulps (~1e-7 relative); the probe loss sums
//    at most 30 of them with O(1) weights, so the difference quotient is off by ~1e-5.
// Observed: worst |error| 9e-5 (on a gradient of 7), at most 5% of the bound
// atol = 5e-4, rtol = 5e-3 (a 20x margin). Gradients are O(0.1-5), so a wrong term in a
// backward kernel fails by far more (every mutation of backward math tried failed them).
constexpr double kH = 1e-2;
constexpr Tolerance kTol{5e-4, 5e-3};

float GeluRef(double x) {
  const double inner = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return static_cast<float>(0.5 * x * (1.0 + std::tanh(inner)));
}

Linear::Options LinearOptions(bool bias, bool gelu, float stddev = 0.5f) {
  Linear::Options o;
  o.bias = bias;
  o.gelu = gelu;
  o.init_stddev = stddev;
  return o;
}

// ------------------------------------------------------------------ forward references

TEST(LinearTest, ForwardMatchesDoubleReference) {
  for (bool gelu : {false, true}) {
    Linear lin("fc", 5, 4, LinearOptions(true, gelu), 11);
    PerturbParameters(lin, 1, 0.3f);  // non-zero bias
    const Tensor x = RandomTensor({2, 3, 5}, 1, "x");
    Tensor y;
    ASSERT_TRUE(lin.Forward({0, nullptr}, x, &y).ok());
    ASSERT_EQ(y.shape(), Shape({2, 3, 4}));
    const std::vector<Parameter*> p = lin.Parameters();
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0]->name, "fc.weight");
    EXPECT_EQ(p[0]->value.shape(), Shape({4, 5}));
    EXPECT_EQ(p[1]->name, "fc.bias");
    for (int r = 0; r < 6; ++r) {
      for (int o = 0; o < 4; ++o) {
        double z = p[1]->value.f32()[o];
        for (int i = 0; i < 5; ++i) {
          z += static_cast<double>(x.f32()[r * 5 + i]) * p[0]->value.f32()[o * 5 + i];
        }
        const double want = gelu ? GeluRef(z) : z;
        EXPECT_NEAR(y.f32()[r * 4 + o], want, 1e-5) << "row " << r << " out " << o;
      }
    }
  }
}

// bf16 (module.h's Precision): the Linear is the fp32 Linear on rounded operands (input,
// weight, output gradient), with its output and input gradient rounded; its weight
// gradient is float32.
TEST(LinearTest, Bf16IsFp32OnRoundedOperandsWithRoundedOutputs) {
  Backend* be = CpuBackend();
  auto rounded = [&](const Tensor& t) {
    Tensor r = t.Clone();
    be->RoundToBf16(r.numel(), r.f32(), r.f32());
    return r;
  };
  for (bool gelu : {false, true}) {
    Linear bf("fc", 5, 4, LinearOptions(true, gelu), 11);
    Linear fp("fc", 5, 4, LinearOptions(true, gelu), 11);
    PerturbParameters(bf, 1, 0.3f);
    PerturbParameters(fp, 1, 0.3f);
    Tensor& w = fp.Parameters()[0]->value;
    be->RoundToBf16(w.numel(), w.f32(), w.f32());
    const Tensor x = RandomTensor({2, 3, 5}, 1, "x");
    const Tensor dy = RandomTensor({2, 3, 4}, 2, "dy");
    MicroBatch b16{0, nullptr, Precision::kBf16};
    Tensor y_bf, y_fp, dx_bf, dx_fp;
    ASSERT_TRUE(bf.Forward(b16, x, &y_bf).ok());
    ASSERT_TRUE(fp.Forward({0, nullptr}, rounded(x), &y_fp).ok());
    ASSERT_TRUE(bf.Backward(b16, dy, &dx_bf).ok());
    // Through GELU the output gradient dz is rounded after GELU's backward; without, dy is.
    ASSERT_TRUE(fp.Backward({0, nullptr}, gelu ? dy : rounded(dy), &dx_fp).ok());
    const Tensor want_y = rounded(y_fp);
    ASSERT_EQ(y_bf.numel(), want_y.numel());
    bool any_changed = false;
    for (int64_t i = 0; i < y_bf.numel(); ++i) {
      EXPECT_EQ(y_bf.f32()[i], want_y.f32()[i]) << i;
      any_changed |= y_fp.f32()[i] != want_y.f32()[i];
    }
    EXPECT_TRUE(any_changed) << "rounding the output must change some fp32 outputs";
    if (!gelu) {  // (with GELU the fp32 run's dz is not rounded: only y and shapes compare)
      const Tensor want_dx = rounded(dx_fp);
      for (int64_t i = 0; i < dx_bf.numel(); ++i) EXPECT_EQ(dx_bf.f32()[i], want_dx.f32()[i]);
      const std::vector<Parameter*> pb = bf.Parameters(), pf = fp.Parameters();
      for (size_t k = 0; k < pb.size(); ++k) {
        for (int64_t i = 0; i < pb[k]->grad.numel(); ++i) {
          EXPECT_EQ(pb[k]->grad.f32()[i], pf[k]->grad.f32()[i]) << pb[k]->name << " " << i;
        }
      }
      // The master weight itself stays float32 (not rounded by the forward).
      EXPECT_NE(std::memcmp(pb[0]->value.f32(), pf[0]->value.f32(), pb[0]->value.nbytes()), 0);
    }
  }
}

// Padded output rows (Options::out_align, the LM head's logits): the output is
// [..., out_ld()] and its first `out` columns, the input gradient and the weight gradient
// are an unpadded Linear's bits, in fp32 and bf16; the padding columns are left as they
// were (NaN in the gradient given changes nothing).
TEST(LinearTest, PaddedOutputRowsAreTheSameSums) {
  const int64_t in = 24, out = 50;
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    Linear::Options o = LinearOptions(false, false);
    o.round_output = false;
    Linear plain("fc", in, out, o, 7);
    o.out_align = 64;
    Linear padded("fc", in, out, o, 7);
    ASSERT_EQ(padded.out_ld(), 64);
    ASSERT_EQ(plain.out_ld(), out);
    const Tensor x = RandomTensor({3, 5, in}, 3, "x");
    const Tensor dy = RandomTensor({3, 5, out}, 4, "dy");
    Tensor dy_padded = Tensor::Empty({3, 5, 64});
    std::fill(dy_padded.f32(), dy_padded.f32() + dy_padded.numel(), NAN);
    CpuBackend()->CopyRows(15, out, dy.f32(), out, dy_padded.f32(), 64);
    const MicroBatch mb{0, nullptr, precision};
    Tensor y, yp, dx, dxp;
    ASSERT_TRUE(plain.Forward(mb, x, &y).ok());
    ASSERT_TRUE(padded.Forward(mb, x, &yp).ok());
    ASSERT_EQ(yp.shape(), (Shape{3, 5, 64}));
    for (int64_t r = 0; r < 15; ++r) {
      ASSERT_EQ(std::memcmp(yp.f32() + r * 64, y.f32() + r * out, out * sizeof(float)), 0) << r;
    }
    ASSERT_TRUE(plain.Backward(mb, dy, &dx).ok());
    ASSERT_TRUE(padded.Backward(mb, dy_padded, &dxp).ok());
    ASSERT_EQ(dxp.shape(), x.shape());
    EXPECT_EQ(std::memcmp(dx.raw(), dxp.raw(), dx.nbytes()), 0);
    const Tensor& gw = plain.Parameters()[0]->grad;
    const Tensor& gwp = padded.Parameters()[0]->grad;
    EXPECT_EQ(std::memcmp(gw.raw(), gwp.raw(), gw.nbytes()), 0);
    // A gradient shaped like the unpadded output is refused, naming the width it wants.
    ASSERT_TRUE(padded.Forward(mb, x, &yp).ok());
    ExpectError(padded.BackwardInput(mb, dy, &dxp), absl::StatusCode::kInvalidArgument, "[..., 64]",
                "an unpadded gradient");
    padded.Discard(0);
  }
}

TEST(GeluTest, ForwardMatchesTanhApproximation) {
  Gelu g("act");
  const Tensor x = RandomTensor({3, 7}, 2, "x", 2.0f);
  Tensor y;
  ASSERT_TRUE(g.Forward({0, nullptr}, x, &y).ok());
  for (int i = 0; i < 21; ++i) EXPECT_NEAR(y.f32()[i], GeluRef(x.f32()[i]), 1e-6) << i;
}

TEST(LayerNormTest, ForwardMatchesDoubleReference) {
  LayerNorm ln("ln", 6);
  PerturbParameters(ln, 3, 0.5f);
  const Tensor x = RandomTensor({4, 6}, 3, "x", 2.0f, 1.0f);
  Tensor y;
  ASSERT_TRUE(ln.Forward({0, nullptr}, x, &y).ok());
  const std::vector<Parameter*> p = ln.Parameters();
  for (int r = 0; r < 4; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 6; ++c) mean += x.f32()[r * 6 + c];
    mean /= 6;
    for (int c = 0; c < 6; ++c) var += std::pow(x.f32()[r * 6 + c] - mean, 2);
    var /= 6;  // biased, as PyTorch
    for (int c = 0; c < 6; ++c) {
      const double want = (x.f32()[r * 6 + c] - mean) / std::sqrt(var + 1e-5) *
                              p[0]->value.f32()[c] +
                          p[1]->value.f32()[c];
      EXPECT_NEAR(y.f32()[r * 6 + c], want, 1e-5);
    }
  }
}

TEST(EmbeddingTest, ForwardIsTokenPlusPosition) {
  Embedding e("embed", 7, 5, 4, 42);
  const Tensor ids = RandomIds({3, 4}, 7, 4, "ids");
  Tensor y;
  ASSERT_TRUE(e.Forward({0, nullptr}, ids, &y).ok());
  ASSERT_EQ(y.shape(), Shape({3, 4, 4}));
  const std::vector<Parameter*> p = e.Parameters();
  EXPECT_EQ(p[0]->value.shape(), Shape({7, 4}));
  EXPECT_EQ(p[1]->value.shape(), Shape({5, 4}));
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 4; ++t) {
      for (int c = 0; c < 4; ++c) {
        EXPECT_EQ(y.f32()[(b * 4 + t) * 4 + c],
                  p[0]->value.f32()[ids.i32()[b * 4 + t] * 4 + c] + p[1]->value.f32()[t * 4 + c]);
      }
    }
  }
}

// ------------------------------------------------------------------ gradient checks

// In bf16 a Linear keeps its input (until the weight gradient) and its output gradient
// (between the input and weight gradients, split apart by zero-bubble schedules) as bf16
// bits: half the bytes of fp32. (The gradients are those of fp32 on the rounded operands:
// Bf16IsFp32OnRoundedOperandsWithRoundedOutputs, which goes through the same unpacking.)
TEST(LinearTest, Bf16KeepsItsOperandsAsBf16BitsHalfTheBytes) {
  Allocator* alloc = CpuAllocator();
  const int64_t rows = 8, in = 64, out = 48;  // multiples of the allocator's 64 bytes
  int64_t kept_x[2], kept_dz[2];
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    const int k = p == Precision::kBf16 ? 1 : 0;
    Linear fc("fc", in, out, LinearOptions(false, false), 11);
    const MicroBatch mb{0, nullptr, p};
    Tensor x = RandomTensor({rows, in}, 1, "x");
    if (p == Precision::kBf16) CpuBackend()->RoundToBf16(x.numel(), x.f32(), x.f32());
    const int64_t base = alloc->Stats().bytes_in_use - x.nbytes();
    Tensor y, dx;
    ASSERT_TRUE(fc.Forward(mb, x, &y).ok());
    x = Tensor();
    y = Tensor();
    kept_x[k] = alloc->Stats().bytes_in_use - base;
    Tensor dy = RandomTensor({rows, out}, 2, "dy");
    ASSERT_TRUE(fc.BackwardInput(mb, dy, &dx).ok());
    dy = Tensor();
    dx = Tensor();
    kept_dz[k] = alloc->Stats().bytes_in_use - base - kept_x[k];
    ASSERT_TRUE(fc.BackwardWeight(mb).ok());
    EXPECT_EQ(alloc->Stats().bytes_in_use, base) << "nothing stays behind";
  }
  EXPECT_EQ(kept_x[0], rows * in * 4);
  EXPECT_EQ(kept_x[1], rows * in * 2);
  EXPECT_EQ(kept_dz[0], rows * out * 4);  // dy itself, which the caller dropped
  EXPECT_EQ(kept_dz[1], rows * out * 2);
}

TEST(LinearGradTest, AllVariantsMatchFiniteDifferences) {
  for (bool bias : {true, false}) {
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(absl::StrCat("bias=", bias, " gelu=", gelu));
      Linear lin("fc", 5, 4, LinearOptions(bias, gelu), 11);
      PerturbParameters(lin, 5, 0.2f);
      EXPECT_EQ(lin.Parameters().size(), bias ? 2u : 1u);
      CheckModuleGradients(lin, RandomTensor({2, 3, 5}, 5, "x"), nullptr, 21, kH, kTol);
    }
  }
}

TEST(LinearGradTest, WithoutInputGradientLeavesDxUndefinedAndSameWeightGrads) {
  Linear::Options data = LinearOptions(true, true);
  data.compute_input_grad = false;
  Linear a("fc", 5, 4, data, 11);
  Linear b("fc", 5, 4, LinearOptions(true, true), 11);
  const Tensor x = RandomTensor({6, 5}, 6, "x");
  const Tensor dy = RandomTensor({6, 4}, 6, "dy");
  Tensor ya, yb, dxa, dxb;
  ASSERT_TRUE(a.Forward({0, nullptr}, x, &ya).ok());
  ASSERT_TRUE(b.Forward({0, nullptr}, x, &yb).ok());
  ASSERT_TRUE(a.Backward({0, nullptr}, dy, &dxa).ok());
  ASSERT_TRUE(b.Backward({0, nullptr}, dy, &dxb).ok());
  EXPECT_FALSE(dxa.defined());
  EXPECT_TRUE(dxb.defined());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(testing::BitEqual(a.Parameters()[i]->grad, b.Parameters()[i]->grad));
  }
}

TEST(GeluGradTest, MatchesFiniteDifferences) {
  Gelu g("act");
  // Spread over [-5, 5]: both tails and the curved middle.
  CheckModuleGradients(g, RandomTensor({3, 7}, 7, "x", 2.0f), nullptr, 22, kH, kTol);
}

TEST(LayerNormGradTest, MatchesFiniteDifferences) {
  LayerNorm ln("ln", 6);
  PerturbParameters(ln, 8, 0.5f);  // gain away from 1, bias away from 0
  CheckModuleGradients(ln, RandomTensor({2, 2, 6}, 8, "x", 1.0f, 0.5f), nullptr, 23, kH,
                       kTol);
}

TEST(EmbeddingGradTest, WeightsMatchFiniteDifferences) {
  Embedding e("embed", 7, 5, 4, 42);
  PerturbParameters(e, 9, 0.5f);
  // T = 4 < context = 5: the last position row must get a zero gradient. 12 ids over a
  // vocabulary of 7 repeat, so rows accumulate several positions.
  Tensor ids = RandomIds({3, 4}, 7, 9, "ids");
  ids.i32()[0] = 3;
  ids.i32()[5] = 3;
  CheckModuleGradients(e, ids, nullptr, 24, kH, kTol, /*check_dx=*/false);
  Tensor dx;
  Tensor y;
  ASSERT_TRUE(e.Forward({0, nullptr}, ids, &y).ok());
  ASSERT_TRUE(e.Backward({0, nullptr}, y, &dx).ok());
  EXPECT_FALSE(dx.defined()) << "the embedding's input is data";
}

// ------------------------------------------------------------------ module contract

std::vector<ModuleCase> LayerCases() {
  std::vector<ModuleCase> cases;
  const std::vector<Tensor> x5 = {RandomTensor({2, 3, 5}, 30, "x0"),
                                  RandomTensor({2, 3, 5}, 30, "x1")};
  for (bool bias : {true, false}) {
    for (bool gelu : {true, false}) {
      cases.push_back({absl::StrCat("linear bias=", bias, " gelu=", gelu),
                       [bias, gelu] {
                         auto m = std::make_unique<Linear>("fc", 5, 4,
                                                           LinearOptions(bias, gelu), 1);
                         PerturbParameters(*m, 1, 0.2f);
                         return m;
                       },
                       x5, {}, false, "fc"});
    }
  }
  cases.push_back({"gelu", [] { return std::make_unique<Gelu>("act"); }, x5, {}, false, "act"});
  cases.push_back({"layernorm",
                   [] {
                     auto m = std::make_unique<LayerNorm>("ln", 5);
                     PerturbParameters(*m, 2, 0.5f);
                     return m;
                   },
                   x5, {}, false, "ln"});
  cases.push_back({"embedding", [] { return std::make_unique<Embedding>("embed", 7, 5, 4, 3); },
                   {RandomIds({2, 5}, 7, 31, "a"), RandomIds({2, 5}, 7, 31, "b")}, {}, false,
                   "embed"});
  return cases;
}

TEST(LayerContractTest, SplitAndInterleavedBackwardAreBitIdentical) {
  for (const ModuleCase& c : LayerCases()) {
    SCOPED_TRACE(c.label);
    testing::CheckScheduleInvariance(c);
  }
}

TEST(LayerContractTest, StashMisuseIsFailedPrecondition) {
  for (const ModuleCase& c : LayerCases()) {
    SCOPED_TRACE(c.label);
    testing::CheckStashErrors(c);
  }
}

// ------------------------------------------------------------------ bad input

TEST(LinearTest, RefusesBadShapes) {
  Linear lin("block.1.fc", 5, 4, LinearOptions(true, false), 1);
  Tensor y, dx;
  ExpectError(lin.Forward({0, nullptr}, RandomTensor({2, 4}, 1, "x"), &y), kInvalid,
              "block.1.fc", "wrong input width");
  ExpectError(lin.Forward({0, nullptr}, Tensor::Zeros({2, 5}, DType::kInt32), &y), kInvalid,
              "block.1.fc", "int32 input");
  ExpectError(lin.Forward({0, nullptr}, Tensor(), &y), kInvalid, "block.1.fc",
              "undefined input");
  EXPECT_EQ(lin.InFlight(), 0) << "a refused forward stashes nothing";
  ASSERT_TRUE(lin.Forward({0, nullptr}, RandomTensor({2, 5}, 1, "x"), &y).ok());
  ExpectError(lin.BackwardInput({0, nullptr}, RandomTensor({2, 5}, 1, "dy"), &dx), kInvalid,
              "block.1.fc", "gradient of the wrong width");
  ExpectError(lin.BackwardInput({0, nullptr}, RandomTensor({3, 4}, 1, "dy"), &dx), kInvalid,
              "block.1.fc", "gradient with the wrong number of rows");
  EXPECT_TRUE(lin.Backward({0, nullptr}, RandomTensor({2, 4}, 1, "dy"), &dx).ok());
}

TEST(GeluTest, RefusesBadInput) {
  Gelu g("block.0.act");
  Tensor y, dx;
  ExpectError(g.Forward({0, nullptr}, Tensor::Zeros({3}, DType::kInt32), &y), kInvalid,
              "block.0.act", "int32 input");
  ASSERT_TRUE(g.Forward({0, nullptr}, RandomTensor({2, 3}, 1, "x"), &y).ok());
  ExpectError(g.BackwardInput({0, nullptr}, RandomTensor({3, 2}, 1, "dy"), &dx), kInvalid,
              "block.0.act", "gradient of another shape");
}

// ForwardResidual is the add, the rounding (bf16) and Forward in turn, bit for bit: the
// sum, the output, and the gradients of the backward that follows.
TEST(LayerNormTest, ForwardResidualIsTheAddTheRoundingAndForward) {
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(p == Precision::kBf16 ? "bf16" : "fp32");
    MicroBatch mb{0, nullptr, p};
    Backend* be = BackendOrDie(Device::kCpu);
    const Tensor a = RandomTensor({3, 4, 8}, 7, "a"), b = RandomTensor({3, 4, 8}, 7, "b");
    const Tensor dy = RandomTensor({3, 4, 8}, 7, "dy");
    LayerNorm fused("ln", 8), plain("ln", 8);
    PerturbParameters(fused, 5, 0.5f);
    PerturbParameters(plain, 5, 0.5f);
    Tensor sum, y, dx;
    ASSERT_TRUE(fused.ForwardResidual(mb, a, b, &sum, &y).ok());
    ASSERT_TRUE(fused.BackwardInput(mb, dy, &dx).ok());
    ASSERT_TRUE(fused.BackwardWeight(mb).ok());
    Tensor want_sum = Tensor::Empty(a.shape()), want_y, want_dx;
    be->Add(a.numel(), a.f32(), b.f32(), want_sum.f32());
    RoundIfBf16(mb, be, &want_sum);
    ASSERT_TRUE(plain.Forward(mb, want_sum, &want_y).ok());
    ASSERT_TRUE(plain.BackwardInput(mb, dy, &want_dx).ok());
    ASSERT_TRUE(plain.BackwardWeight(mb).ok());
    EXPECT_TRUE(testing::BitEqual(sum, want_sum));
    EXPECT_TRUE(testing::BitEqual(y, want_y));
    EXPECT_TRUE(testing::BitEqual(dx, want_dx));
    for (size_t i = 0; i < fused.Parameters().size(); ++i) {
      EXPECT_TRUE(testing::BitEqual(fused.Parameters()[i]->grad, plain.Parameters()[i]->grad)) << i;
    }
    // Differently shaped terms are refused, naming the module.
    Tensor s2, y2;
    ExpectError(fused.ForwardResidual(mb, a, RandomTensor({3, 5, 8}, 7, "c"), &s2, &y2),
                kInvalid, "ln", "shapes differ");
  }
}

TEST(LayerNormTest, RefusesBadShapes) {
  LayerNorm ln("head.ln", 6);
  Tensor y, dx;
  ExpectError(ln.Forward({0, nullptr}, RandomTensor({2, 5}, 1, "x"), &y), kInvalid, "head.ln",
              "wrong width");
  ASSERT_TRUE(ln.Forward({0, nullptr}, RandomTensor({2, 6}, 1, "x"), &y).ok());
  ExpectError(ln.BackwardInput({0, nullptr}, RandomTensor({3, 6}, 1, "dy"), &dx), kInvalid,
              "head.ln", "gradient of another shape");
}

TEST(EmbeddingTest, RefusesBadShapesAndOutOfVocabularyIds) {
  Embedding e("embed", 7, 5, 4, 1);
  Tensor y, dx;
  ExpectError(e.Forward({0, nullptr}, RandomTensor({2, 3}, 1, "x"), &y), kInvalid, "embed",
              "f32 input");
  ExpectError(e.Forward({0, nullptr}, Tensor::Zeros({6}, DType::kInt32), &y), kInvalid, "embed",
              "rank 1");
  ExpectError(e.Forward({0, nullptr}, Tensor::Zeros({2, 3, 1}, DType::kInt32), &y), kInvalid,
              "embed", "rank 3");
  ExpectError(e.Forward({0, nullptr}, Tensor::Zeros({2, 6}, DType::kInt32), &y), kInvalid,
              "embed", "longer than the context");
  for (int32_t bad : {7, -1, 1 << 30}) {
    Tensor ids = Tensor::Zeros({2, 3}, DType::kInt32);
    ids.i32()[4] = bad;
    const absl::Status s = e.Forward({0, nullptr}, ids, &y);
    ExpectError(s, kInvalid, "embed", absl::StrCat("token id ", bad));
    EXPECT_NE(std::string(s.message()).find("vocabulary"), std::string::npos) << s;
  }
  EXPECT_EQ(e.InFlight(), 0) << "a refused forward stashes nothing";
  // The whole valid range is accepted, context-long sequences too.
  Tensor ids = Tensor::Zeros({1, 5}, DType::kInt32);
  for (int t = 0; t < 5; ++t) ids.i32()[t] = t == 4 ? 6 : t;
  ASSERT_TRUE(e.Forward({0, nullptr}, ids, &y).ok());
  ExpectError(e.BackwardInput({0, nullptr}, RandomTensor({1, 5, 3}, 1, "dy"), &dx), kInvalid,
              "embed", "gradient of another shape");
}

}  // namespace
}  // namespace baton
