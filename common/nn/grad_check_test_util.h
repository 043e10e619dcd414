// Test-only helpers for the nn tests: deterministic test tensors, finite-difference gradient
// checks of Modules, and the generic behaviour checks (split backward, interleaved
// micro-batches, stash errors) every module must pass. Include from *_test.cc only.
//
// Gradient check method. Layers compute in float32. For an activation module the probe loss
// is L = sum_i r_i * y_i with fixed random r (the "upstream gradient"), accumulated in
// double from the float32 outputs; for a loss module (1-element output) L is the loss it
// returns. The analytic gradients are dx from BackwardInput(dy = r, or the loss scale 1.0)
// and the parameter grads from BackwardWeight with every grad zeroed first. The numeric
// gradient of element theta is (L(theta + h) - L(theta - h)) / (theta_plus - theta_minus),
// where theta_plus/minus are the float32 values actually stored (so the step is exact), and
// the element is restored bit for bit afterwards. An element passes when
//   |analytic - numeric| <= atol + rtol * |numeric|.
// Every test states its h and tolerance, and why they hold.
#ifndef BATON_COMMON_NN_GRAD_CHECK_TEST_UTIL_H_
#define BATON_COMMON_NN_GRAD_CHECK_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/rng.h"
#include "common/core/tensor.h"
#include "common/nn/module.h"
#include "gtest/gtest.h"

namespace baton::testing {

// ------------------------------------------------------------------ test tensors

// f32 tensor with values mean + stddev * N(0, 1) from the stream (seed, name).
inline Tensor RandomTensor(const Shape& shape, uint64_t seed, const std::string& name,
                           float stddev = 1.0f, float mean = 0.0f) {
  Tensor t = Tensor::Empty(shape);
  RngStream(seed, name).FillNormal(t.f32(), t.numel(), mean, stddev);
  return t;
}

// int32 tensor with values in [0, bound) from the stream (seed, name).
inline Tensor RandomIds(const Shape& shape, int64_t bound, uint64_t seed,
                        const std::string& name) {
  Tensor t = Tensor::Empty(shape, DType::kInt32);
  RngStream rng(seed, name);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.i32()[i] = static_cast<int32_t>(rng.UniformInt(static_cast<uint64_t>(i),
                                                     static_cast<uint64_t>(bound)));
  }
  return t;
}

inline Tensor ScalarTensor(float v) {
  Tensor t = Tensor::Empty({1});
  t.f32()[0] = v;
  return t;
}

// Adds N(0, stddev) noise to every parameter value. Moves parameters away from their
// special initial values (LayerNorm gain 1 and bias 0, zero biases, tiny weights), which
// would otherwise hide backward bugs that ignore a parameter, and makes gradients O(1).
inline void PerturbParameters(Module& m, uint64_t seed, float stddev) {
  for (Parameter* p : m.Parameters()) {
    RngStream rng(seed, "perturb/" + p->name);
    for (int64_t i = 0; i < p->value.numel(); ++i) {
      p->value.f32()[i] += stddev * rng.Normal(static_cast<uint64_t>(i));
    }
  }
}

inline bool BitEqual(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline std::vector<Tensor> CloneGrads(Module& m) {
  std::vector<Tensor> out;
  for (Parameter* p : m.Parameters()) out.push_back(p->grad.Clone());
  return out;
}

inline void ZeroGrads(Module& m) {
  for (Parameter* p : m.Parameters()) p->grad.SetZero();
}

// ------------------------------------------------------------------ gradient check

struct Tolerance {
  double atol;
  double rtol;
};

// Aborts with the status when `expr` fails: the probe cannot go on without its forward.
#define BATON_PROBE_CHECK_OK(expr)                                       \
  do {                                                                   \
    const ::absl::Status probe_status_ = (expr);                         \
    if (!probe_status_.ok()) {                                           \
      std::fprintf(stderr, "%s\n", probe_status_.ToString().c_str());    \
      std::abort();                                                      \
    }                                                                    \
  } while (false)

// Runs one module on one input and evaluates its probe loss (see the file comment).
class Probe {
 public:
  // `targets` (may be null) must outlive the probe. `x` is held by handle: perturbing its
  // elements in place changes what Loss() sees.
  Probe(Module* module, Tensor x, const Tensor* targets, uint64_t seed)
      : module_(module), x_(std::move(x)), targets_(targets) {
    Tensor y;
    BATON_PROBE_CHECK_OK(module_->Forward(Mb(), x_, &y));
    is_loss_ = y.numel() == 1 && targets_ != nullptr;
    dy_ = is_loss_ ? ScalarTensor(1.0f) : RandomTensor(y.shape(), seed, "probe/r");
    Release(y);
  }

  const Tensor& x() const { return x_; }
  const Tensor& dy() const { return dy_; }
  bool is_loss() const { return is_loss_; }

  // The probe loss of one forward pass, in double. Leaves the module holding nothing and
  // its grads unchanged up to adding zeros.
  double Loss() {
    Tensor y;
    BATON_PROBE_CHECK_OK(module_->Forward(Mb(), x_, &y));
    double l = 0.0;
    if (is_loss_) {
      l = static_cast<double>(*LossValue(y));
    } else {
      for (int64_t i = 0; i < y.numel(); ++i) {
        l += static_cast<double>(dy_.f32()[i]) * static_cast<double>(y.f32()[i]);
      }
    }
    Release(y);
    return l;
  }

  // Analytic gradients: grads zeroed, then Forward, BackwardInput, BackwardWeight.
  struct Grads {
    Tensor dx;                  // undefined where the module's input is data
    std::vector<Tensor> param;  // copies, in Parameters() order
  };
  Grads Analytic() {
    ZeroGrads(*module_);
    Tensor y;
    Grads g;
    BATON_PROBE_CHECK_OK(module_->Forward(Mb(), x_, &y));
    Tensor dx;
    BATON_PROBE_CHECK_OK(module_->BackwardInput(Mb(), dy_, &dx));
    BATON_PROBE_CHECK_OK(module_->BackwardWeight(Mb()));
    if (dx.defined()) g.dx = dx.Clone();
    g.param = CloneGrads(*module_);
    if (module_->InFlight() != 0) {
      ADD_FAILURE() << module_->name() << ": still holds " << module_->InFlight()
                    << " micro-batches after a full backward";
    }
    return g;
  }

 private:

  MicroBatch Mb() const { return MicroBatch{0, targets_}; }
  // Runs a backward with a zero upstream gradient to release the stash.
  void Release(const Tensor& y) {
    Tensor zero = Tensor::Zeros(y.shape());
    Tensor dx;
    BATON_PROBE_CHECK_OK(module_->Backward(Mb(), zero, &dx));
  }

  Module* module_;
  Tensor x_;
  const Tensor* targets_;
  bool is_loss_ = false;
  Tensor dy_;
};

// The elements to check: all of them when there are at most `max_elements`, else a
// deterministic sample of `max_elements` distinct indices.
inline std::vector<int64_t> SampleIndices(int64_t n, int64_t max_elements,
                                          const std::string& name) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  if (n <= max_elements) return idx;
  RngStream rng(0x5eed, "sample/" + name);
  // Fisher-Yates with counter-based draws: the same sample on every run.
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(
        rng.UniformInt(static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1)));
    std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(j)]);
  }
  idx.resize(static_cast<size_t>(max_elements));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Compares `analytic` with central differences of `loss` with respect to the elements of
// `value` (perturbed in place, restored bit for bit).
inline ::testing::AssertionResult MatchesFiniteDifferences(
    const std::string& what, Tensor value, const Tensor& analytic,
    const std::function<double()>& loss, double h, Tolerance tol,
    int64_t max_elements = 512) {
  if (!analytic.defined() || analytic.shape() != value.shape()) {
    return ::testing::AssertionFailure()
           << what << ": analytic gradient " << analytic.DebugString()
           << " does not match the value " << value.DebugString();
  }
  const std::vector<int64_t> idx = SampleIndices(value.numel(), max_elements, what);
  int failures = 0;
  double worst = 0.0;  // max of err / (atol + rtol |numeric|)
  double max_abs_grad = 0.0;
  double max_err = 0.0;
  std::string report;
  for (int64_t i : idx) {
    float* p = value.f32() + i;
    const float orig = *p;
    const float plus = static_cast<float>(static_cast<double>(orig) + h);
    const float minus = static_cast<float>(static_cast<double>(orig) - h);
    *p = plus;
    const double lp = loss();
    *p = minus;
    const double lm = loss();
    *p = orig;
    const double numeric = (lp - lm) / (static_cast<double>(plus) - static_cast<double>(minus));
    const double a = static_cast<double>(analytic.f32()[i]);
    const double err = std::abs(a - numeric);
    const double bound = tol.atol + tol.rtol * std::abs(numeric);
    worst = std::max(worst, err / bound);
    max_err = std::max(max_err, err);
    max_abs_grad = std::max(max_abs_grad, std::abs(numeric));
    if (!(err <= bound)) {  // also fails on NaN
      if (++failures <= 8) {
        absl::StrAppend(&report, "\n  [", i, "] analytic ", a, " numeric ", numeric,
                        " |diff| ", err, " > ", bound);
      }
    }
  }
  if (std::getenv("BATON_GRADCHECK_VERBOSE") != nullptr) {
    std::fprintf(stderr, "gradcheck %-36s n=%-4zu worst err/tol %.3g  max err %.2g  max|g| %.3g\n",
                 what.c_str(), idx.size(), worst, max_err, max_abs_grad);
  }
  if (failures > 0) {
    return ::testing::AssertionFailure()
           << what << ": " << failures << " of " << idx.size()
           << " elements differ from central differences (h=" << h << ", atol=" << tol.atol
           << ", rtol=" << tol.rtol << ")" << report;
  }
  return ::testing::AssertionSuccess();
}

// Checks dx (when the module computes one) and every parameter's gradient of `module` on
// input `x` against central differences. `check_dx` false skips dx (data inputs).
inline void CheckModuleGradients(Module& module, Tensor x, const Tensor* targets,
                                 uint64_t seed, double h, Tolerance tol, bool check_dx = true,
                                 int64_t max_elements = 512) {
  Probe probe(&module, std::move(x), targets, seed);
  const Probe::Grads g = probe.Analytic();
  const auto loss = [&probe] { return probe.Loss(); };
  if (check_dx) {
    ASSERT_TRUE(g.dx.defined()) << module.name() << ": no input gradient";
    EXPECT_TRUE(MatchesFiniteDifferences(module.name() + " dx", probe.x(), g.dx, loss, h, tol,
                                         max_elements));
  }
  const std::vector<Parameter*> params = module.Parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(MatchesFiniteDifferences(params[i]->name, params[i]->value, g.param[i], loss,
                                         h, tol, max_elements));
  }
}

// ------------------------------------------------------------------ behaviour checks

// A module under test: how to build it (deterministically) and what to feed it.
struct ModuleCase {
  std::string label;
  std::function<std::unique_ptr<Module>()> make;
  std::vector<Tensor> inputs;   // one per micro-batch (at least 2)
  std::vector<Tensor> targets;  // one per micro-batch, or empty for activation modules
  bool is_loss = false;
  // Expected in the error messages of stash misuse (the module or the sub-module that
  // detects it).
  std::string error_names;
};

inline const Tensor* TargetsOf(const ModuleCase& c, int mb) {
  return c.targets.empty() ? nullptr : &c.targets[static_cast<size_t>(mb)];
}
inline MicroBatch MbOf(const ModuleCase& c, int mb) { return MicroBatch{mb, TargetsOf(c, mb)}; }

// The upstream gradient of micro-batch `mb` for an output shaped `y`.
inline Tensor UpstreamGrad(const ModuleCase& c, const Tensor& y, int mb) {
  if (c.is_loss) return ScalarTensor(0.5f);  // 1/M with M = 2
  return RandomTensor(y.shape(), 77, absl::StrCat("dy/", mb));
}

struct RunResult {
  std::vector<Tensor> y, dx;
  std::vector<Tensor> grads;
};

// Runs micro-batches 0 and 1 through a fresh module in one of three orders:
//   kFused:       F0 B0 F1 B1 (Module::Backward)
//   kSplit:       F0 I0 W0 F1 I1 W1
//   kInterleaved: F0 F1 I0 I1 W0 W1, checking InFlight along the way.
enum class Order { kFused, kSplit, kInterleaved };

inline RunResult RunTwoMicroBatches(const ModuleCase& c, Order order) {
  std::unique_ptr<Module> m = c.make();
  RunResult r;
  r.y.resize(2);
  r.dx.resize(2);
  const bool has_params = !m->Parameters().empty();
  auto forward = [&](int mb) {
    EXPECT_TRUE(m->Forward(MbOf(c, mb), c.inputs[static_cast<size_t>(mb)], &r.y[mb]).ok());
  };
  auto input_grad = [&](int mb) {
    EXPECT_TRUE(m->BackwardInput(MbOf(c, mb), UpstreamGrad(c, r.y[mb], mb), &r.dx[mb]).ok());
  };
  auto weight_grad = [&](int mb) { EXPECT_TRUE(m->BackwardWeight(MbOf(c, mb)).ok()); };
  switch (order) {
    case Order::kFused:
      for (int mb = 0; mb < 2; ++mb) {
        forward(mb);
        EXPECT_TRUE(m->Backward(MbOf(c, mb), UpstreamGrad(c, r.y[mb], mb), &r.dx[mb]).ok());
      }
      break;
    case Order::kSplit:
      for (int mb = 0; mb < 2; ++mb) {
        forward(mb);
        input_grad(mb);
        weight_grad(mb);
      }
      break;
    case Order::kInterleaved:
      EXPECT_EQ(m->InFlight(), 0) << c.label;
      forward(0);
      EXPECT_EQ(m->InFlight(), 1) << c.label;
      forward(1);
      EXPECT_EQ(m->InFlight(), 2) << c.label << ": after F0 F1";
      input_grad(0);
      input_grad(1);
      // A module with weights keeps what BackwardWeight needs until it runs.
      if (has_params) {
        EXPECT_EQ(m->InFlight(), 2) << c.label << ": after I0 I1";
      }
      weight_grad(0);
      if (has_params) {
        EXPECT_EQ(m->InFlight(), 1) << c.label << ": after W0";
      }
      weight_grad(1);
      EXPECT_EQ(m->InFlight(), 0) << c.label << ": after W0 W1";
      break;
  }
  r.grads = CloneGrads(*m);
  return r;
}

inline void ExpectBitIdentical(const RunResult& a, const RunResult& b, const std::string& what) {
  for (int mb = 0; mb < 2; ++mb) {
    EXPECT_TRUE(BitEqual(a.y[mb], b.y[mb])) << what << ": output of micro-batch " << mb;
    EXPECT_TRUE(BitEqual(a.dx[mb], b.dx[mb])) << what << ": dx of micro-batch " << mb;
  }
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(BitEqual(a.grads[i], b.grads[i])) << what << ": grad of parameter " << i;
  }
}

// BackwardInput then BackwardWeight equals Backward, and F0 F1 I0 I1 W0 W1 equals
// F0 I0 W0 F1 I1 W1, bit for bit; InFlight counts micro-batches in flight.
inline void CheckScheduleInvariance(const ModuleCase& c) {
  const RunResult fused = RunTwoMicroBatches(c, Order::kFused);
  const RunResult split = RunTwoMicroBatches(c, Order::kSplit);
  const RunResult inter = RunTwoMicroBatches(c, Order::kInterleaved);
  // The runs must have done something: non-trivial gradients.
  bool any_nonzero = false;
  for (const Tensor& g : fused.grads) {
    for (int64_t i = 0; i < g.numel(); ++i) any_nonzero |= g.f32()[i] != 0.0f;
  }
  for (const Tensor& dx : fused.dx) {
    if (!dx.defined()) continue;  // data input (and Tensor().numel() is not 0 today)
    for (int64_t i = 0; i < dx.numel(); ++i) any_nonzero |= dx.f32()[i] != 0.0f;
  }
  EXPECT_TRUE(any_nonzero) << c.label << ": all gradients are zero";
  ExpectBitIdentical(fused, split, c.label + " (Backward vs BackwardInput+BackwardWeight)");
  ExpectBitIdentical(split, inter, c.label + " (F0 I0 W0 F1 I1 W1 vs F0 F1 I0 I1 W0 W1)");

  // Gradients accumulate over micro-batches: the two-micro-batch grads are the sum of the
  // grads of each micro-batch alone, up to float32 rounding. The kernels add row by row
  // into the accumulator (a bias gradient is ((g0 + r0) + r1) + ..., not g0 + g1), so the
  // rounding is that of the partial sums: we allow 1e-5 of the tensor's largest |a| + |b|
  // (elements whose true gradient is 0, such as the key bias of attention, are pure
  // rounding noise). Overwriting instead of accumulating is off by |a| or |b|.
  std::vector<std::vector<Tensor>> alone;
  for (int mb = 0; mb < 2; ++mb) {
    std::unique_ptr<Module> m = c.make();
    Tensor y, dx;
    EXPECT_TRUE(m->Forward(MbOf(c, mb), c.inputs[static_cast<size_t>(mb)], &y).ok());
    EXPECT_TRUE(m->Backward(MbOf(c, mb), UpstreamGrad(c, y, mb), &dx).ok());
    alone.push_back(CloneGrads(*m));
  }
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    const Tensor& g = fused.grads[i];
    double scale = 0.0;
    for (int64_t j = 0; j < g.numel(); ++j) {
      scale = std::max(scale, std::abs(double{alone[0][i].f32()[j]}) +
                                  std::abs(double{alone[1][i].f32()[j]}));
    }
    int bad = 0;
    for (int64_t j = 0; j < g.numel(); ++j) {
      const double a = alone[0][i].f32()[j], b = alone[1][i].f32()[j];
      const double want = a + b;
      if (!(std::abs(g.f32()[j] - want) <= 1e-5 * scale)) {
        if (++bad <= 3) {
          ADD_FAILURE() << c.label << ": grad of parameter " << i << " element " << j << " is "
                        << g.f32()[j] << ", want " << a << " + " << b;
        }
      }
    }
  }
}

inline void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& name,
                        const std::string& what) {
  EXPECT_EQ(s.code(), code) << what << ": " << s;
  EXPECT_NE(std::string(s.message()).find(name), std::string::npos)
      << what << ": message does not name " << name << ": " << s;
}

// Backward without forward, weight gradient before input gradient and a second forward of
// the same micro-batch are FAILED_PRECONDITION naming the module.
inline void CheckStashErrors(const ModuleCase& c) {
  const absl::StatusCode kFp = absl::StatusCode::kFailedPrecondition;
  Tensor dy;  // a well-formed upstream gradient for micro-batch 0
  {
    std::unique_ptr<Module> m = c.make();
    Tensor y, dx;
    ASSERT_TRUE(m->Forward(MbOf(c, 0), c.inputs[0], &y).ok());
    dy = UpstreamGrad(c, y, 0);
    // Micro-batch 1 never ran forward.
    ExpectError(m->BackwardInput(MbOf(c, 1), dy, &dx), kFp, c.error_names,
                c.label + " backward without forward");
    if (!m->Parameters().empty()) {
      ExpectError(m->BackwardWeight(MbOf(c, 1)), kFp, c.error_names,
                  c.label + " weight gradient without forward");
      // Micro-batch 0 ran forward but not BackwardInput.
      ExpectError(m->BackwardWeight(MbOf(c, 0)), kFp, c.error_names,
                  c.label + " weight gradient before input gradient");
    }
    // Forward twice for micro-batch 0.
    Tensor y2;
    ExpectError(m->Forward(MbOf(c, 0), c.inputs[0], &y2), kFp, c.error_names,
                c.label + " forward twice");
  }
  {
    // A fresh module: backward without any forward.
    std::unique_ptr<Module> m = c.make();
    Tensor dx;
    ExpectError(m->BackwardInput(MbOf(c, 0), dy, &dx), kFp, c.error_names,
                c.label + " backward on a fresh module");
    if (!m->Parameters().empty()) {
      ExpectError(m->BackwardWeight(MbOf(c, 0)), kFp, c.error_names,
                  c.label + " weight gradient on a fresh module");
    }
    EXPECT_EQ(m->InFlight(), 0) << c.label;
  }
}

}  // namespace baton::testing

#endif  // BATON_COMMON_NN_GRAD_CHECK_TEST_UTIL_H_
