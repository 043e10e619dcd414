// The transformer pieces: causal multi-head self-attention, the residual pre-LayerNorm
// block, the LM head with fused softmax cross-entropy, and the MSE loss head.
#ifndef BATON_COMMON_NN_TRANSFORMER_H_
#define BATON_COMMON_NN_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/attention_core.h"
#include "common/nn/layers.h"
#include "common/nn/module.h"

namespace baton {

// Causal multi-head self-attention: qkv = Linear(C, 3C); per head, causal softmax of
// q k^T / sqrt(D) applied to v; proj = Linear(C, C). Input and output [B, T, C].
class CausalSelfAttention final : public Module {
 public:
  // `proj_stddev` initialises the output projection (GPT-2 scales it by 1/sqrt(2 layers)).
  CausalSelfAttention(std::string name, int64_t channels, int64_t heads, float proj_stddev,
                      uint64_t seed, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override;
  void Discard(int mb) override;

 private:
  absl::Status ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y);
  struct Saved {
    Tensor qkv;  // [B, T, 3C] (in bf16: its bf16 bits)
    AttentionStash core;
  };
  const std::string name_;
  const int64_t channels_, heads_;
  const Device device_;
  Backend* const be_;
  Linear qkv_, proj_;
  Stash<Saved> stash_;  // released by BackwardInput (the core has no weights)
};

// x + attn(ln1(x)), then x + mlp(ln2(x)) with mlp = Linear(C, 4C) + GELU + Linear(4C, C).
class TransformerBlock final : public Module {
 public:
  TransformerBlock(std::string name, int64_t channels, int64_t heads, int64_t num_layers,
                   uint64_t seed, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override;
  void Discard(int mb) override;

 private:
  absl::Status ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y);
  const std::string name_;
  const int64_t channels_;
  const Device device_;
  Backend* const be_;
  LayerNorm ln1_;
  CausalSelfAttention attn_;
  LayerNorm ln2_;
  Linear fc_;    // C -> 4C, fused GELU
  Linear proj_;  // 4C -> C
};

// A final norm (GPT-2's LayerNorm "<name>.ln", LLaMA's RMSNorm "<name>.norm": any
// parameterised module that keeps the shape), Linear(C, V) "<name>.logits" without bias,
// and softmax cross-entropy against the micro-batch's int32 targets [B, T] (on any device:
// checked on the host, copied over). Forward writes the mean loss over the B*T positions as
// a 1-element tensor on the module's device, not read back (LossValue reads it, once the
// step's work is issued); BackwardInput takes the 1-element loss scale, on any device. With tied
// embeddings `logits.init_name` is the embedding's name, so the output projection starts as its
// copy (the clock's TIE_GRAD keeps the two equal). The logits' rows are padded to a multiple of
// kLogitsAlign floats (Linear::Options:: out_align): the [R, V] products and the loss read and
// write the vocabulary's columns alone, and the padding keeps a device's GEMMs on aligned rows
// whatever V is (GPT-2's 50,257 becomes 50,304 apart). The parameters, checkpoints and Logits()
// keep V.
class LmHead final : public Module {
 public:
  static constexpr int64_t kLogitsAlign = 64;
  LmHead(std::string name, int64_t channels, int64_t vocab, std::unique_ptr<Module> norm,
         const Linear::Options& logits, uint64_t seed, Device device = Device::kCpu);
  // The logits [B, T, V] of the activations x [B, T, C], outside training: nothing is
  // stashed, no targets needed. For evaluation and the checks against other trainers.
  absl::StatusOr<Tensor> Logits(const Tensor& x, Precision precision = Precision::kFp32);
  int64_t vocab() const { return vocab_; }
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override;
  void Discard(int mb) override;

 private:
  absl::Status ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y);
  struct Saved {
    Tensor logits;   // [R, V padded]: the softmax is recomputed from them and stats
    Tensor stats;    // [R, 2]: each row's max and inverse sum (SoftmaxCrossEntropyForward)
    Tensor targets;  // int32 [R]
  };
  const std::string name_;
  const int64_t channels_, vocab_;
  const Device device_;
  Backend* const be_;
  std::unique_ptr<Module> norm_;
  Linear logits_;
  Stash<Saved> stash_;  // released by BackwardInput
};

// GPT-2's head: LayerNorm "<name>.ln" (eps 1e-5), then the projection, drawn as the
// embedding "embed.token" when `tied`.
std::unique_ptr<LmHead> GptHead(std::string name, int64_t channels, int64_t vocab, bool tied,
                                uint64_t seed, Device device = Device::kCpu);

// Mean squared error against the micro-batch's f32 targets (same shape as the input, on
// any device), averaged over all elements, as PyTorch's MSELoss. No parameters. The loss
// is a 1-element tensor on the module's device, like LmHead's. Refuses an empty input.
class MseLoss final : public Module {
 public:
  explicit MseLoss(std::string name, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override { return absl::OkStatus(); }
  void CollectParameters(std::vector<Parameter*>* out) override {}
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }

 private:
  const std::string name_;
  const Device device_;
  Backend* const be_;
  Stash<Tensor> stash_;  // pred - target
};

// Checks a 1-element f32 loss-scale gradient (on any device) and returns its value.
absl::StatusOr<float> LossScale(const std::string& who, const Tensor& dy);

}  // namespace baton

#endif  // BATON_COMMON_NN_TRANSFORMER_H_
