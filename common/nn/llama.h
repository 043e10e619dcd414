// The LLaMA transformer block and its pieces: RMSNorm, rotary grouped-query causal
// self-attention, the SwiGLU activation and the pre-norm residual block. Each follows the
// Module contract of module.h; the block mirrors TransformerBlock (transformer.h).
//
// Shapes, per micro-batch of B sequences of T positions (letters as in backend.h):
//   RmsNorm          x [..., C] -> y [..., C];            weight [C]
//   LlamaAttention   x [B, T, C] -> y [B, T, C];          qkv.weight [(H + 2 KVH) D, C],
//                                                         proj.weight [C, C]
//   SwiGlu           gate_up [..., 2I] -> [..., I]
//   LlamaBlock       x [B, T, C] -> y [B, T, C]
// No biases anywhere. Weights are stored as Hugging Face's LlamaForCausalLM stores them:
// qkv.weight is q_proj, k_proj and v_proj stacked by rows (in that order), gate_up.weight is
// gate_proj then up_proj, and rotary embedding uses transformers' "rotate_half" convention,
// so a checkpoint maps tensor by tensor (no q/k permutation).
#ifndef BATON_COMMON_NN_LLAMA_H_
#define BATON_COMMON_NN_LLAMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/nn/attention_core.h"
#include "common/nn/layers.h"
#include "common/nn/module.h"

namespace baton {

// RMSNorm over the last dimension: y = (x * rstd) * weight, rstd = 1 / sqrt(mean(x^2) + eps)
// (Hugging Face's LlamaRMSNorm). One parameter "<name>.weight" [C], initialised to ones.
class RmsNorm final : public Module {
 public:
  RmsNorm(std::string name, int64_t channels, float eps, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }

 private:
  struct Saved {
    Tensor x, rstd;  // x: in bf16, its bf16 bits
    Tensor dy;  // set by BackwardInput (in bf16: its bf16 bits)
  };
  const std::string name_;
  const int64_t channels_;
  const float eps_;
  const Device device_;
  Backend* const be_;
  Parameter gamma_;
  Stash<Saved> stash_;
};

// Causal grouped-query self-attention with rotary position embedding: qkv = x Wqkv^T; q and
// k rotated in place (positions 0 .. T-1 of each sequence); per query head h, causal softmax
// of q k^T / sqrt(D) with kv head h / (H / KVH) applied to its v; y = mixed Wproj^T.
// Requires C % H == 0, H % KVH == 0 and D = C / H even (Forward refuses others).
class LlamaAttention final : public Module {
 public:
  // `proj_stddev` initialises the output projection (scaled by 1/sqrt(2 layers) in a block);
  // the qkv projection is N(0, 0.02).
  LlamaAttention(std::string name, int64_t channels, int64_t heads, int64_t kv_heads,
                 float rope_theta, float proj_stddev, uint64_t seed, Device device = Device::kCpu);
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
    Tensor qkv;  // [B, T, (H + 2 KVH) D], q and k rotated (in bf16: its bf16 bits)
    AttentionStash core;
  };
  const std::string name_;
  const int64_t channels_, heads_, kv_heads_;
  const float rope_theta_;
  const Device device_;
  Backend* const be_;
  Linear qkv_, proj_;
  Stash<Saved> stash_;  // released by BackwardInput (the core has no weights)
};

// SwiGLU: out[..., i] = silu(gate_up[..., i]) * gate_up[..., I + i]. No parameters.
class SwiGlu final : public Module {
 public:
  SwiGlu(std::string name, int64_t intermediate, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override { return absl::OkStatus(); }
  void CollectParameters(std::vector<Parameter*>* out) override {}
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }

 private:
  const std::string name_;
  const int64_t intermediate_;
  const Device device_;
  Backend* const be_;
  Stash<Tensor> stash_;  // the input gate_up (in bf16: its bf16 bits)
};

// The LLaMA decoder layer: h = x + attn(attn_norm(x)); y = h + down(swiglu(gate_up(
// mlp_norm(h)))). Parameters, in canonical order: attn_norm.weight [C],
// attn.qkv.weight [(H + 2 KVH) D, C], attn.proj.weight [C, C], mlp_norm.weight [C],
// mlp.gate_up.weight [2I, C], mlp.down.weight [C, I]. Linear weights N(0, 0.02) except
// attn.proj and mlp.down, N(0, 0.02 / sqrt(2 num_layers)); norms ones.
class LlamaBlock final : public Module {
 public:
  LlamaBlock(std::string name, int64_t channels, int64_t heads, int64_t kv_heads,
             int64_t intermediate, float rope_theta, float eps, int64_t num_layers, uint64_t seed,
             Device device = Device::kCpu);
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
  RmsNorm attn_norm_;
  LlamaAttention attn_;
  RmsNorm mlp_norm_;
  Linear gate_up_;  // C -> 2I: gate then up
  SwiGlu act_;
  Linear down_;  // I -> C
};

// What one LlamaBlock costs, per sequence of T positions (as BlockInfo in model.h).
struct LlamaCosts {
  int64_t parameters = 0;  // float32 parameters
  // Multiply-add = 2; the GEMMs only (qkv, scores, mixing, proj, gate_up, down), counting
  // the attention's full T x T square as the GPT block's figure does.
  int64_t forward_flops = 0;
  // The float32 elements one micro-batch in flight keeps from forward until backward, its
  // input included, its output not: exact for this implementation (llama_test measures it
  // against the allocator).
  int64_t activation_floats = 0;
  // Of those, the ones a bf16 job keeps as bf16 bits (BlockInfo::activation_bf16).
  int64_t activation_bf16 = 0;
  // Of the parameters, the projections' weights (BlockInfo::operand_parameters).
  int64_t operand_parameters = 0;
  int64_t largest_parameter = 0;  // BlockInfo::largest_parameter
};
// T context, C channels, H query heads, KVH key/value heads, I MLP width (D = C / H).
LlamaCosts LlamaBlockCosts(int64_t T, int64_t C, int64_t H, int64_t KVH, int64_t I);

}  // namespace baton

#endif  // BATON_COMMON_NN_LLAMA_H_
