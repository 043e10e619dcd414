#include "common/nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/core/status.h"

namespace baton {

absl::StatusOr<float> LossScale(const std::string& who, const Tensor& dy) {
  if (!dy.defined() || dy.dtype() != DType::kFloat32 || dy.numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": the gradient of a loss is its 1-element scale, got ", dy.DebugString()));
  }
  float scale = 0.0f;
  BATON_RETURN_IF_ERROR(dy.CopyToHost(&scale));
  return scale;
}

namespace {
Linear::Options LinearOpts(bool bias, bool gelu, float stddev) {
  Linear::Options o;
  o.bias = bias;
  o.gelu = gelu;
  o.init_stddev = stddev;
  return o;
}
}  // namespace

// ---------------------------------------------------------------- CausalSelfAttention

CausalSelfAttention::CausalSelfAttention(std::string name, int64_t channels, int64_t heads,
                                         float proj_stddev, uint64_t seed, Device device)
    : name_(std::move(name)),
      channels_(channels),
      heads_(heads),
      device_(device),
      be_(BackendOrDie(device)),
      qkv_(name_ + ".qkv", channels, 3 * channels, LinearOpts(true, false, 0.02f), seed, device),
      proj_(name_ + ".proj", channels, channels, LinearOpts(true, false, proj_stddev), seed,
            device),
      stash_(name_) {}

absl::Status CausalSelfAttention::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  absl::Status s = ForwardSteps(mb, x, y);
  if (!s.ok()) Discard(mb.index);
  return s;
}

void CausalSelfAttention::Discard(int mb) {
  stash_.Erase(mb);
  qkv_.Discard(mb);
  proj_.Discard(mb);
}

absl::Status CausalSelfAttention::ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  if (x.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": expected [batch, T, C], got ", x.DebugString()));
  }
  const int64_t B = x.dim(0), T = x.dim(1), H = heads_, D = channels_ / heads_;
  Saved s;
  BATON_RETURN_IF_ERROR(qkv_.Forward(mb, x, &s.qkv));
  Tensor mixed;
  BATON_RETURN_IF_ERROR(AttentionCoreForward(name_, be_, device_, {B, T, H, H, D}, mb.bf16(), s.qkv,
                                             &s.core, &mixed));
  BATON_RETURN_IF_ERROR(proj_.Forward(mb, mixed, y));
  // In bf16 q, k and v are the qkv Linear's rounded output: kept as their bf16 bits.
  BATON_ASSIGN_OR_RETURN(s.qkv, PackIfBf16(name_, mb, be_, s.qkv));
  return stash_.Put(mb.index, std::move(s));
}

absl::Status CausalSelfAttention::BackwardInput(const MicroBatch& mb, const Tensor& dy,
                                                Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  Tensor dmixed;
  BATON_RETURN_IF_ERROR(proj_.BackwardInput(mb, dy, &dmixed));
  const int64_t B = s->qkv.dim(0), T = s->qkv.dim(1), H = heads_, D = channels_ / heads_;
  BATON_ASSIGN_OR_RETURN(const Tensor qkv, Unpacked(name_, be_, s->qkv));
  Tensor dqkv;
  BATON_RETURN_IF_ERROR(AttentionCoreBackward(name_, be_, device_, {B, T, H, H, D}, qkv,
                                              s->core, dmixed, &dqkv));
  stash_.Erase(mb.index);
  return qkv_.BackwardInput(mb, dqkv, dx);
}

absl::Status CausalSelfAttention::BackwardWeight(const MicroBatch& mb) {
  BATON_RETURN_IF_ERROR(proj_.BackwardWeight(mb));
  return qkv_.BackwardWeight(mb);
}

void CausalSelfAttention::CollectParameters(std::vector<Parameter*>* out) {
  qkv_.CollectParameters(out);
  proj_.CollectParameters(out);
}

int CausalSelfAttention::InFlight() const {
  return std::max({stash_.size(), qkv_.InFlight(), proj_.InFlight()});
}

// ---------------------------------------------------------------- TransformerBlock

TransformerBlock::TransformerBlock(std::string name, int64_t channels, int64_t heads,
                                   int64_t num_layers, uint64_t seed, Device device)
    : name_(std::move(name)),
      channels_(channels),
      device_(device),
      be_(BackendOrDie(device)),
      ln1_(name_ + ".ln1", channels, 1e-5f, device),
      attn_(name_ + ".attn", channels, heads,
            0.02f / std::sqrt(2.0f * static_cast<float>(num_layers)), seed, device),
      ln2_(name_ + ".ln2", channels, 1e-5f, device),
      fc_(name_ + ".mlp.fc", channels, 4 * channels, LinearOpts(true, true, 0.02f), seed, device),
      proj_(name_ + ".mlp.proj", 4 * channels, channels,
            LinearOpts(true, false, 0.02f / std::sqrt(2.0f * static_cast<float>(num_layers))), seed,
            device) {}

absl::Status TransformerBlock::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  absl::Status s = ForwardSteps(mb, x, y);
  if (!s.ok()) Discard(mb.index);
  return s;
}

void TransformerBlock::Discard(int mb) {
  for (Module* m : std::initializer_list<Module*>{&ln1_, &attn_, &ln2_, &fc_, &proj_}) {
    m->Discard(mb);
  }
}

absl::Status TransformerBlock::ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  Tensor h, a;
  BATON_RETURN_IF_ERROR(ln1_.Forward(mb, x, &h));
  BATON_RETURN_IF_ERROR(attn_.Forward(mb, h, &a));
  // x1 = x + a (rounded in bf16) and ln2(x1), in one backend call.
  Tensor x1, h2, f, m;
  BATON_RETURN_IF_ERROR(ln2_.ForwardResidual(mb, x, a, &x1, &h2));
  BATON_RETURN_IF_ERROR(fc_.Forward(mb, h2, &f));
  BATON_RETURN_IF_ERROR(proj_.Forward(mb, f, &m));
  be_->Add(x.numel(), x1.f32(), m.f32(), m.f32());  // m becomes the block output
  RoundIfBf16(mb, be_, &m);
  *y = std::move(m);
  return absl::OkStatus();
}

absl::Status TransformerBlock::BackwardInput(const MicroBatch& mb, const Tensor& dy,
                                             Tensor* dx) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_ + " (gradient)", dy, channels_));
  // MLP branch: dx1 = dy + ln2'(fc'(proj'(dy))).
  Tensor df, dh2, dx1;
  BATON_RETURN_IF_ERROR(proj_.BackwardInput(mb, dy, &df));
  BATON_RETURN_IF_ERROR(fc_.BackwardInput(mb, df, &dh2));
  BATON_RETURN_IF_ERROR(ln2_.BackwardInput(mb, dh2, &dx1));
  be_->Add(dy.numel(), dy.f32(), dx1.f32(), dx1.f32());
  RoundIfBf16(mb, be_, &dx1);
  // Attention branch: dx = dx1 + ln1'(attn'(dx1)).
  Tensor dh, dxa;
  BATON_RETURN_IF_ERROR(attn_.BackwardInput(mb, dx1, &dh));
  BATON_RETURN_IF_ERROR(ln1_.BackwardInput(mb, dh, &dxa));
  be_->Add(dy.numel(), dx1.f32(), dxa.f32(), dxa.f32());
  RoundIfBf16(mb, be_, &dxa);
  *dx = std::move(dxa);
  return absl::OkStatus();
}

absl::Status TransformerBlock::BackwardWeight(const MicroBatch& mb) {
  BATON_RETURN_IF_ERROR(proj_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(fc_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(ln2_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(attn_.BackwardWeight(mb));
  return ln1_.BackwardWeight(mb);
}

void TransformerBlock::CollectParameters(std::vector<Parameter*>* out) {
  ln1_.CollectParameters(out);
  attn_.CollectParameters(out);
  ln2_.CollectParameters(out);
  fc_.CollectParameters(out);
  proj_.CollectParameters(out);
}

int TransformerBlock::InFlight() const {
  return std::max({ln1_.InFlight(), attn_.InFlight(), ln2_.InFlight(), fc_.InFlight(),
                   proj_.InFlight()});
}

// ---------------------------------------------------------------- LmHead

namespace {
// The logits stay float32 in bf16: their softmax and the loss are float32. Their rows are
// padded to a multiple of kLogitsAlign (LmHead's contract).
Linear::Options FloatLogits(Linear::Options o) {
  o.round_output = false;
  o.out_align = LmHead::kLogitsAlign;
  return o;
}
}  // namespace

LmHead::LmHead(std::string name, int64_t channels, int64_t vocab, std::unique_ptr<Module> norm,
               const Linear::Options& logits, uint64_t seed, Device device)
    : name_(std::move(name)),
      channels_(channels),
      vocab_(vocab),
      device_(device),
      be_(BackendOrDie(device)),
      norm_(std::move(norm)),
      logits_(name_ + ".logits", channels, vocab, FloatLogits(logits), seed, device),
      stash_(name_) {}

absl::StatusOr<Tensor> LmHead::Logits(const Tensor& x, Precision precision) {
  // Runs the norm and the projection under a micro-batch index no training step uses, and
  // drops their stash at once.
  constexpr int kEval = -1;
  const MicroBatch mb{kEval, nullptr, precision};
  Tensor h, logits;
  absl::Status s = norm_->Forward(mb, x, &h);
  if (s.ok()) s = logits_.Forward(mb, h, &logits);
  norm_->Discard(kEval);
  logits_.Discard(kEval);
  BATON_RETURN_IF_ERROR(s);
  // The callers get the vocabulary's columns alone.
  const int64_t rows = logits.numel() / logits_.out_ld();
  Shape shape = logits.shape();
  shape.back() = vocab_;
  BATON_ASSIGN_OR_RETURN(Tensor packed, NewTensor(name_, shape, device_));
  be_->CopyRows(rows, vocab_, logits.f32(), logits_.out_ld(), packed.f32(), vocab_);
  return packed;
}

absl::Status LmHead::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  absl::Status s = ForwardSteps(mb, x, y);
  if (!s.ok()) Discard(mb.index);
  return s;
}

void LmHead::Discard(int mb) {
  stash_.Erase(mb);
  norm_->Discard(mb);
  logits_.Discard(mb);
}

absl::Status LmHead::ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  const int64_t rows = x.numel() / channels_;
  const Tensor* t = mb.targets;
  if (t == nullptr || !t->defined() || t->dtype() != DType::kInt32 || t->numel() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": needs int32 targets with ", rows, " elements, got ",
                     t == nullptr ? std::string("none") : t->DebugString()));
  }
  BATON_RETURN_IF_ERROR(CheckTokenIds(name_, "target id", *t, vocab_));
  Tensor h, logits;
  BATON_RETURN_IF_ERROR(norm_->Forward(mb, x, &h));
  BATON_RETURN_IF_ERROR(logits_.Forward(mb, h, &logits));
  Saved s;
  BATON_ASSIGN_OR_RETURN(s.targets, t->On(device_));
  BATON_ASSIGN_OR_RETURN(s.stats, NewTensor(name_, {rows, 2}, device_));
  BATON_ASSIGN_OR_RETURN(Tensor losses, NewTensor(name_, {rows}, device_));
  be_->SoftmaxCrossEntropyForward(rows, vocab_, logits_.out_ld(), logits.f32(), s.targets.i32(),
                                  s.stats.f32(), losses.f32());
  s.logits = std::move(logits);
  // The mean loss stays on the device: the caller reads it at the step's end (LossValue).
  BATON_ASSIGN_OR_RETURN(Tensor mean, NewTensor(name_, {1}, device_));
  be_->MeanInto(rows, losses.f32(), mean.f32());
  *y = std::move(mean);
  return stash_.Put(mb.index, std::move(s));
}

absl::Status LmHead::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(const float scale, LossScale(name_, dy));
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  const int64_t ld = logits_.out_ld(), rows = s->logits.numel() / ld;
  // The loss is the mean over rows: each row's logits gradient carries scale / rows.
  Tensor dlogits = s->logits;  // computed in place: the logits are not needed again
  be_->SoftmaxCrossEntropyBackward(rows, vocab_, ld, s->logits.f32(), s->stats.f32(),
                                   s->targets.i32(), scale / static_cast<float>(rows),
                                   dlogits.f32());
  stash_.Erase(mb.index);
  Tensor dh;  // shaped like the LayerNorm's output, [B, T, C]
  BATON_RETURN_IF_ERROR(logits_.BackwardInput(mb, dlogits, &dh));
  return norm_->BackwardInput(mb, dh, dx);
}

absl::Status LmHead::BackwardWeight(const MicroBatch& mb) {
  BATON_RETURN_IF_ERROR(logits_.BackwardWeight(mb));
  return norm_->BackwardWeight(mb);
}

void LmHead::CollectParameters(std::vector<Parameter*>* out) {
  norm_->CollectParameters(out);
  logits_.CollectParameters(out);
}

int LmHead::InFlight() const {
  return std::max({stash_.size(), norm_->InFlight(), logits_.InFlight()});
}

std::unique_ptr<LmHead> GptHead(std::string name, int64_t channels, int64_t vocab, bool tied,
                                uint64_t seed, Device device) {
  Linear::Options o = LinearOpts(false, false, 0.02f);
  if (tied) o.init_name = "embed.token";
  auto norm = std::make_unique<LayerNorm>(name + ".ln", channels, 1e-5f, device);
  return std::make_unique<LmHead>(std::move(name), channels, vocab, std::move(norm), o, seed,
                                  device);
}

// ---------------------------------------------------------------- MseLoss

MseLoss::MseLoss(std::string name, Device device)
    : name_(std::move(name)), device_(device), be_(BackendOrDie(device)), stash_(name_) {}

absl::Status MseLoss::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  const Tensor* t = mb.targets;
  if (!x.defined() || x.dtype() != DType::kFloat32 || t == nullptr || !t->defined() ||
      t->dtype() != DType::kFloat32 || t->shape() != x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": needs f32 predictions and targets of the same shape, got ", x.DebugString(),
        " and ", t == nullptr ? std::string("none") : t->DebugString()));
  }
  if (x.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": the mean squared error of no elements is undefined, got ", x.DebugString()));
  }
  BATON_ASSIGN_OR_RETURN(const Tensor target, t->On(device_));
  BATON_ASSIGN_OR_RETURN(Tensor diff, NewTensor(name_, x.shape(), device_));
  // The mean stays where it is computed (read with LossValue once the step is issued).
  BATON_ASSIGN_OR_RETURN(Tensor mean, NewTensor(name_, {1}, device_));
  be_->SquaredErrorMeanInto(x.numel(), x.f32(), target.f32(), diff.f32(), mean.f32());
  *y = std::move(mean);
  return stash_.Put(mb.index, std::move(diff));
}

absl::Status MseLoss::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(const float scale, LossScale(name_, dy));
  BATON_ASSIGN_OR_RETURN(Tensor * diff, stash_.Get(mb.index, "backward"));
  // d/dpred mean((pred - target)^2) = 2 (pred - target) / n.
  Tensor g = *diff;
  be_->Scale(g.numel(), 2.0f * scale / static_cast<float>(g.numel()), g.f32(), g.f32());
  RoundIfBf16(mb, be_, &g);
  stash_.Erase(mb.index);
  *dx = std::move(g);
  return absl::OkStatus();
}

}  // namespace baton
