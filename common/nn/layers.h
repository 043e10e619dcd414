// The basic layers: Linear (optionally fused with GELU), GELU, LayerNorm, and the token +
// position Embedding. Each follows the Module contract of module.h.
//
// Shapes: activations are [..., C] tensors, processed as R = numel / C rows of C channels.
//
// Devices: a layer lives on one device (its parameters, its stash and its outputs) and
// computes with that device's Backend. A Linear or Embedding fed with data accepts it on
// any device and copies it over; every other input must already be on the layer's device.
#ifndef BATON_COMMON_NN_LAYERS_H_
#define BATON_COMMON_NN_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/nn/module.h"

namespace baton {

// y = x W^T + b, optionally followed by GELU (fused with the bias add). W is [out, in] as
// in PyTorch, b is [out]. In bf16 (module.h's Precision) x, W and the output gradient are
// rounded to bf16 bits, and their products are the backend's GemmBf16 (float32
// accumulation); the bias add and GELU are float32 and the output is rounded (unless
// Options::round_output is false).
class Linear final : public Module {
 public:
  struct Options {
    bool bias = true;
    bool gelu = false;               // y = gelu(x W^T + b), fused
    bool compute_input_grad = true;  // false for a first layer fed with data: dx undefined
    float init_stddev = 0.02f;       // W ~ N(0, init_stddev); b = 0
    // The parameter name whose draw initialises W (MakeParameter); empty: W's own name.
    std::string init_name;
    // In bf16, round the output to bf16 like every activation; false keeps it float32
    // (the logits, whose softmax and loss are float32).
    bool round_output = true;
    // Rows of the output, and of the gradient BackwardInput takes, are out_ld() = out
    // rounded up to a multiple of this many elements apart: the tensors are
    // [..., out_ld()], and columns out .. out_ld() - 1 are never written or read (their
    // contents are undefined). Aligned rows keep a device's GEMMs on their fast kernels
    // where `out` is odd (a vocabulary). The products are the same sums either way. Only
    // without bias and GELU.
    int64_t out_align = 1;
  };
  Linear(std::string name, int64_t in, int64_t out, const Options& options, uint64_t seed,
         Device device = Device::kCpu);

  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }
  // The output's row stride (Options::out_align).
  int64_t out_ld() const { return out_ld_; }

 private:
  struct Saved {
    Tensor x;    // input (in bf16: its bf16 bits)
    Tensor pre;  // pre-activation (gelu only; float32)
    Tensor dz;   // dL/d(x W^T + b), set by BackwardInput (in bf16: its bf16 bits)
  };
  // W as a product operand: the parameter itself, in bf16 its bf16 bits.
  absl::StatusOr<Tensor> WeightOperand(const MicroBatch& mb);
  const std::string name_;
  const int64_t in_, out_, out_ld_;
  const Options options_;
  const Device device_;
  Backend* const be_;
  Parameter weight_, bias_;
  Stash<Saved> stash_;
};

// Element-wise GELU (tanh approximation).
class Gelu final : public Module {
 public:
  explicit Gelu(std::string name, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override {}
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }

 private:
  const std::string name_;
  const Device device_;
  Backend* const be_;
  Stash<Tensor> stash_;  // the input
};

// LayerNorm over the last dimension with learned gain (init 1) and bias (init 0).
class LayerNorm final : public Module {
 public:
  LayerNorm(std::string name, int64_t channels, float eps = 1e-5f, Device device = Device::kCpu);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  // A residual sum and this LayerNorm of it: *sum = a + b (rounded in bf16, as a block's
  // residual sums are), then Forward(*sum), in one backend call (AddLayerNormForward: one
  // kernel on CUDA). The same bits as the add, the rounding and Forward in turn; the
  // backward is Forward's.
  absl::Status ForwardResidual(const MicroBatch& mb, const Tensor& a, const Tensor& b,
                               Tensor* sum, Tensor* y);
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }

 private:
  struct Saved {
    Tensor x, mean, rstd;  // x: in bf16, its bf16 bits
    Tensor dy;  // set by BackwardInput (in bf16: its bf16 bits)
  };
  // Forward's and ForwardResidual's shared parts: the statistics and the output for an
  // input of `shape`; then, once the backend filled them from input `x`, the output's
  // rounding and what is kept.
  absl::Status Allocate(const Shape& shape, Saved* s, Tensor* out);
  absl::Status Keep(const MicroBatch& mb, const Tensor& x, Saved s, Tensor out, Tensor* y);
  const std::string name_;
  const int64_t channels_;
  const float eps_;
  const Device device_;
  Backend* const be_;
  Parameter gamma_, beta_;
  Stash<Saved> stash_;
};

// Token + learned position embedding (GPT-2), or the token embedding alone when `positions`
// is false (LLaMA: its positions are rotary, in attention). Parameters "<name>.token"
// [vocab, C] and "<name>.position" [context, C]. Input: int32 token ids [B, T] with
// T <= context and ids in [0, vocab), on any device (checked on the host, then copied to the
// module's device). Output: [B, T, C]. Its input is data, so dx is always undefined.
class Embedding final : public Module {
 public:
  Embedding(std::string name, int64_t vocab, int64_t context, int64_t channels, uint64_t seed,
            Device device = Device::kCpu, bool positions = true);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override { return stash_.size(); }
  void Discard(int mb) override { stash_.Erase(mb); }

 private:
  struct Saved {
    Tensor tokens;
    Tensor dy;
  };
  const std::string name_;
  const int64_t vocab_, context_, channels_;
  const Device device_;
  Backend* const be_;
  const bool positions_;
  Parameter wte_, wpe_;  // wpe_ unused without positions
  Stash<Saved> stash_;
};

// Checks that `t` is a defined f32 tensor whose last dimension is `channels`; the error
// names `who`.
absl::Status CheckActivation(const std::string& who, const Tensor& t, int64_t channels);

// Checks that every int32 id in `ids` (on any device) is in [0, vocab); the error names
// `who`, `what` ("token id", "target id"), the id and its position.
absl::Status CheckTokenIds(const std::string& who, const char* what, const Tensor& ids,
                           int64_t vocab);

}  // namespace baton

#endif  // BATON_COMMON_NN_LAYERS_H_
