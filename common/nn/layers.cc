#include "common/nn/layers.h"

#include <utility>
#include <vector>

#include "common/core/check.h"
#include "common/core/status.h"

namespace baton {

absl::Status CheckTokenIds(const std::string& who, const char* what, const Tensor& ids,
                           int64_t vocab) {
  std::vector<int32_t> host;
  const int32_t* p = ids.i32();
  if (ids.device() != Device::kCpu) {  // checked on the host: copy the ids over
    host.resize(static_cast<size_t>(ids.numel()));
    BATON_RETURN_IF_ERROR(ids.CopyToHost(host.data()));
    p = host.data();
  }
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (p[i] < 0 || p[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": ", what, " ", p[i], " at ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckActivation(const std::string& who, const Tensor& t, int64_t channels) {
  if (!t.defined() || t.dtype() != DType::kFloat32 || t.rank() < 1 || t.dim(-1) != channels) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": expected a f32 tensor of shape [..., ",
                                                   channels, "], got ", t.DebugString()));
  }
  return absl::OkStatus();
}

namespace {
// Shape `like` with its last dimension replaced by `channels`.
Shape WithLastDim(const Shape& like, int64_t channels) {
  Shape s = like;
  s.back() = channels;
  return s;
}
}  // namespace

// ---------------------------------------------------------------------------- Linear

Linear::Linear(std::string name, int64_t in, int64_t out, const Options& options, uint64_t seed,
               Device device)
    : name_(std::move(name)),
      in_(in),
      out_(out),
      out_ld_((out + options.out_align - 1) / options.out_align * options.out_align),
      options_(options),
      device_(device),
      be_(BackendOrDie(device)),
      weight_(MakeParameter(name_ + ".weight", {out, in}, Init::kNormal, options.init_stddev, seed,
                            device, options.init_name)),
      stash_(name_) {
  BATON_CHECK(options.out_align >= 1 &&
              (out_ld_ == out || (!options.bias && !options.gelu)));  // a programming error
  weight_.bf16_operand = true;  // WeightOperand is its only reader
  if (options_.bias) {
    bias_ = MakeParameter(name_ + ".bias", {out}, Init::kZeros, 0.0f, seed, device);
  }
}

absl::StatusOr<Tensor> Linear::WeightOperand(const MicroBatch& mb) {
  if (weight_.value.dtype() == DType::kBFloat16) {  // kept as its bf16 bits (bf16_operand)
    if (!mb.bf16()) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, ": the weight is kept as bf16 bits but the micro-batch computes in float32"));
    }
    return weight_.value;
  }
  return PackIfBf16(name_, mb, be_, weight_.value);
}

absl::Status Linear::Forward(const MicroBatch& mb, const Tensor& input, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, input, in_));
  BATON_ASSIGN_OR_RETURN(const Tensor on_device, input.On(device_));  // data may come from the host
  // In bf16 the input is rounded to bf16 bits: the product's operand, and what is kept for
  // the weight gradient (half the bytes).
  BATON_ASSIGN_OR_RETURN(const Tensor x, PackIfBf16(name_, mb, be_, on_device));
  BATON_ASSIGN_OR_RETURN(const Tensor w, WeightOperand(mb));
  const int64_t rows = x.numel() / in_;
  Saved saved;
  saved.x = x;
  BATON_ASSIGN_OR_RETURN(Tensor z, NewTensor(name_, WithLastDim(x.shape(), out_ld_), device_));
  ProductLd(be_, false, true, rows, out_, in_, x, in_, w, in_, 0.0f, z.f32(), out_ld_);
  const float* b = options_.bias ? bias_.value.f32() : nullptr;
  // In bf16 the output is rounded in the bias's (or GELU's) pass where there is one.
  const bool round = options_.round_output && mb.bf16();
  if (options_.gelu) {
    BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(name_, z.shape(), device_));
    be_->BiasGelu(rows, out_, z.f32(), b, z.f32(), out.f32(), round);
    saved.pre = z;
    *y = std::move(out);
  } else if (b != nullptr) {
    be_->AddBias(rows, out_, b, z.f32(), round);
    *y = std::move(z);
  } else {
    if (round) RoundIfBf16(mb, be_, &z);
    *y = std::move(z);
  }
  return stash_.Put(mb.index, std::move(saved));
}

absl::Status Linear::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  BATON_RETURN_IF_ERROR(CheckActivation(name_ + " (gradient)", dy, out_ld_));
  if (dy.numel() != s->x.numel() / in_ * out_ld_) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": gradient ", dy.DebugString(),
                                                   " does not match input ",
                                                   s->x.DebugString()));
  }
  const int64_t rows = dy.numel() / out_ld_;
  // dz = dL/d(x W^T + b): in bf16 rounded to bf16 bits, the operand of both gradients' products
  // and what is kept for the weight gradient (a later action in split-backward schedules).
  if (options_.gelu) {
    BATON_ASSIGN_OR_RETURN(Tensor dz, NewTensor(name_, dy.shape(), device_));
    be_->GeluBackward(dy.numel(), s->pre.f32(), dy.f32(), dz.f32());
    s->pre = Tensor();
    BATON_ASSIGN_OR_RETURN(s->dz, PackIfBf16(name_, mb, be_, dz));
  } else {
    BATON_ASSIGN_OR_RETURN(s->dz, PackIfBf16(name_, mb, be_, dy));
  }
  if (options_.compute_input_grad) {
    BATON_ASSIGN_OR_RETURN(const Tensor w, WeightOperand(mb));
    BATON_ASSIGN_OR_RETURN(Tensor g, NewTensor(name_, s->x.shape(), device_));
    ProductLd(be_, false, false, rows, in_, out_, s->dz, out_ld_, w, in_, 0.0f, g.f32(), in_);
    RoundIfBf16(mb, be_, &g);
    *dx = std::move(g);
  } else {
    *dx = Tensor();
  }
  return absl::OkStatus();
}

absl::Status Linear::BackwardWeight(const MicroBatch& mb) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "weight gradient"));
  if (!s->dz.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": weight gradient for micro-batch ", mb.index, " before its input gradient"));
  }
  const int64_t rows = s->dz.numel() / out_ld_;
  // dW[out, in] += dz^T x, float32 (in bf16 a product of the kept bf16 bits); db += column
  // sums of dz (float32, the bits widened as they are added).
  ProductLd(be_, true, false, out_, in_, rows, s->dz, out_ld_, s->x, in_, 1.0f, weight_.grad.f32(),
            in_);
  if (options_.bias && s->dz.dtype() == DType::kBFloat16) {
    be_->BiasGradBf16(rows, out_, s->dz.bf16(), bias_.grad.f32());
  } else if (options_.bias) {
    be_->BiasGrad(rows, out_, s->dz.f32(), bias_.grad.f32());
  }
  stash_.Erase(mb.index);
  return absl::OkStatus();
}

void Linear::CollectParameters(std::vector<Parameter*>* out) {
  out->push_back(&weight_);
  if (options_.bias) out->push_back(&bias_);
}

// ---------------------------------------------------------------------------- Gelu

Gelu::Gelu(std::string name, Device device)
    : name_(std::move(name)), device_(device), be_(BackendOrDie(device)), stash_(name_) {}

absl::Status Gelu::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  if (!x.defined() || x.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": expected a f32 tensor, got ",
                                                   x.DebugString()));
  }
  BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(name_, x.shape(), device_));
  BATON_ASSIGN_OR_RETURN(Tensor pre, NewTensor(name_, x.shape(), device_));
  be_->BiasGelu(1, x.numel(), x.f32(), nullptr, pre.f32(), out.f32(), mb.bf16());
  *y = std::move(out);
  return stash_.Put(mb.index, std::move(pre));
}

absl::Status Gelu::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Tensor * pre, stash_.Get(mb.index, "backward"));
  if (!dy.defined() || dy.shape() != pre->shape()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": gradient ", dy.DebugString(),
                                                   " does not match ", pre->DebugString()));
  }
  BATON_ASSIGN_OR_RETURN(Tensor g, NewTensor(name_, dy.shape(), device_));
  be_->GeluBackward(dy.numel(), pre->f32(), dy.f32(), g.f32());
  RoundIfBf16(mb, be_, &g);
  *dx = std::move(g);
  stash_.Erase(mb.index);  // no weights: nothing left for BackwardWeight
  return absl::OkStatus();
}

absl::Status Gelu::BackwardWeight(const MicroBatch& mb) { return absl::OkStatus(); }

// ---------------------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(std::string name, int64_t channels, float eps, Device device)
    : name_(std::move(name)),
      channels_(channels),
      eps_(eps),
      device_(device),
      be_(BackendOrDie(device)),
      gamma_(MakeParameter(name_ + ".weight", {channels}, Init::kOnes, 0.0f, 0, device)),
      beta_(MakeParameter(name_ + ".bias", {channels}, Init::kZeros, 0.0f, 0, device)),
      stash_(name_) {}

absl::Status LayerNorm::Allocate(const Shape& shape, Saved* s, Tensor* out) {
  const int64_t rows = NumElements(shape) / channels_;
  BATON_ASSIGN_OR_RETURN(s->mean, NewTensor(name_, {rows}, device_));
  BATON_ASSIGN_OR_RETURN(s->rstd, NewTensor(name_, {rows}, device_));
  BATON_ASSIGN_OR_RETURN(*out, NewTensor(name_, shape, device_));
  return absl::OkStatus();
}

absl::Status LayerNorm::Keep(const MicroBatch& mb, const Tensor& x, Saved s, Tensor out,
                             Tensor* y) {
  RoundIfBf16(mb, be_, &out);
  // In bf16 the input is a rounded activation (a block's output or residual sum, the
  // embedding's output, or what a stage received): kept as its bf16 bits.
  BATON_ASSIGN_OR_RETURN(s.x, PackIfBf16(name_, mb, be_, x));
  *y = std::move(out);
  return stash_.Put(mb.index, std::move(s));
}

absl::Status LayerNorm::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  const int64_t rows = x.numel() / channels_;
  Saved s;
  Tensor out;
  BATON_RETURN_IF_ERROR(Allocate(x.shape(), &s, &out));
  be_->LayerNormForward(rows, channels_, eps_, x.f32(), gamma_.value.f32(), beta_.value.f32(),
                        out.f32(), s.mean.f32(), s.rstd.f32());
  return Keep(mb, x, std::move(s), std::move(out), y);
}

absl::Status LayerNorm::ForwardResidual(const MicroBatch& mb, const Tensor& a, const Tensor& b,
                                        Tensor* sum, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, a, channels_));
  BATON_RETURN_IF_ERROR(CheckActivation(name_, b, channels_));
  if (a.shape() != b.shape() || a.device() != device_ || b.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": the terms of a residual sum must have one shape and be on ",
        DeviceName(device_), ", got ", a.DebugString(), " and ", b.DebugString()));
  }
  const int64_t rows = a.numel() / channels_;
  Saved s;
  Tensor out;
  BATON_RETURN_IF_ERROR(Allocate(a.shape(), &s, &out));
  BATON_ASSIGN_OR_RETURN(Tensor x, NewTensor(name_, a.shape(), device_));
  be_->AddLayerNormForward(rows, channels_, eps_, a.f32(), b.f32(), mb.bf16(), gamma_.value.f32(),
                           beta_.value.f32(), x.f32(), out.f32(), s.mean.f32(), s.rstd.f32());
  *sum = x;
  return Keep(mb, x, std::move(s), std::move(out), y);
}

absl::Status LayerNorm::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  if (!dy.defined() || dy.shape() != s->x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": gradient ", dy.DebugString(),
                                                   " does not match ", s->x.DebugString()));
  }
  const int64_t rows = dy.numel() / channels_;
  BATON_ASSIGN_OR_RETURN(const Tensor x, Unpacked(name_, be_, s->x));
  BATON_ASSIGN_OR_RETURN(Tensor g, NewTensor(name_, dy.shape(), device_));
  be_->LayerNormBackwardInput(rows, channels_, x.f32(), s->mean.f32(), s->rstd.f32(),
                              gamma_.value.f32(), dy.f32(), g.f32());
  RoundIfBf16(mb, be_, &g);
  // Kept for the weight gradient; in bf16 a rounded gradient (a Linear's input gradient),
  // kept as its bits.
  BATON_ASSIGN_OR_RETURN(s->dy, PackIfBf16(name_, mb, be_, dy));
  *dx = std::move(g);
  return absl::OkStatus();
}

absl::Status LayerNorm::BackwardWeight(const MicroBatch& mb) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "weight gradient"));
  if (!s->dy.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": weight gradient for micro-batch ", mb.index, " before its input gradient"));
  }
  const int64_t rows = s->dy.numel() / channels_;
  BATON_ASSIGN_OR_RETURN(const Tensor x, Unpacked(name_, be_, s->x));
  BATON_ASSIGN_OR_RETURN(const Tensor dy, Unpacked(name_, be_, s->dy));
  be_->LayerNormBackwardWeight(rows, channels_, x.f32(), s->mean.f32(), s->rstd.f32(), dy.f32(),
                               gamma_.grad.f32(), beta_.grad.f32());
  stash_.Erase(mb.index);
  return absl::OkStatus();
}

void LayerNorm::CollectParameters(std::vector<Parameter*>* out) {
  out->push_back(&gamma_);
  out->push_back(&beta_);
}

// ---------------------------------------------------------------------------- Embedding

Embedding::Embedding(std::string name, int64_t vocab, int64_t context, int64_t channels,
                     uint64_t seed, Device device, bool positions)
    : name_(std::move(name)),
      vocab_(vocab),
      context_(context),
      channels_(channels),
      device_(device),
      be_(BackendOrDie(device)),
      positions_(positions),
      wte_(MakeParameter(name_ + ".token", {vocab, channels}, Init::kNormal, 0.02f, seed, device)),
      stash_(name_) {
  if (positions_) {
    wpe_ = MakeParameter(name_ + ".position", {context, channels}, Init::kNormal, 0.01f, seed,
                         device);
  }
}

absl::Status Embedding::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  if (!x.defined() || x.dtype() != DType::kInt32 || x.rank() != 2 || x.dim(1) > context_ ||
      x.dim(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": expected int32 token ids [batch, T] with 1 <= T <= ", context_,
                     ", got ", x.DebugString()));
  }
  BATON_RETURN_IF_ERROR(CheckTokenIds(name_, "token id", x, vocab_));
  BATON_ASSIGN_OR_RETURN(const Tensor tokens, x.On(device_));
  const int64_t B = x.dim(0), T = x.dim(1);
  BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(name_, {B, T, channels_}, device_));
  be_->EmbeddingForward(B, T, channels_, tokens.i32(), wte_.value.f32(),
                        positions_ ? wpe_.value.f32() : nullptr, out.f32());
  RoundIfBf16(mb, be_, &out);
  *y = std::move(out);
  return stash_.Put(mb.index, Saved{tokens, Tensor()});
}

absl::Status Embedding::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  const Shape want = {s->tokens.dim(0), s->tokens.dim(1), channels_};
  if (!dy.defined() || dy.shape() != want) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": gradient ", dy.DebugString(),
                                                   " does not match ", ShapeString(want)));
  }
  s->dy = dy;
  *dx = Tensor();
  return absl::OkStatus();
}

absl::Status Embedding::BackwardWeight(const MicroBatch& mb) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "weight gradient"));
  if (!s->dy.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": weight gradient for micro-batch ", mb.index, " before its input gradient"));
  }
  be_->EmbeddingBackward(s->tokens.dim(0), s->tokens.dim(1), channels_, s->tokens.i32(),
                         s->dy.f32(), wte_.grad.f32(),
                         positions_ ? wpe_.grad.f32() : nullptr);
  stash_.Erase(mb.index);
  return absl::OkStatus();
}

void Embedding::CollectParameters(std::vector<Parameter*>* out) {
  out->push_back(&wte_);
  if (positions_) out->push_back(&wpe_);
}

}  // namespace baton
