#include "common/nn/llama.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "common/core/status.h"

namespace baton {

namespace {
Linear::Options NoBias(float stddev) {
  Linear::Options o;
  o.bias = false;
  o.init_stddev = stddev;
  return o;
}
}  // namespace

// ---------------------------------------------------------------- RmsNorm

RmsNorm::RmsNorm(std::string name, int64_t channels, float eps, Device device)
    : name_(std::move(name)),
      channels_(channels),
      eps_(eps),
      device_(device),
      be_(BackendOrDie(device)),
      gamma_(MakeParameter(name_ + ".weight", {channels}, Init::kOnes, 0.0f, 0, device)),
      stash_(name_) {}

absl::Status RmsNorm::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  const int64_t rows = x.numel() / channels_;
  Saved s;
  BATON_ASSIGN_OR_RETURN(s.rstd, NewTensor(name_, {rows}, device_));
  BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(name_, x.shape(), device_));
  be_->RmsNormForward(rows, channels_, eps_, x.f32(), gamma_.value.f32(), out.f32(), s.rstd.f32());
  RoundIfBf16(mb, be_, &out);
  // In bf16 the input is a rounded activation: kept as its bf16 bits (as LayerNorm's).
  BATON_ASSIGN_OR_RETURN(s.x, PackIfBf16(name_, mb, be_, x));
  *y = std::move(out);
  return stash_.Put(mb.index, std::move(s));
}

absl::Status RmsNorm::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  if (!dy.defined() || dy.dtype() != DType::kFloat32 || dy.shape() != s->x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": gradient ", dy.DebugString(),
                                                   " does not match ", s->x.DebugString()));
  }
  const int64_t rows = dy.numel() / channels_;
  BATON_ASSIGN_OR_RETURN(const Tensor x, Unpacked(name_, be_, s->x));
  BATON_ASSIGN_OR_RETURN(Tensor g, NewTensor(name_, dy.shape(), device_));
  be_->RmsNormBackwardInput(rows, channels_, x.f32(), s->rstd.f32(), gamma_.value.f32(),
                            dy.f32(), g.f32());
  RoundIfBf16(mb, be_, &g);
  BATON_ASSIGN_OR_RETURN(s->dy, PackIfBf16(name_, mb, be_, dy));  // rounded, as x
  *dx = std::move(g);
  return absl::OkStatus();
}

absl::Status RmsNorm::BackwardWeight(const MicroBatch& mb) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "weight gradient"));
  if (!s->dy.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": weight gradient for micro-batch ",
                                                      mb.index, " before its input gradient"));
  }
  const int64_t rows = s->dy.numel() / channels_;
  BATON_ASSIGN_OR_RETURN(const Tensor x, Unpacked(name_, be_, s->x));
  BATON_ASSIGN_OR_RETURN(const Tensor dy, Unpacked(name_, be_, s->dy));
  be_->RmsNormBackwardWeight(rows, channels_, x.f32(), s->rstd.f32(), dy.f32(), gamma_.grad.f32());
  stash_.Erase(mb.index);
  return absl::OkStatus();
}

void RmsNorm::CollectParameters(std::vector<Parameter*>* out) { out->push_back(&gamma_); }

// ---------------------------------------------------------------- LlamaAttention

LlamaAttention::LlamaAttention(std::string name, int64_t channels, int64_t heads, int64_t kv_heads,
                               float rope_theta, float proj_stddev, uint64_t seed, Device device)
    : name_(std::move(name)),
      channels_(channels),
      heads_(heads),
      kv_heads_(kv_heads),
      rope_theta_(rope_theta),
      device_(device),
      be_(BackendOrDie(device)),
      // [(H + 2 KVH) D, C]: the rows of q_proj, then k_proj, then v_proj.
      qkv_(name_ + ".qkv", channels, heads > 0 ? (heads + 2 * kv_heads) * (channels / heads) : 0,
           NoBias(0.02f), seed, device),
      proj_(name_ + ".proj", channels, channels, NoBias(proj_stddev), seed, device),
      stash_(name_) {}

absl::Status LlamaAttention::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  absl::Status s = ForwardSteps(mb, x, y);
  if (!s.ok()) Discard(mb.index);
  return s;
}

void LlamaAttention::Discard(int mb) {
  stash_.Erase(mb);
  qkv_.Discard(mb);
  proj_.Discard(mb);
}

absl::Status LlamaAttention::ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  if (heads_ <= 0 || kv_heads_ <= 0 || channels_ % heads_ != 0 || heads_ % kv_heads_ != 0 ||
      (channels_ / heads_) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": ", channels_, " channels, ", heads_, " heads and ", kv_heads_,
                     " kv heads: need heads | channels, kv heads | heads and an even head size"));
  }
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  if (x.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": expected [batch, T, C], got ", x.DebugString()));
  }
  const int64_t B = x.dim(0), T = x.dim(1), H = heads_, KVH = kv_heads_, D = channels_ / H;
  const int64_t W = (H + 2 * KVH) * D;
  Saved s;
  BATON_RETURN_IF_ERROR(qkv_.Forward(mb, x, &s.qkv));
  // Rotary embedding of q (columns 0 .. H*D-1) and k (H*D .. (H+KVH)*D-1), in place: the
  // Linear keeps its input, not this output.
  be_->RotaryForward(B, T, H, D, W, rope_theta_, s.qkv.f32());
  be_->RotaryForward(B, T, KVH, D, W, rope_theta_, s.qkv.f32() + H * D);
  RoundIfBf16(mb, be_, &s.qkv);  // the rotated q and k are bf16 too (v already is)
  Tensor mixed;
  BATON_RETURN_IF_ERROR(AttentionCoreForward(name_, be_, device_, {B, T, H, KVH, D}, mb.bf16(),
                                             s.qkv, &s.core, &mixed));
  BATON_RETURN_IF_ERROR(proj_.Forward(mb, mixed, y));
  BATON_ASSIGN_OR_RETURN(s.qkv, PackIfBf16(name_, mb, be_, s.qkv));  // bf16 values: bits
  return stash_.Put(mb.index, std::move(s));
}

absl::Status LlamaAttention::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Saved * s, stash_.Get(mb.index, "backward"));
  Tensor dmixed;
  BATON_RETURN_IF_ERROR(proj_.BackwardInput(mb, dy, &dmixed));
  const int64_t B = s->qkv.dim(0), T = s->qkv.dim(1), H = heads_, KVH = kv_heads_,
                D = channels_ / H, W = (H + 2 * KVH) * D;
  BATON_ASSIGN_OR_RETURN(const Tensor qkv, Unpacked(name_, be_, s->qkv));
  Tensor dqkv;
  BATON_RETURN_IF_ERROR(AttentionCoreBackward(name_, be_, device_, {B, T, H, KVH, D}, qkv,
                                              s->core, dmixed, &dqkv));
  // Back through the rotations: the gradients of the unrotated q and k.
  be_->RotaryBackward(B, T, H, D, W, rope_theta_, dqkv.f32());
  be_->RotaryBackward(B, T, KVH, D, W, rope_theta_, dqkv.f32() + H * D);
  stash_.Erase(mb.index);
  return qkv_.BackwardInput(mb, dqkv, dx);
}

absl::Status LlamaAttention::BackwardWeight(const MicroBatch& mb) {
  BATON_RETURN_IF_ERROR(proj_.BackwardWeight(mb));
  return qkv_.BackwardWeight(mb);
}

void LlamaAttention::CollectParameters(std::vector<Parameter*>* out) {
  qkv_.CollectParameters(out);
  proj_.CollectParameters(out);
}

int LlamaAttention::InFlight() const {
  return std::max({stash_.size(), qkv_.InFlight(), proj_.InFlight()});
}

// ---------------------------------------------------------------- SwiGlu

SwiGlu::SwiGlu(std::string name, int64_t intermediate, Device device)
    : name_(std::move(name)),
      intermediate_(intermediate),
      device_(device),
      be_(BackendOrDie(device)),
      stash_(name_) {}

absl::Status SwiGlu::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, 2 * intermediate_));
  const int64_t rows = x.numel() / (2 * intermediate_);
  Shape shape = x.shape();
  shape.back() = intermediate_;
  BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(name_, shape, device_));
  be_->SwiGluForward(rows, intermediate_, x.f32(), out.f32());
  RoundIfBf16(mb, be_, &out);
  *y = std::move(out);
  // In bf16 the input is gate_up's rounded output: kept as its bf16 bits.
  BATON_ASSIGN_OR_RETURN(Tensor kept, PackIfBf16(name_, mb, be_, x));
  return stash_.Put(mb.index, std::move(kept));
}

absl::Status SwiGlu::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_ASSIGN_OR_RETURN(Tensor * x, stash_.Get(mb.index, "backward"));
  const int64_t rows = x->numel() / (2 * intermediate_);
  if (!dy.defined() || dy.dtype() != DType::kFloat32 || dy.rank() < 1 ||
      dy.dim(-1) != intermediate_ || dy.numel() != rows * intermediate_) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": gradient ", dy.DebugString(),
                                                   " does not match input ", x->DebugString()));
  }
  BATON_ASSIGN_OR_RETURN(const Tensor input, Unpacked(name_, be_, *x));
  BATON_ASSIGN_OR_RETURN(Tensor g, NewTensor(name_, x->shape(), device_));
  be_->SwiGluBackward(rows, intermediate_, input.f32(), dy.f32(), g.f32());
  RoundIfBf16(mb, be_, &g);
  *dx = std::move(g);
  stash_.Erase(mb.index);  // no weights: nothing left for BackwardWeight
  return absl::OkStatus();
}

// ---------------------------------------------------------------- LlamaBlock

namespace {
float ScaledStddev(int64_t num_layers) {
  return 0.02f / std::sqrt(2.0f * static_cast<float>(num_layers));
}
}  // namespace

LlamaBlock::LlamaBlock(std::string name, int64_t channels, int64_t heads, int64_t kv_heads,
                       int64_t intermediate, float rope_theta, float eps, int64_t num_layers,
                       uint64_t seed, Device device)
    : name_(std::move(name)),
      channels_(channels),
      device_(device),
      be_(BackendOrDie(device)),
      attn_norm_(name_ + ".attn_norm", channels, eps, device),
      attn_(name_ + ".attn", channels, heads, kv_heads, rope_theta, ScaledStddev(num_layers), seed,
            device),
      mlp_norm_(name_ + ".mlp_norm", channels, eps, device),
      gate_up_(name_ + ".mlp.gate_up", channels, 2 * intermediate, NoBias(0.02f), seed, device),
      act_(name_ + ".mlp.act", intermediate, device),
      down_(name_ + ".mlp.down", intermediate, channels, NoBias(ScaledStddev(num_layers)), seed,
            device) {}

absl::Status LlamaBlock::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  absl::Status s = ForwardSteps(mb, x, y);
  if (!s.ok()) Discard(mb.index);
  return s;
}

void LlamaBlock::Discard(int mb) {
  for (Module* m :
       std::initializer_list<Module*>{&attn_norm_, &attn_, &mlp_norm_, &gate_up_, &act_, &down_}) {
    m->Discard(mb);
  }
}

absl::Status LlamaBlock::ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_, x, channels_));
  Tensor n1, a;
  BATON_RETURN_IF_ERROR(attn_norm_.Forward(mb, x, &n1));
  BATON_RETURN_IF_ERROR(attn_.Forward(mb, n1, &a));
  BATON_ASSIGN_OR_RETURN(Tensor h, NewTensor(name_, x.shape(), device_));
  be_->Add(x.numel(), x.f32(), a.f32(), h.f32());
  RoundIfBf16(mb, be_, &h);
  Tensor n2, gu, act, m;
  BATON_RETURN_IF_ERROR(mlp_norm_.Forward(mb, h, &n2));
  BATON_RETURN_IF_ERROR(gate_up_.Forward(mb, n2, &gu));
  BATON_RETURN_IF_ERROR(act_.Forward(mb, gu, &act));
  BATON_RETURN_IF_ERROR(down_.Forward(mb, act, &m));
  be_->Add(x.numel(), h.f32(), m.f32(), m.f32());  // m becomes the block output
  RoundIfBf16(mb, be_, &m);
  *y = std::move(m);
  return absl::OkStatus();
}

absl::Status LlamaBlock::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  BATON_RETURN_IF_ERROR(CheckActivation(name_ + " (gradient)", dy, channels_));
  // MLP branch: dh = dy + mlp_norm'(gate_up'(act'(down'(dy)))).
  Tensor dact, dgu, dn2, dh;
  BATON_RETURN_IF_ERROR(down_.BackwardInput(mb, dy, &dact));
  BATON_RETURN_IF_ERROR(act_.BackwardInput(mb, dact, &dgu));
  BATON_RETURN_IF_ERROR(gate_up_.BackwardInput(mb, dgu, &dn2));
  BATON_RETURN_IF_ERROR(mlp_norm_.BackwardInput(mb, dn2, &dh));
  be_->Add(dy.numel(), dy.f32(), dh.f32(), dh.f32());
  RoundIfBf16(mb, be_, &dh);
  // Attention branch: dx = dh + attn_norm'(attn'(dh)).
  Tensor dn1, dxa;
  BATON_RETURN_IF_ERROR(attn_.BackwardInput(mb, dh, &dn1));
  BATON_RETURN_IF_ERROR(attn_norm_.BackwardInput(mb, dn1, &dxa));
  be_->Add(dy.numel(), dh.f32(), dxa.f32(), dxa.f32());
  RoundIfBf16(mb, be_, &dxa);
  *dx = std::move(dxa);
  return absl::OkStatus();
}

absl::Status LlamaBlock::BackwardWeight(const MicroBatch& mb) {
  BATON_RETURN_IF_ERROR(down_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(act_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(gate_up_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(mlp_norm_.BackwardWeight(mb));
  BATON_RETURN_IF_ERROR(attn_.BackwardWeight(mb));
  return attn_norm_.BackwardWeight(mb);
}

void LlamaBlock::CollectParameters(std::vector<Parameter*>* out) {
  attn_norm_.CollectParameters(out);
  attn_.CollectParameters(out);
  mlp_norm_.CollectParameters(out);
  gate_up_.CollectParameters(out);
  down_.CollectParameters(out);
}

int LlamaBlock::InFlight() const {
  return std::max({attn_norm_.InFlight(), attn_.InFlight(), mlp_norm_.InFlight(),
                   gate_up_.InFlight(), act_.InFlight(), down_.InFlight()});
}

// ---------------------------------------------------------------- costs

LlamaCosts LlamaBlockCosts(int64_t T, int64_t C, int64_t H, int64_t KVH, int64_t I) {
  const int64_t D = C / H;
  const int64_t QKV = (H + 2 * KVH) * D;  // width of the fused q, k, v projection
  LlamaCosts c;
  // Two norms' weights, the qkv and output projections, gate_up and down.
  c.parameters = 2 * C + QKV * C + C * C + 2 * I * C + I * C;
  c.operand_parameters = c.parameters - 2 * C;
  c.largest_parameter = std::max(QKV * C, 2 * I * C);
  // Per sequence: qkv 2TC(H+2KVH)D, scores and mixing 4T^2 HD (the full square), proj
  // 2TC^2, gate_up 4TCI, down 2TCI.
  c.forward_flops = 2 * T * C * QKV + 4 * T * T * H * D + 2 * T * C * C + 6 * T * C * I;
  // A block keeps its input and the attention norm's output (2TC) and inverse RMS (T); the
  // rotated q, k and v (T(H+2KVH)D); the attention probabilities (H T^2); the mixed heads
  // (TC); the residual sum and the MLP norm's output (2TC) and inverse RMS (T); gate_up's
  // output (2TI) and the SwiGLU output (TI).
  c.activation_floats = 5 * T * C + T * QKV + H * T * T + 3 * T * I + 2 * T;
  // In bf16 all but the probabilities and the inverse RMSs are bf16.
  c.activation_bf16 = 5 * T * C + T * QKV + 3 * T * I;
  return c;
}

}  // namespace baton
