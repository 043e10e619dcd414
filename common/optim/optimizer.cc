#include "common/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "common/core/status.h"
#include "common/nn/model.h"

namespace baton {
namespace {

// A zeroed state tensor shaped like `p`, on its device; the error names the parameter.
absl::StatusOr<Tensor> StateFor(const Parameter& p, const char* what) {
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(p.value.shape(), DType::kFloat32, p.value.device());
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat("optimizer ", what, " of ", p.name, ": ",
                                                        t.status().message()));
  }
  t->SetZero();
  return t;
}

// Per parameter: the weight decay it takes (the spec's, or 0 outside the scope).
std::vector<float> DecayOf(const std::vector<Parameter*>& params, float weight_decay,
                           const baton::v1::OptimizerSpec& spec, bool tied_embeddings) {
  std::vector<float> out;
  out.reserve(params.size());
  for (const Parameter* p : params) {
    out.push_back(DecaysWeight(p->name, p->value.shape(), spec.weight_decay_scope(),
                               tied_embeddings)
                      ? weight_decay
                      : 0.0f);
  }
  return out;
}

class Sgd final : public Optimizer {
 public:
  Sgd(const baton::v1::SgdSpec& spec, std::vector<Parameter*> params, std::vector<float> decay,
      Backend* be)
      : spec_(spec), params_(std::move(params)), decay_(std::move(decay)), be_(be) {}

  absl::Status Init() {
    if (spec_.momentum() == 0.0f) return absl::OkStatus();
    for (Parameter* p : params_) {
      BATON_ASSIGN_OR_RETURN(Tensor buf, StateFor(*p, "momentum"));
      momentum_.push_back(std::move(buf));
    }
    return absl::OkStatus();
  }

  void Step(float lr) override {
    const bool first = steps_ == 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter* p = params_[i];
      float* buf = momentum_.empty() ? nullptr : momentum_[i].f32();
      be_->SgdStep(p->value.numel(), lr, spec_.momentum(), decay_[i], first, p->value.f32(),
                   p->grad.f32(), buf);
    }
    ++steps_;
  }

  std::vector<Slot> Slots() override {
    std::vector<Slot> out;
    for (size_t i = 0; i < momentum_.size(); ++i) {
      out.push_back(Slot{params_[i], "momentum_buffer", &momentum_[i]});
    }
    return out;
  }

 private:
  const baton::v1::SgdSpec spec_;
  const std::vector<Parameter*> params_;
  const std::vector<float> decay_;  // per parameter
  Backend* const be_;
  std::vector<Tensor> momentum_;  // one per parameter, when momentum != 0
};

class AdamW final : public Optimizer {
 public:
  AdamW(const baton::v1::AdamWSpec& spec, std::vector<Parameter*> params,
        std::vector<float> decay, Backend* be)
      : spec_(spec), params_(std::move(params)), decay_(std::move(decay)), be_(be) {}

  absl::Status Init() {
    for (Parameter* p : params_) {
      BATON_ASSIGN_OR_RETURN(Tensor m, StateFor(*p, "first moment"));
      BATON_ASSIGN_OR_RETURN(Tensor v, StateFor(*p, "second moment"));
      m_.push_back(std::move(m));
      v_.push_back(std::move(v));
    }
    return absl::OkStatus();
  }

  void Step(float lr) override {
    ++steps_;
    // Bias corrections in double, rounded once: the same expression on every worker.
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(spec_.beta1()),
                                                        static_cast<double>(steps_)));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(spec_.beta2()),
                                                        static_cast<double>(steps_)));
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter* p = params_[i];
      be_->AdamWStep(p->value.numel(), lr, spec_.beta1(), spec_.beta2(), spec_.epsilon(),
                     decay_[i], bc1, bc2, p->value.f32(), p->grad.f32(), m_[i].f32(),
                     v_[i].f32());
    }
  }

  std::vector<Slot> Slots() override {
    std::vector<Slot> out;
    for (size_t i = 0; i < params_.size(); ++i) {
      out.push_back(Slot{params_[i], "exp_avg", &m_[i]});
      out.push_back(Slot{params_[i], "exp_avg_sq", &v_[i]});
    }
    return out;
  }

 private:
  const baton::v1::AdamWSpec spec_;
  const std::vector<Parameter*> params_;
  const std::vector<float> decay_;  // per parameter
  Backend* const be_;
  std::vector<Tensor> m_, v_;  // first and second moments, one per parameter
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const baton::v1::OptimizerSpec& spec,
                                                         std::vector<Parameter*> params,
                                                         bool tied_embeddings) {
  const Device device = params.empty() ? Device::kCpu : params.front()->value.device();
  for (const Parameter* p : params) {
    if (p->value.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: parameter ", p->name, " is on ", DeviceName(p->value.device()), ", ",
          params.front()->name, " on ", DeviceName(device), " (one optimizer, one device)"));
    }
  }
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(device));
  switch (spec.algorithm_case()) {
    case baton::v1::OptimizerSpec::kSgd: {
      std::vector<float> decay =
          DecayOf(params, spec.sgd().weight_decay(), spec, tied_embeddings);
      auto sgd = std::make_unique<Sgd>(spec.sgd(), std::move(params), std::move(decay), be);
      BATON_RETURN_IF_ERROR(sgd->Init());
      return sgd;
    }
    case baton::v1::OptimizerSpec::kAdamw: {
      std::vector<float> decay =
          DecayOf(params, spec.adamw().weight_decay(), spec, tied_embeddings);
      auto adamw =
          std::make_unique<AdamW>(spec.adamw(), std::move(params), std::move(decay), be);
      BATON_RETURN_IF_ERROR(adamw->Init());
      return adamw;
    }
    case baton::v1::OptimizerSpec::ALGORITHM_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("optimizer: no algorithm set (want sgd or adamw)");
}

std::vector<std::string> OptimizerSlotNames(const baton::v1::OptimizerSpec& spec) {
  if (spec.has_adamw()) return {"exp_avg", "exp_avg_sq"};
  if (spec.has_sgd() && spec.sgd().momentum() != 0.0f) return {"momentum_buffer"};
  return {};
}

float PeakLearningRate(const baton::v1::OptimizerSpec& spec) {
  switch (spec.algorithm_case()) {
    case baton::v1::OptimizerSpec::kSgd:
      return spec.sgd().learning_rate();
    case baton::v1::OptimizerSpec::kAdamw:
      return spec.adamw().learning_rate();
    case baton::v1::OptimizerSpec::ALGORITHM_NOT_SET:
      break;
  }
  return 0.0f;
}

float LearningRateAt(const baton::v1::OptimizerSpec& spec, int64_t step, int64_t total_steps) {
  const double peak = PeakLearningRate(spec);
  if (!spec.has_lr_schedule()) return static_cast<float>(peak);
  const baton::v1::LrSchedule& sch = spec.lr_schedule();
  const double s = static_cast<double>(step);
  const int64_t warmup = std::max<int64_t>(0, sch.warmup_steps());
  if (step < warmup) return static_cast<float>(peak * (s + 1.0) / static_cast<double>(warmup));
  const double min = sch.min_lr();
  auto clamp01 = [](double x) { return std::min(1.0, std::max(0.0, x)); };
  const int64_t span = total_steps - warmup;
  const double p =
      span <= 0 ? 1.0 : clamp01((s - static_cast<double>(warmup)) / static_cast<double>(span));
  double lr = peak;
  switch (sch.decay()) {
    case baton::v1::LR_DECAY_COSINE:
      lr = min + 0.5 * (1.0 + std::cos(M_PI * p)) * (peak - min);
      break;
    case baton::v1::LR_DECAY_LINEAR:
      lr = peak - (peak - min) * p;
      break;
    case baton::v1::LR_DECAY_WSD: {
      const int64_t d = std::max<int64_t>(0, sch.decay_steps());
      const double q =
          d == 0 ? 0.0
                 : clamp01((s - static_cast<double>(total_steps - d)) / static_cast<double>(d));
      lr = peak - (peak - min) * q;
      break;
    }
    default:  // LR_DECAY_CONSTANT (validation refuses unknown values)
      break;
  }
  return static_cast<float>(lr);
}

bool DecaysWeight(const std::string& name, const Shape& shape,
                  baton::v1::WeightDecayScope scope, bool tied_embeddings) {
  switch (scope) {
    case baton::v1::WEIGHT_DECAY_SCOPE_ALL:
      return true;
    case baton::v1::WEIGHT_DECAY_SCOPE_MATRICES_AND_EMBEDDINGS:
      return shape.size() >= 2;
    default:  // WEIGHT_DECAY_SCOPE_MATRICES
      break;
  }
  if (shape.size() < 2) return false;  // norms' weights, biases
  if (name == kTiedEmbeddingName || name == "embed.position") return false;
  if (tied_embeddings && name == kTiedOutputName) return false;
  return true;
}

absl::StatusOr<std::vector<double>> GradientSums(const std::vector<Parameter*>& params,
                                                 bool squares) {
  std::vector<double> out(params.size(), 0.0);
  std::map<Device, std::vector<size_t>> by_device;  // the parameters with a gradient
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]->grad.defined()) by_device[params[i]->grad.device()].push_back(i);
  }
  for (const auto& [device, which] : by_device) {
    BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(device));
    std::vector<const float*> xs;
    std::vector<int64_t> ns;
    for (size_t i : which) {
      xs.push_back(params[i]->grad.f32());
      ns.push_back(params[i]->grad.numel());
    }
    std::vector<double> sums(which.size());
    if (squares) {
      be->SumSquaresEach(xs, ns, sums.data());
    } else {
      be->SumEach(xs, ns, sums.data());
    }
    for (size_t k = 0; k < which.size(); ++k) out[which[k]] = sums[k];
  }
  return out;
}

std::vector<std::vector<Parameter*>> NormParameters(const std::vector<Module*>& blocks,
                                                    bool tied_embeddings) {
  std::vector<std::vector<Parameter*>> out(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (Parameter* p : blocks[b]->Parameters()) {
      if (!p->grad.defined()) continue;
      if (tied_embeddings && p->name == kTiedOutputName) continue;  // counted at the embedding
      out[b].push_back(p);
    }
  }
  return out;
}

absl::StatusOr<std::vector<double>> BlockGradSquares(const std::vector<Module*>& blocks,
                                                     bool tied_embeddings) {
  std::vector<Parameter*> counted;
  std::vector<size_t> block_of;  // counted[i] belongs to blocks[block_of[i]]
  const std::vector<std::vector<Parameter*>> by_block = NormParameters(blocks, tied_embeddings);
  for (size_t b = 0; b < by_block.size(); ++b) {
    for (Parameter* p : by_block[b]) {
      counted.push_back(p);
      block_of.push_back(b);
    }
  }
  BATON_ASSIGN_OR_RETURN(const std::vector<double> squares,
                         GradientSums(counted, /*squares=*/true));
  std::vector<double> parts(blocks.size(), 0.0);
  for (size_t i = 0; i < squares.size(); ++i) parts[block_of[i]] += squares[i];
  return parts;
}

absl::StatusOr<double> BlockGradSquares(Module& block, bool tied_embeddings) {
  BATON_ASSIGN_OR_RETURN(const std::vector<double> parts,
                         BlockGradSquares(std::vector<Module*>{&block}, tied_embeddings));
  return parts[0];
}

bool GradClip::finite() const { return std::isfinite(norm); }

GradClip ClipFromBlockSquares(const std::vector<double>& block_squares, float max_norm) {
  double total = 0.0;
  for (double part : block_squares) total += part;
  return ClipFromSquaredNorm(total, max_norm);
}

GradClip ClipFromSquaredNorm(double squared_norm, float max_norm) {
  GradClip out;
  out.norm = std::sqrt(squared_norm);
  out.coef = static_cast<float>(static_cast<double>(max_norm) / (out.norm + 1e-6));
  return out;
}

absl::Status ScaleGradients(const std::vector<Parameter*>& params, float coef) {
  for (Parameter* p : params) {
    if (!p->grad.defined()) continue;
    BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(p->grad.device()));
    be->Scale(p->grad.numel(), coef, p->grad.f32(), p->grad.f32());
  }
  return absl::OkStatus();
}

}  // namespace baton
