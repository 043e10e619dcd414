#include "common/optim/optimizer.h"

#include <cmath>
#include <utility>

#include "common/core/status.h"

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

class Sgd final : public Optimizer {
 public:
  Sgd(const baton::v1::SgdSpec& spec, std::vector<Parameter*> params, Backend* be)
      : spec_(spec), params_(std::move(params)), be_(be) {}

  absl::Status Init() {
    if (spec_.momentum() == 0.0f) return absl::OkStatus();
    for (Parameter* p : params_) {
      BATON_ASSIGN_OR_RETURN(Tensor buf, StateFor(*p, "momentum"));
      momentum_.push_back(std::move(buf));
    }
    return absl::OkStatus();
  }

  void Step() override {
    const bool first = steps_ == 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter* p = params_[i];
      float* buf = momentum_.empty() ? nullptr : momentum_[i].f32();
      be_->SgdStep(p->value.numel(), spec_.learning_rate(), spec_.momentum(),
                   spec_.weight_decay(), first, p->value.f32(), p->grad.f32(), buf);
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
  Backend* const be_;
  std::vector<Tensor> momentum_;  // one per parameter, when momentum != 0
};

class AdamW final : public Optimizer {
 public:
  AdamW(const baton::v1::AdamWSpec& spec, std::vector<Parameter*> params, Backend* be)
      : spec_(spec), params_(std::move(params)), be_(be) {}

  absl::Status Init() {
    for (Parameter* p : params_) {
      BATON_ASSIGN_OR_RETURN(Tensor m, StateFor(*p, "first moment"));
      BATON_ASSIGN_OR_RETURN(Tensor v, StateFor(*p, "second moment"));
      m_.push_back(std::move(m));
      v_.push_back(std::move(v));
    }
    return absl::OkStatus();
  }

  void Step() override {
    ++steps_;
    // Bias corrections in double, rounded once: the same expression on every worker.
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(spec_.beta1()),
                                                        static_cast<double>(steps_)));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(spec_.beta2()),
                                                        static_cast<double>(steps_)));
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter* p = params_[i];
      be_->AdamWStep(p->value.numel(), spec_.learning_rate(), spec_.beta1(), spec_.beta2(),
                     spec_.epsilon(), spec_.weight_decay(), bc1, bc2, p->value.f32(),
                     p->grad.f32(), m_[i].f32(), v_[i].f32());
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
  Backend* const be_;
  std::vector<Tensor> m_, v_;  // first and second moments, one per parameter
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const baton::v1::OptimizerSpec& spec,
                                                         std::vector<Parameter*> params) {
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
      auto sgd = std::make_unique<Sgd>(spec.sgd(), std::move(params), be);
      BATON_RETURN_IF_ERROR(sgd->Init());
      return sgd;
    }
    case baton::v1::OptimizerSpec::kAdamw: {
      auto adamw = std::make_unique<AdamW>(spec.adamw(), std::move(params), be);
      BATON_RETURN_IF_ERROR(adamw->Init());
      return adamw;
    }
    case baton::v1::OptimizerSpec::ALGORITHM_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("optimizer: no algorithm set (want sgd or adamw)");
}

}  // namespace baton
