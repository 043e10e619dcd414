// Optimizers against hand-computed double-precision updates.
//
// Tolerance: the kernels compute in float32 and the references in double from the same
// float32 hyperparameters (lr, momentum, ... rounded to float first, as the spec stores
// them). Each step is a handful of float32 operations on values of size O(1), each
// rounding by at most 2^-24 relative (6e-8), so three steps stay within ~1e-6 of the double
// result; we allow |w - ref| <= 2e-6 (an update is lr * O(1) = O(1e-2), so a wrong term or
// a missed bias correction is off by >= 1e-4).
#include "common/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/nn/model.h"
#include "common/nn/module.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

constexpr double kTol = 2e-6;

// The gradients of steps 1..3 for a 3-element parameter: mixed signs and magnitudes
// (including one much smaller than the others, where Adam's normalisation shows).
constexpr double kGrads[3][3] = {{0.5, -1.25, 1e-3}, {-0.25, 0.75, 2e-3}, {1.5, 0.125, -4e-3}};
constexpr double kInit[3] = {1.0, -0.5, 2.0};

Parameter MakeParam(const double* init, int n) {
  Parameter p;
  p.name = "w";
  p.value = Tensor::Empty({n});
  p.grad = Tensor::Zeros({n});
  for (int i = 0; i < n; ++i) p.value.f32()[i] = static_cast<float>(init[i]);
  return p;
}

void SetGrad(Parameter& p, const double* g) {
  for (int64_t i = 0; i < p.grad.numel(); ++i) p.grad.f32()[i] = static_cast<float>(g[i]);
}

double F(float x) { return static_cast<double>(x); }  // a hyperparameter as stored

baton::v1::OptimizerSpec SgdSpec(float lr, float momentum, float wd) {
  baton::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_learning_rate(lr);
  spec.mutable_sgd()->set_momentum(momentum);
  spec.mutable_sgd()->set_weight_decay(wd);
  // These tests decay their one-dimensional "w": the scope that decays everything.
  spec.set_weight_decay_scope(baton::v1::WEIGHT_DECAY_SCOPE_ALL);
  return spec;
}

struct SgdCase {
  float lr, momentum, wd;
};

TEST(SgdTest, MatchesHandComputedUpdates) {
  for (const SgdCase c : {SgdCase{0.1f, 0.0f, 0.0f}, SgdCase{0.1f, 0.0f, 0.05f},
                          SgdCase{0.1f, 0.9f, 0.0f}, SgdCase{0.05f, 0.9f, 0.01f}}) {
    SCOPED_TRACE(testing::Message() << "lr=" << c.lr << " momentum=" << c.momentum
                                    << " wd=" << c.wd);
    Parameter p = MakeParam(kInit, 3);
    absl::StatusOr<std::unique_ptr<Optimizer>> opt =
        MakeOptimizer(SgdSpec(c.lr, c.momentum, c.wd), {&p}, false);
    ASSERT_TRUE(opt.ok()) << opt.status();
    double w[3], buf[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) w[i] = kInit[i];
    for (int step = 0; step < 3; ++step) {
      SetGrad(p, kGrads[step]);
      (*opt)->Step(c.lr);
      EXPECT_EQ((*opt)->steps_taken(), step + 1);
      for (int i = 0; i < 3; ++i) {
        // PyTorch: d = g + wd w; buf = d on the first step, momentum buf + d after; w -= lr buf.
        double d = kGrads[step][i] + F(c.wd) * w[i];
        if (c.momentum != 0.0f) {
          buf[i] = step == 0 ? d : F(c.momentum) * buf[i] + d;
          d = buf[i];
        }
        w[i] -= F(c.lr) * d;
        EXPECT_NEAR(p.value.f32()[i], w[i], kTol) << "step " << step + 1 << " element " << i;
        // The optimizer does not zero gradients.
        EXPECT_EQ(p.grad.f32()[i], static_cast<float>(kGrads[step][i]));
      }
    }
  }
}

TEST(SgdTest, FirstMomentumStepSetsBufferToGradient) {
  // Optimizer level: step 1 moves by exactly lr * g (not lr * (1 - momentum) g, nor
  // lr * momentum * g), and step 2 by lr * (momentum * g1 + g2).
  Parameter p = MakeParam(kInit, 3);
  auto opt = MakeOptimizer(SgdSpec(0.1f, 0.9f, 0.0f), {&p}, false);
  ASSERT_TRUE(opt.ok());
  SetGrad(p, kGrads[0]);
  (*opt)->Step(0.1f);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(p.value.f32()[i], kInit[i] - F(0.1f) * kGrads[0][i], kTol) << i;
  }
  SetGrad(p, kGrads[1]);
  (*opt)->Step(0.1f);
  for (int i = 0; i < 3; ++i) {
    const double w1 = kInit[i] - F(0.1f) * kGrads[0][i];
    EXPECT_NEAR(p.value.f32()[i], w1 - F(0.1f) * (F(0.9f) * kGrads[0][i] + kGrads[1][i]), kTol);
  }

  // Kernel level: on the first step the buffer is set to the (decayed) gradient whatever
  // it held before; afterwards it is momentum * buf + gradient.
  float w[3] = {1.0f, -0.5f, 2.0f};
  const float g[3] = {0.5f, -1.25f, 1e-3f};
  float buf[3] = {123.0f, -7.0f, 1e30f};  // garbage: must not leak into step 1
  CpuBackend()->SgdStep(3, 0.1f, 0.9f, 0.01f, /*first_step=*/true, w, g, buf);
  for (int i = 0; i < 3; ++i) {
    const float d = g[i] + 0.01f * static_cast<float>(kInit[i]);
    EXPECT_EQ(buf[i], d) << i;
    EXPECT_NEAR(w[i], kInit[i] - 0.1 * d, kTol) << i;
  }
  float buf2[3] = {1.0f, 1.0f, 1.0f};
  float w2[3] = {0.0f, 0.0f, 0.0f};
  CpuBackend()->SgdStep(3, 0.1f, 0.9f, 0.0f, /*first_step=*/false, w2, g, buf2);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(buf2[i], F(0.9f) + g[i], 1e-6) << i;
}

TEST(SgdTest, MomentumBuffersArePerParameter) {
  const double init_b[2] = {3.0, -3.0};
  Parameter a = MakeParam(kInit, 3);
  Parameter b = MakeParam(init_b, 2);
  auto opt = MakeOptimizer(SgdSpec(0.1f, 0.9f, 0.0f), {&a, &b}, false);
  ASSERT_TRUE(opt.ok());
  Parameter alone = MakeParam(kInit, 3);
  auto opt_alone = MakeOptimizer(SgdSpec(0.1f, 0.9f, 0.0f), {&alone}, false);
  ASSERT_TRUE(opt_alone.ok());
  for (int step = 0; step < 3; ++step) {
    SetGrad(a, kGrads[step]);
    SetGrad(alone, kGrads[step]);
    const double gb[2] = {10.0 * (step + 1), -5.0};
    SetGrad(b, gb);
    (*opt)->Step(0.1f);
    (*opt_alone)->Step(0.1f);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.value.f32()[i], alone.value.f32()[i]) << i;
}

baton::v1::OptimizerSpec AdamWSpec(float lr, float b1, float b2, float eps, float wd) {
  baton::v1::OptimizerSpec spec;
  auto* a = spec.mutable_adamw();
  a->set_learning_rate(lr);
  a->set_beta1(b1);
  a->set_beta2(b2);
  a->set_epsilon(eps);
  a->set_weight_decay(wd);
  spec.set_weight_decay_scope(baton::v1::WEIGHT_DECAY_SCOPE_ALL);
  return spec;
}

struct AdamCase {
  float lr, b1, b2, eps, wd;
};

TEST(AdamWTest, MatchesHandComputedUpdates) {
  for (const AdamCase c : {AdamCase{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f},
                           AdamCase{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f},
                           AdamCase{0.05f, 0.8f, 0.99f, 1e-3f, 0.01f}}) {
    SCOPED_TRACE(testing::Message() << "lr=" << c.lr << " b1=" << c.b1 << " b2=" << c.b2
                                    << " eps=" << c.eps << " wd=" << c.wd);
    Parameter p = MakeParam(kInit, 3);
    auto opt = MakeOptimizer(AdamWSpec(c.lr, c.b1, c.b2, c.eps, c.wd), {&p}, false);
    ASSERT_TRUE(opt.ok()) << opt.status();
    double w[3], m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) w[i] = kInit[i];
    const double lr = F(c.lr), b1 = F(c.b1), b2 = F(c.b2), eps = F(c.eps), wd = F(c.wd);
    for (int step = 1; step <= 3; ++step) {
      SetGrad(p, kGrads[step - 1]);
      (*opt)->Step(c.lr);
      EXPECT_EQ((*opt)->steps_taken(), step);
      const double bc1 = 1.0 - std::pow(b1, step);
      const double bc2 = 1.0 - std::pow(b2, step);
      for (int i = 0; i < 3; ++i) {
        const double g = kGrads[step - 1][i];
        w[i] *= 1.0 - lr * wd;  // decoupled weight decay, before the Adam update
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
        EXPECT_NEAR(p.value.f32()[i], w[i], kTol) << "step " << step << " element " << i;
      }
    }
  }
}

TEST(AdamWTest, FirstStepMovesEveryElementByAboutLr) {
  // With bias correction, step 1 is lr * g / (|g| + eps): the sign of g times lr, even for
  // a tiny gradient. Without it the move would be lr * 0.1 / sqrt(0.001) ~ 3.2 lr.
  Parameter p = MakeParam(kInit, 3);
  auto opt = MakeOptimizer(AdamWSpec(0.01f, 0.9f, 0.999f, 1e-8f, 0.0f), {&p}, false);
  ASSERT_TRUE(opt.ok());
  SetGrad(p, kGrads[0]);
  (*opt)->Step(0.01f);
  for (int i = 0; i < 3; ++i) {
    const double sign = kGrads[0][i] > 0 ? 1.0 : -1.0;
    EXPECT_NEAR(p.value.f32()[i], kInit[i] - F(0.01f) * sign, 1e-5) << i;
  }
}

// ---- The learning-rate schedule ----

baton::v1::OptimizerSpec Scheduled(float peak, int warmup, baton::v1::LrDecay decay,
                                   float min_lr, int decay_steps = 0) {
  baton::v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_learning_rate(peak);
  auto* l = spec.mutable_lr_schedule();
  l->set_warmup_steps(warmup);
  l->set_decay(decay);
  l->set_min_lr(min_lr);
  l->set_decay_steps(decay_steps);
  return spec;
}

// The formula in double, rounded once: what LearningRateAt must return exactly.
float Want(double x) { return static_cast<float>(x); }

TEST(LearningRateTest, WithoutAScheduleEveryStepGetsThePeak) {
  baton::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_learning_rate(0.05f);
  for (int64_t s : {0, 1, 99}) EXPECT_EQ(LearningRateAt(spec, s, 100), 0.05f) << s;
  EXPECT_EQ(PeakLearningRate(spec), 0.05f);
}

TEST(LearningRateTest, WarmupRisesLinearlyToThePeak) {
  const baton::v1::OptimizerSpec spec = Scheduled(0.1f, 4, baton::v1::LR_DECAY_CONSTANT, 0.0f);
  const double peak = F(0.1f);
  EXPECT_EQ(LearningRateAt(spec, 0, 10), Want(peak * 1 / 4));
  EXPECT_EQ(LearningRateAt(spec, 1, 10), Want(peak * 2 / 4));
  EXPECT_EQ(LearningRateAt(spec, 3, 10), 0.1f);  // the last warmup step reaches the peak
  EXPECT_EQ(LearningRateAt(spec, 4, 10), 0.1f);
  EXPECT_EQ(LearningRateAt(spec, 9, 10), 0.1f);
}

TEST(LearningRateTest, CosineFromThePeakTowardsMin) {
  // W = 2, N = 10: p = (s - 2) / 8.
  const baton::v1::OptimizerSpec spec = Scheduled(1.0f, 2, baton::v1::LR_DECAY_COSINE, 0.1f);
  const double peak = 1.0, mn = F(0.1f);
  auto want = [&](double p) { return Want(mn + 0.5 * (1 + std::cos(M_PI * p)) * (peak - mn)); };
  EXPECT_EQ(LearningRateAt(spec, 0, 10), 0.5f);
  EXPECT_EQ(LearningRateAt(spec, 2, 10), 1.0f);  // p = 0: the peak
  EXPECT_EQ(LearningRateAt(spec, 6, 10), want(0.5));
  EXPECT_NEAR(LearningRateAt(spec, 6, 10), 0.55, 1e-7);  // half way: the mean
  EXPECT_EQ(LearningRateAt(spec, 9, 10), want(7.0 / 8));
  EXPECT_EQ(LearningRateAt(spec, 10, 10), 0.1f);   // p = 1 (one past the last step): min
  EXPECT_EQ(LearningRateAt(spec, 50, 10), 0.1f);   // clamped
}

TEST(LearningRateTest, LinearFromThePeakTowardsMin) {
  const baton::v1::OptimizerSpec spec = Scheduled(1.0f, 0, baton::v1::LR_DECAY_LINEAR, 0.0f);
  EXPECT_EQ(LearningRateAt(spec, 0, 4), 1.0f);
  EXPECT_EQ(LearningRateAt(spec, 1, 4), 0.75f);
  EXPECT_EQ(LearningRateAt(spec, 3, 4), 0.25f);
  EXPECT_EQ(LearningRateAt(spec, 4, 4), 0.0f);
}

TEST(LearningRateTest, WsdHoldsThePeakThenDecaysOverTheLastSteps) {
  // N = 10, D = 4: the peak for s < 6, then q = (s - 6) / 4.
  const baton::v1::OptimizerSpec spec =
      Scheduled(1.0f, 2, baton::v1::LR_DECAY_WSD, 0.2f, /*decay_steps=*/4);
  const double mn = F(0.2f);
  EXPECT_EQ(LearningRateAt(spec, 0, 10), 0.5f);  // warmup first
  for (int64_t s = 2; s <= 6; ++s) EXPECT_EQ(LearningRateAt(spec, s, 10), 1.0f) << s;
  EXPECT_EQ(LearningRateAt(spec, 7, 10), Want(1.0 - (1.0 - mn) * 0.25));
  EXPECT_EQ(LearningRateAt(spec, 9, 10), Want(1.0 - (1.0 - mn) * 0.75));
  EXPECT_EQ(LearningRateAt(spec, 10, 10), 0.2f);
  // decay_steps 0: never decays.
  const baton::v1::OptimizerSpec flat = Scheduled(1.0f, 0, baton::v1::LR_DECAY_WSD, 0.2f, 0);
  EXPECT_EQ(LearningRateAt(flat, 9, 10), 1.0f);
}

TEST(LearningRateTest, EdgeCases) {
  // Warmup as long as the job: the decay never starts (N - W = 0 gives p = 1 after it).
  const baton::v1::OptimizerSpec all_warm =
      Scheduled(1.0f, 4, baton::v1::LR_DECAY_COSINE, 0.1f);
  EXPECT_EQ(LearningRateAt(all_warm, 3, 4), 1.0f);
  EXPECT_EQ(LearningRateAt(all_warm, 4, 4), 0.1f);
  // min = peak: flat.
  const baton::v1::OptimizerSpec flat = Scheduled(0.3f, 0, baton::v1::LR_DECAY_COSINE, 0.3f);
  for (int64_t s = 0; s < 5; ++s) EXPECT_EQ(LearningRateAt(flat, s, 5), 0.3f) << s;
  // One step, no warmup: the peak.
  EXPECT_EQ(LearningRateAt(Scheduled(0.3f, 0, baton::v1::LR_DECAY_LINEAR, 0.0f), 0, 1), 0.3f);
}

// ---- Weight-decay scope ----

TEST(WeightDecayScopeTest, DecidesPerParameter) {
  struct P {
    const char* name;
    Shape shape;
    bool matrices, matrices_tied, with_embeddings, all;
  };
  const P params[] = {
      {"embed.token", {30, 16}, false, false, true, true},
      {"embed.position", {8, 16}, false, false, true, true},
      {"block.0.ln1.weight", {16}, false, false, false, true},
      {"block.0.ln1.bias", {16}, false, false, false, true},
      {"block.0.attn.qkv.weight", {48, 16}, true, true, true, true},
      {"block.0.attn.qkv.bias", {48}, false, false, false, true},
      {"block.0.mlp.gate_up.weight", {48, 16}, true, true, true, true},
      {"head.norm.weight", {16}, false, false, false, true},
      {"head.logits.weight", {30, 16}, true, false, true, true},
  };
  for (const P& p : params) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(DecaysWeight(p.name, p.shape, baton::v1::WEIGHT_DECAY_SCOPE_MATRICES, false),
              p.matrices);
    EXPECT_EQ(DecaysWeight(p.name, p.shape, baton::v1::WEIGHT_DECAY_SCOPE_MATRICES, true),
              p.matrices_tied);
    for (bool tied : {false, true}) {
      EXPECT_EQ(DecaysWeight(p.name, p.shape,
                             baton::v1::WEIGHT_DECAY_SCOPE_MATRICES_AND_EMBEDDINGS, tied),
                p.with_embeddings);
      EXPECT_EQ(DecaysWeight(p.name, p.shape, baton::v1::WEIGHT_DECAY_SCOPE_ALL, tied), p.all);
    }
  }
}

TEST(WeightDecayScopeTest, TheOptimizerDecaysOnlyWhatTheScopeSelects) {
  // Zero gradients: SGD without momentum moves a parameter only by its decay.
  for (auto algo : {0, 1}) {
    Parameter vec = MakeParam(kInit, 3);
    vec.name = "block.0.ln1.weight";
    Parameter mat;
    mat.name = "block.0.mlp.fc.weight";
    mat.value = Tensor::Empty({1, 3});
    mat.grad = Tensor::Zeros({1, 3});
    for (int i = 0; i < 3; ++i) mat.value.f32()[i] = static_cast<float>(kInit[i]);
    baton::v1::OptimizerSpec spec;
    if (algo == 0) {
      spec = SgdSpec(0.1f, 0.0f, 0.5f);
    } else {
      spec = AdamWSpec(0.1f, 0.9f, 0.999f, 1e-8f, 0.5f);
    }
    spec.set_weight_decay_scope(baton::v1::WEIGHT_DECAY_SCOPE_MATRICES);
    auto opt = MakeOptimizer(spec, {&vec, &mat}, false);
    ASSERT_TRUE(opt.ok()) << opt.status();
    (*opt)->Step(0.1f);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(vec.value.f32()[i], static_cast<float>(kInit[i])) << algo << " " << i;
      EXPECT_NE(mat.value.f32()[i], static_cast<float>(kInit[i])) << algo << " " << i;
    }
  }
}

// ---- Clipping ----

TEST(GradClipTest, NormAndCoefficientFromBlockParts) {
  // Parts 9 and 16: norm 5.
  GradClip c = ClipFromBlockSquares({9.0, 16.0}, 1.0f);
  EXPECT_EQ(c.norm, 5.0);
  EXPECT_EQ(c.coef, static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_TRUE(c.clips());
  EXPECT_TRUE(c.finite());
  EXPECT_FALSE(ClipFromBlockSquares({9.0, 16.0}, 10.0f).clips());
  EXPECT_FALSE(ClipFromBlockSquares({1.0, std::nan("")}, 1.0f).finite());
  EXPECT_FALSE(ClipFromBlockSquares({1.0, INFINITY}, 1.0f).finite());
  EXPECT_EQ(ClipFromBlockSquares({}, 1.0f).norm, 0.0);
}

// The blocks of a GPT small enough to fill its gradients by hand.
absl::StatusOr<std::unique_ptr<Sequential>> TinyGptBlocks(int layers, uint64_t seed) {
  baton::v1::ModelSpec model;
  auto* g = model.mutable_gpt();
  g->set_vocab_size(5);
  g->set_context(4);
  g->set_d_model(4);
  g->set_heads(1);
  g->set_layers(layers);
  return BuildBlocks(model, seed);
}

TEST(GradClipTest, ABlockCountsItsTiedOutputProjectionOnlyWhenUntied) {
  auto blocks = TinyGptBlocks(/*layers=*/1, /*seed=*/1);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  Module& head = (*blocks)->at((*blocks)->size() - 1);
  double want_all = 0.0, want_untied_part = 0.0;
  for (Parameter* p : head.Parameters()) {
    for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad.f32()[i] = 0.5f;
    want_all += 0.25 * static_cast<double>(p->grad.numel());
    if (p->name != kTiedOutputName) want_untied_part += 0.25 * static_cast<double>(p->grad.numel());
  }
  ASSERT_NE(FindParameter(head, kTiedOutputName), nullptr);
  EXPECT_EQ(*BlockGradSquares(head, /*tied_embeddings=*/false), want_all);
  EXPECT_EQ(*BlockGradSquares(head, /*tied_embeddings=*/true), want_untied_part);
  // Scaling touches every gradient.
  ASSERT_TRUE(ScaleGradients(head.Parameters(), 0.5f).ok());
  for (Parameter* p : head.Parameters()) EXPECT_EQ(p->grad.f32()[0], 0.25f) << p->name;
}

// The several-block form: each block's part, the bits of the one-block call, in the order
// given (tied or not).
TEST(GradClipTest, BlockPartsAtOnceAreTheOneBlockParts) {
  auto blocks = TinyGptBlocks(/*layers=*/2, /*seed=*/3);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  std::vector<Module*> all;
  float v = 0.1f;
  for (int b = 0; b < (*blocks)->size(); ++b) {
    all.push_back(&(*blocks)->at(b));
    for (Parameter* p : all.back()->Parameters()) {
      for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad.f32()[i] = (v += 0.37f);
    }
  }
  std::reverse(all.begin(), all.end());  // any order: the parts follow it
  for (bool tied : {false, true}) {
    const absl::StatusOr<std::vector<double>> parts = BlockGradSquares(all, tied);
    ASSERT_TRUE(parts.ok()) << parts.status();
    ASSERT_EQ(parts->size(), all.size());
    for (size_t b = 0; b < all.size(); ++b) {
      EXPECT_EQ((*parts)[b], *BlockGradSquares(*all[b], tied)) << "block " << b << " tied " << tied;
      EXPECT_GT((*parts)[b], 0.0) << "block " << b;
    }
  }
  EXPECT_TRUE(BlockGradSquares(std::vector<Module*>{}, false)->empty());
}

// GradientSums: each gradient's Backend::Sum or SumSquares, bit for bit, in the order given;
// 0 for a parameter without a gradient.
TEST(GradClipTest, GradientSumsArePerGradientBackendSums) {
  Parameter a = MakeParam(kInit, 3), b = MakeParam(kInit, 3), none;
  none.name = "no gradient";
  SetGrad(a, kGrads[0]);
  SetGrad(b, kGrads[2]);
  const std::vector<Parameter*> params = {&a, &none, &b};
  const absl::StatusOr<std::vector<double>> sums = GradientSums(params, /*squares=*/false);
  const absl::StatusOr<std::vector<double>> squares = GradientSums(params, /*squares=*/true);
  ASSERT_TRUE(sums.ok()) << sums.status();
  ASSERT_TRUE(squares.ok()) << squares.status();
  Backend* cpu = CpuBackend();
  EXPECT_EQ(*sums,
            (std::vector<double>{cpu->Sum(3, a.grad.f32()), 0.0, cpu->Sum(3, b.grad.f32())}));
  EXPECT_EQ(*squares, (std::vector<double>{cpu->SumSquares(3, a.grad.f32()), 0.0,
                                           cpu->SumSquares(3, b.grad.f32())}));
  EXPECT_TRUE(GradientSums({}, /*squares=*/true)->empty());
}

TEST(OptimizerTest, RefusesSpecWithoutAlgorithm) {
  Parameter p = MakeParam(kInit, 3);
  const absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      MakeOptimizer(baton::v1::OptimizerSpec(), {&p}, false);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
