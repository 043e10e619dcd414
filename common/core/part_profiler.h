// Where a training step's device time goes, part by part: a Backend that runs another
// backend's kernels unchanged and times each call into one part of the step (the products,
// the LM head's products, attention, element-wise passes, norms, the loss, the embedding,
// whole-tensor sums, the optimizer).
//
// On a GPU each call is bracketed by two marks in the stream's order (DeviceTimer: CUDA
// events), so a part's time is its kernels' device time, not the host's issue time; what a
// step's wall time has beyond the parts' sum is time the device spent idle, waiting for the
// host to issue work. The marks cost the host a few microseconds a call: a profiled step is
// slower than an unprofiled one, its parts are not (the kernels run as they would). On the
// CPU, which computes as it is called, each call's wall time.
//
// Install it with SetBackendOverride(device, &profiler) before the model is built (modules
// keep the backend they were built with), and remove it (nullptr) before it is destroyed.
// The results are the wrapped backend's bits: every call is passed on with its arguments.
//
// Thread safety: one thread calls it (the reference trainer's, gpt_bench --parts); it is not
// for pipelines whose ranks share a process.
#ifndef BATON_COMMON_CORE_PART_PROFILER_H_
#define BATON_COMMON_CORE_PART_PROFILER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/core/backend.h"
#include "common/core/device_timer.h"

namespace baton {

enum class StepPart {
  kGemm,         // Gemm, GemmBf16 (but the LM head's)
  kHeadGemm,     // products with a dimension of the vocabulary's size (the LM head's)
  kAttention,    // the attention cores: materialised, fused, tiled
  kElementwise,  // add, scale, fill, copies, bf16 rounding and packing, bias, GELU, SwiGLU,
                 // rotary
  kNorm,         // LayerNorm and RMSNorm, forward and backward
  kLoss,         // softmax cross-entropy, squared error
  kEmbedding,    // token and position embedding, forward and backward
  kSums,         // whole-tensor sums (the divergence check, the clipping norm, means)
  kOptimizer,    // SGD and AdamW updates
};
inline constexpr int kStepParts = 9;
// "gemm", "lm-head gemm", "attention", ...
const char* StepPartName(StepPart part);

class PartProfiler final : public Backend {
 public:
  struct Part {
    int64_t calls = 0;
    int64_t ns = 0;  // device time on a GPU, wall time on the CPU
  };

  // `inner` (not owned) runs every kernel. A product with m, n or k equal to `vocab` counts
  // as kHeadGemm (0: none does).
  PartProfiler(Backend* inner, int64_t vocab);

  // Adds the calls timed since the last Collect to the totals: waits for the device's
  // stream to pass them. An error when a device time cannot be read.
  absl::Status Collect();
  // The totals so far, by StepPart; ResetTotals zeroes them and kernels()' (the calls not
  // yet collected stay, and count at the next Collect).
  const std::array<Part, kStepParts>& totals() const { return totals_; }
  // The same per kernel within part `part`, by the Backend method's name ("GemmBf16",
  // "RoundToBf16", ...).
  const std::map<std::string, Part, std::less<>>& kernels(StepPart part) const {
    return kernels_[static_cast<int>(part)];
  }
  void ResetTotals() {
    totals_ = {};
    for (auto& part : kernels_) {
      for (auto& [name, k] : part) k = {};
    }
  }

  Device device() const override { return inner_->device(); }
  void SetAllowTf32(bool allow) override { inner_->SetAllowTf32(allow); }
  void SetAttentionKernel(AttentionKernel kernel) override { inner_->SetAttentionKernel(kernel); }
  AttentionKernel attention_kernel() const override { return inner_->attention_kernel(); }
  bool RunsTiledAttention(int64_t D) const override { return inner_->RunsTiledAttention(D); }

  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override;
  void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                float* c, int64_t ldc) override;
  void Add(int64_t n, const float* a, const float* b, float* out) override;
  void Scale(int64_t n, float scale, const float* x, float* y) override;
  void Fill(int64_t n, float value, float* y) override;
  void Copy(int64_t n, const float* x, float* y) override;
  void CopyRows(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y,
                int64_t ldy) override;
  double Sum(int64_t n, const float* x) override;
  double SumSquares(int64_t n, const float* x) override;
  void SumEach(absl::Span<const float* const> xs, absl::Span<const int64_t> ns,
               double* out) override;
  void SumSquaresEach(absl::Span<const float* const> xs, absl::Span<const int64_t> ns,
                      double* out) override;
  void MeanInto(int64_t n, const float* x, float* out) override;
  void RoundToBf16(int64_t n, const float* x, float* y) override;
  void ToBf16(int64_t n, const float* x, uint16_t* y) override;
  void FromBf16(int64_t n, const uint16_t* x, float* y) override;
  void AddBias(int64_t rows, int64_t cols, const float* bias, float* y, bool round_bf16) override;
  void BiasGrad(int64_t rows, int64_t cols, const float* dy, float* dbias) override;
  void BiasGradBf16(int64_t rows, int64_t cols, const uint16_t* dy, float* dbias) override;
  void BiasGelu(int64_t rows, int64_t cols, const float* x, const float* bias, float* pre,
                float* out, bool round_bf16) override;
  void GeluBackward(int64_t n, const float* pre, const float* dy, float* dx) override;
  void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd) override;
  void AddLayerNormForward(int64_t rows, int64_t cols, float eps, const float* a, const float* b,
                           bool round_bf16, const float* gamma, const float* beta, float* sum,
                           float* y, float* mean, float* rstd) override;
  void LayerNormBackwardInput(int64_t rows, int64_t cols, const float* x, const float* mean,
                              const float* rstd, const float* gamma, const float* dy,
                              float* dx) override;
  void LayerNormBackwardWeight(int64_t rows, int64_t cols, const float* x, const float* mean,
                               const float* rstd, const float* dy, float* dgamma,
                               float* dbeta) override;
  void RmsNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                      float* y, float* rstd) override;
  void RmsNormBackwardInput(int64_t rows, int64_t cols, const float* x, const float* rstd,
                            const float* gamma, const float* dy, float* dx) override;
  void RmsNormBackwardWeight(int64_t rows, int64_t cols, const float* x, const float* rstd,
                             const float* dy, float* dgamma) override;
  void RotaryForward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                     float theta, float* x) override;
  void RotaryBackward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                      float theta, float* x) override;
  void AttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, const float* qkv,
                        float* att, float* y) override;
  void AttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, const float* qkv,
                         const float* att, const float* dy, float* dqkv, float* scratch) override;
  void FusedAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                             const float* qkv, float* y, float* lse) override;
  void FusedAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                              const float* qkv, const float* y, const float* lse, const float* dy,
                              float* dqkv, float* scratch) override;
  void TiledAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                             const float* qkv, float* y, float* lse) override;
  void TiledAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                              const float* qkv, const float* y, const float* lse, const float* dy,
                              float* dqkv, float* scratch) override;
  void SwiGluForward(int64_t rows, int64_t I, const float* gate_up, float* out) override;
  void SwiGluBackward(int64_t rows, int64_t I, const float* gate_up, const float* dout,
                      float* dgate_up) override;
  void EmbeddingForward(int64_t B, int64_t T, int64_t C, const int32_t* tokens, const float* wte,
                        const float* wpe, float* out) override;
  void EmbeddingBackward(int64_t B, int64_t T, int64_t C, const int32_t* tokens, const float* dout,
                         float* dwte, float* dwpe) override;
  void SoftmaxCrossEntropyForward(int64_t rows, int64_t V, int64_t ld, const float* logits,
                                  const int32_t* targets, float* stats, float* losses) override;
  void SoftmaxCrossEntropyBackward(int64_t rows, int64_t V, int64_t ld, const float* logits,
                                   const float* stats, const int32_t* targets, float scale,
                                   float* dlogits) override;
  double SquaredError(int64_t n, const float* pred, const float* target, float* diff) override;
  void SquaredErrorMeanInto(int64_t n, const float* pred, const float* target, float* diff,
                            float* out) override;
  void SgdStep(int64_t n, float lr, float momentum, float weight_decay, bool first_step, float* w,
               const float* g, float* buf) override;
  void AdamWStep(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                 float bias_correction1, float bias_correction2, float* w, const float* g, float* m,
                 float* v) override;

 private:
  // Times `run` (a call of inner_'s method `kernel`, a literal) into `part`.
  template <typename Run>
  auto Timed(StepPart part, const char* kernel, Run&& run);
  StepPart GemmPart(int64_t m, int64_t n, int64_t k) const;

  Backend* const inner_;
  const int64_t vocab_;
  const std::unique_ptr<DeviceTimer> timer_;  // null on the CPU: wall time
  struct Pending {
    StepPart part;
    Part* kernel;  // in kernels_ (a map's values stay where they are)
    int from, to;  // the timer's marks around the call (-1: could not mark)
  };
  std::vector<Pending> pending_;  // marked, not yet collected
  std::array<Part, kStepParts> totals_{};
  std::array<std::map<std::string, Part, std::less<>>, kStepParts> kernels_;
};

}  // namespace baton

#endif  // BATON_COMMON_CORE_PART_PROFILER_H_
