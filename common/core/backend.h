// Backend: the kernels every layer is built from, one implementation per device.
//
// Layers never loop over tensor data themselves; they call these kernels on raw pointers
// of their device's memory. The CPU backend (cpu_backend.cc) is the reference; a CUDA
// backend implements the same interface and is checked against it.
//
// Contracts shared by every kernel:
//  - Pointers are device pointers of this backend's device, row-major and contiguous unless
//    a leading dimension says otherwise. Inputs and outputs do not alias unless stated.
//  - "Accumulates" means the kernel adds into its output (+=); "writes" means it overwrites.
//  - Kernels are deterministic: the same inputs give the same bits on every call, and every
//    reduction runs in a fixed order (documented per kernel). This is what makes a pipeline
//    run bit-identical to the single-process reference trainer.
//  - Dimension letters: R rows (B*T for sequences), C channels, B batch, T time, H heads,
//    KVH key/value heads, D head size (C / H), I MLP width, V vocabulary.
//  - Kernels do not validate shapes: layers do, and return absl::Status on bad input.
//  - Thread safety: a Backend is stateless apart from configuration; kernels may be called
//    from several threads at once on disjoint outputs.
#ifndef BATON_COMMON_CORE_BACKEND_H_
#define BATON_COMMON_CORE_BACKEND_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/core/tensor.h"

namespace baton {

// Which attention kernels a backend's attention modules take (Backend::SetAttentionKernel).
enum class AttentionKernel {
  kMaterialised,  // AttentionForward/Backward: the T x T probabilities kept
  kFused,         // FusedAttentionForward/Backward: float32 rows, head size <= 128
  kTiled,         // TiledAttentionForward/Backward in bf16 jobs (float32 ones: materialised)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // Lets Gemm use TF32 tensor cores (inputs rounded to 10 mantissa bits, float32
  // accumulation) instead of IEEE float32 products: a GPU setting (JobSpec.allow_tf32, and
  // bf16 jobs for their attention products, whose q, k and v TF32 holds exactly; their
  // Linears use GemmBf16); backends without it ignore it. It holds for the whole process
  // until set again: a worker runs one job at a time.
  virtual void SetAllowTf32(bool allow) {}
  // The attention kernels the modules take from now on (a job's JobSpec.attention, set
  // where SetAllowTf32 is: StageExecutor::Create, ReferenceTrainer::Create). Until set: the
  // process's BATON_FUSED_ATTENTION (DefaultAttentionKernel). Process-wide, like
  // SetAllowTf32: one job's kernels at a time.
  virtual void SetAttentionKernel(AttentionKernel kernel) = 0;
  virtual AttentionKernel attention_kernel() const = 0;

  // ---- Dense algebra ----
  // C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]; op(X) = X or X^T.
  virtual void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                    float* c, int64_t ldc) = 0;
  // Gemm with A and B as bf16 bits (common/core/bf16.h), float32 accumulation and C: the
  // products of bf16 values are exact in float32, so only the accumulation rounds. The CPU
  // widens A and B and runs its Gemm: the same bits as Gemm on the widened values. CUDA runs
  // cuBLAS's bf16 tensor-core GEMM (cublasGemmEx, CUBLAS_COMPUTE_32F, its fixed algorithm
  // and workspace): deterministic, not the same bits as its float32 Gemm.
  virtual void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                        float beta, float* c, int64_t ldc) = 0;
  // Writes out[i] = a[i] + b[i]. `out` may alias `a` or `b`.
  virtual void Add(int64_t n, const float* a, const float* b, float* out) = 0;
  // Writes y[i] = x[i] * scale. `y` may alias `x`.
  virtual void Scale(int64_t n, float scale, const float* x, float* y) = 0;
  virtual void Fill(int64_t n, float value, float* y) = 0;
  virtual void Copy(int64_t n, const float* x, float* y) = 0;
  // Copies `cols` floats of each of `rows` rows: y[r * ldy + c] = x[r * ldx + c].
  virtual void CopyRows(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y,
                        int64_t ldy) = 0;
  // Returns the sum of x, accumulated in double (the CPU in index order; a device in a
  // fixed tree that depends on n alone, not on the GPU's size: cuda_kernels.cu,
  // "whole-tensor sums"). On a device it waits for the work issued before (the result is
  // read back).
  virtual double Sum(int64_t n, const float* x) = 0;
  // Returns the sum of x[i]^2, each square and the sum in double, in the same order as Sum
  // (the CPU in index order; a device in its fixed tree): the same bits for the same input on
  // the same backend. Gradient clipping's norm is built from it (common/optim/optimizer.h).
  virtual double SumSquares(int64_t n, const float* x) = 0;
  // Writes out[i] = Sum(ns[i], xs[i]) for every i: exactly the bits Sum returns for each
  // tensor, for several tensors at once. xs and ns have the same length; ns[i] == 0 gives 0
  // (xs[i] may then be null). This default calls Sum per tensor (the CPU keeps it); a device
  // runs one launch sequence over all the tensors and reads the results back once, where
  // Sum would wait once per tensor. On a device it waits for the work issued before.
  virtual void SumEach(absl::Span<const float* const> xs, absl::Span<const int64_t> ns,
                       double* out) {
    for (size_t i = 0; i < xs.size(); ++i) out[i] = Sum(ns[i], xs[i]);
  }
  // The same for SumSquares: out[i] has exactly the bits SumSquares(ns[i], xs[i]) returns.
  virtual void SumSquaresEach(absl::Span<const float* const> xs, absl::Span<const int64_t> ns,
                              double* out) {
    for (size_t i = 0; i < xs.size(); ++i) out[i] = SumSquares(ns[i], xs[i]);
  }
  // Writes out[0] = float(Sum(n, x) / n), the same sum, divided in double, where x is: a
  // device does not wait for it (a loss is read once per step, not per micro-batch).
  // n > 0.
  virtual void MeanInto(int64_t n, const float* x, float* out) = 0;

  // ---- bf16 mixed precision (common/core/bf16.h: round to nearest even, NaN kept) ----
  // Writes y[i] = x[i] rounded to the nearest bf16 value, as a float. `y` may alias `x`.
  virtual void RoundToBf16(int64_t n, const float* x, float* y) = 0;
  // Writes the bf16 bits of x[i] (rounded as RoundToBf16) / the floats that bits x[i] are.
  virtual void ToBf16(int64_t n, const float* x, uint16_t* y) = 0;
  virtual void FromBf16(int64_t n, const uint16_t* x, float* y) = 0;

  // ---- Linear ----
  // y[r,c] += bias[c], then, when round_bf16, rounded to bf16 as RoundToBf16 rounds: one pass
  // where a separate RoundToBf16 would be a second (a bf16 job's Linear output), the same
  // bits.
  virtual void AddBias(int64_t rows, int64_t cols, const float* bias, float* y,
                       bool round_bf16) = 0;
  // Accumulates dbias[c] += sum over r of dy[r,c], adding rows in order r = 0, 1, ...
  virtual void BiasGrad(int64_t rows, int64_t cols, const float* dy, float* dbias) = 0;
  // BiasGrad of the floats that the bf16 bits dy are (a bf16 job's kept output gradient),
  // read as bits: the bits BiasGrad gives after FromBf16, without the widened copy.
  virtual void BiasGradBf16(int64_t rows, int64_t cols, const uint16_t* dy, float* dbias) = 0;

  // ---- GELU (tanh approximation, as in GPT-2) ----
  // Fused: writes pre[r,c] = x[r,c] + bias[c] and out[r,c] = gelu(pre[r,c]), out rounded to
  // bf16 when round_bf16 (as AddBias; pre never is). `pre` may alias `x`. `bias` may be null
  // (no bias).
  virtual void BiasGelu(int64_t rows, int64_t cols, const float* x, const float* bias, float* pre,
                        float* out, bool round_bf16) = 0;
  // Writes dx[i] = dy[i] * gelu'(pre[i]). `dx` may alias `dy`.
  virtual void GeluBackward(int64_t n, const float* pre, const float* dy, float* dx) = 0;

  // ---- LayerNorm over the last dimension ----
  // Writes y = (x - mean) * rstd * gamma + beta per row, and the row statistics mean[r],
  // rstd[r] = 1 / sqrt(var + eps) (biased variance; both summed in column order).
  virtual void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                                const float* gamma, const float* beta, float* y, float* mean,
                                float* rstd) = 0;
  // The residual sum and the LayerNorm of it, in one pass where a backend can: writes
  // sum = a + b (rounded to bf16 when round_bf16), then LayerNormForward of sum. The same
  // bits as Add, RoundToBf16 and LayerNormForward in turn, which is what this default does;
  // CUDA fuses them into one kernel (one launch and one pass over the rows instead of three).
  virtual void AddLayerNormForward(int64_t rows, int64_t cols, float eps, const float* a,
                                   const float* b, bool round_bf16, const float* gamma,
                                   const float* beta, float* sum, float* y, float* mean,
                                   float* rstd) {
    Add(rows * cols, a, b, sum);
    if (round_bf16) RoundToBf16(rows * cols, sum, sum);
    LayerNormForward(rows, cols, eps, sum, gamma, beta, y, mean, rstd);
  }
  // Writes dx from dy and the saved statistics.
  virtual void LayerNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                                      const float* mean, const float* rstd, const float* gamma,
                                      const float* dy, float* dx) = 0;
  // Accumulates dgamma[c] += sum_r dy * xhat and dbeta[c] += sum_r dy, rows in order.
  virtual void LayerNormBackwardWeight(int64_t rows, int64_t cols, const float* x,
                                       const float* mean, const float* rstd, const float* dy,
                                       float* dgamma, float* dbeta) = 0;

  // ---- RMSNorm over the last dimension (LLaMA) ----
  // Writes rstd[r] = 1 / sqrt(mean_c(x^2) + eps) (the squares summed in float in column
  // order, the sum times 1/cols, as LayerNormForward) and y = (x * rstd) * gamma, in that
  // order: Hugging Face's LlamaRMSNorm computes weight * (x * rsqrt(var + eps)) in float32.
  virtual void RmsNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                              const float* gamma, float* y, float* rstd) = 0;
  // Writes dx from dy and the saved rstd: with xhat = x * rstd and dxhat = dy * gamma,
  // dx = rstd * (dxhat - xhat * mean_c(dxhat * xhat)) (the mean summed in column order).
  virtual void RmsNormBackwardInput(int64_t rows, int64_t cols, const float* x, const float* rstd,
                                    const float* gamma, const float* dy, float* dx) = 0;
  // Accumulates dgamma[c] += sum_r dy * (x * rstd), rows in order.
  virtual void RmsNormBackwardWeight(int64_t rows, int64_t cols, const float* x, const float* rstd,
                                     const float* dy, float* dgamma) = 0;

  // ---- Rotary position embedding (LLaMA; Hugging Face's "rotate_half" convention) ----
  // Rotates in place the `heads` head vectors of size D (even) that start at column 0 of
  // each [b, t] row of x (rows of `row_stride` floats, B*T of them; head n occupies columns
  // n*D .. n*D+D-1). Position t = 0 .. T-1 within each sequence; pairs (i, i + D/2), i < D/2:
  //   out[i]       = x[i] * cos - x[i + D/2] * sin
  //   out[i + D/2] = x[i + D/2] * cos + x[i] * sin
  // with the angle computed as transformers' LlamaRotaryEmbedding does in float32:
  //   inv_freq[i] = 1.0f / float(theta^(float(2i) / float(D))),  angle = float(t) * inv_freq[i]
  // where the power is evaluated in double and rounded to float (torch's float32 pow, within
  // its 1 ulp), and cos, sin are those of the float32 angle evaluated in double and rounded
  // to float (within 1 ulp of torch's float32 cos/sin). Both backends use these expressions.
  virtual void RotaryForward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                             float theta, float* x) = 0;
  // The transpose (rotation by the negative angle), for gradients, in place:
  //   out[i] = x[i] * cos + x[i + D/2] * sin,  out[i + D/2] = x[i + D/2] * cos - x[i] * sin.
  virtual void RotaryBackward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                              float theta, float* x) = 0;

  // ---- Causal grouped-query self-attention core ----
  // H query heads share KVH key/value heads (KVH divides H; query head h uses kv head
  // h / (H / KVH), as transformers' repeat_kv). qkv[B,T,(H + 2*KVH)*D] holds q (H*D
  // columns), k (KVH*D) and v (KVH*D) side by side; head n of each uses columns n*D ..
  // n*D+D-1 of its part. With KVH == H this is multi-head attention over [q C | k C | v C].
  // Writes att[B,H,T,T] = causal softmax(q k^T / sqrt(D)) (zeros above the diagonal) and
  // y[B,T,H*D] = att v, heads side by side.
  virtual void AttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                const float* qkv, float* att, float* y) = 0;
  // Writes dqkv[B,T,(H + 2*KVH)*D] from dy[B,T,H*D] and the saved qkv and att. The dk and
  // dv of a kv head sum the contributions of its query heads in ascending order (the first
  // written, the next ones accumulated by GEMMs with beta = 1). `scratch` holds H*T*T floats
  // (the CPU uses T*T of them, the CUDA backend one T*T matrix per head).
  virtual void AttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                 const float* qkv, const float* att, const float* dy, float* dqkv,
                                 float* scratch) = 0;
  // Multi-head attention (GPT): the above with KVH == H, qkv[B,T,3C].
  void AttentionForward(int64_t B, int64_t T, int64_t H, int64_t D, const float* qkv, float* att,
                        float* y) {
    AttentionForward(B, T, H, H, D, qkv, att, y);
  }
  void AttentionBackward(int64_t B, int64_t T, int64_t H, int64_t D, const float* qkv,
                         const float* att, const float* dy, float* dqkv, float* scratch) {
    AttentionBackward(B, T, H, H, D, qkv, att, dy, dqkv, scratch);
  }

  // ---- Fused causal grouped-query attention (flash-style: flash_attention_math.h) ----
  // Same layout and meaning as AttentionForward/Backward, without the T x T matrix: the
  // forward writes y and lse[B,H,T] (each query row's logsumexp of its scaled scores), the
  // backward recomputes the probabilities from them. `scratch` holds B*H*T floats. The sums
  // run in the fixed orders flash_attention_math.h states, no atomics. Head size D at most
  // flash::kMaxHeadSize.
  virtual void FusedAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                     const float* qkv, float* y, float* lse) = 0;
  virtual void FusedAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                      const float* qkv, const float* y, const float* lse,
                                      const float* dy, float* dqkv, float* scratch) = 0;

  // ---- Tiled bf16 attention on matrix units (flash-style: flash_tiles.h) ----
  // For bf16 jobs: the layout and meaning of FusedAttentionForward/Backward, with q, k, v,
  // dy and the probabilities as bf16 operands of tile products accumulated in float32, in
  // the fixed orders flash_tiles.h states, no atomics. `scratch` holds B*H*T floats. Head size
  // D a multiple of 16, at most flash_tiles::kMaxD.
  virtual void TiledAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                     const float* qkv, float* y, float* lse) = 0;
  virtual void TiledAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                      const float* qkv, const float* y, const float* lse,
                                      const float* dy, float* dqkv, float* scratch) = 0;
  // Whether this device runs the tiled kernels at head size D, a multiple of 16 up to
  // flash_tiles::kMaxD: on the CPU always; on CUDA where the device has bf16 matrix units
  // (compute capability 8.0 or later) and room for the blocks' shared memory (asked once per
  // device). Which kernels a module takes is AttentionKernelFor's (attention_core.h).
  virtual bool RunsTiledAttention(int64_t D) const = 0;

  // ---- SwiGLU (LLaMA's MLP activation) ----
  // gate_up[rows, 2I] holds the gate (columns 0 .. I-1) and the up projection (I .. 2I-1).
  // Writes out[r,i] = silu(g) * u with silu(g) = g / (1 + exp(-g)) (float32, as torch's
  // F.silu), g = gate_up[r,i], u = gate_up[r,I+i].
  virtual void SwiGluForward(int64_t rows, int64_t I, const float* gate_up, float* out) = 0;
  // Writes dgate_up[r,i] = dout * u * sig * (1 + g * (1 - sig)) and dgate_up[r,I+i] =
  // dout * silu(g), with sig = 1 / (1 + exp(-g)).
  virtual void SwiGluBackward(int64_t rows, int64_t I, const float* gate_up, const float* dout,
                              float* dgate_up) = 0;

  // ---- Token + position embedding ----
  // Writes out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (wte's row alone when wpe is null:
  // a model without learned positions). Token ids must be in [0, V).
  virtual void EmbeddingForward(int64_t B, int64_t T, int64_t C, const int32_t* tokens,
                                const float* wte, const float* wpe, float* out) = 0;
  // Accumulates dwte[tokens[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:] (not when
  // dwpe is null), visiting (b, t) in row-major order.
  virtual void EmbeddingBackward(int64_t B, int64_t T, int64_t C, const int32_t* tokens,
                                 const float* dout, float* dwte, float* dwpe) = 0;

  // ---- Losses ----
  // Fused softmax + cross-entropy per row, without the probabilities (the [R, V] tensor a
  // materialised softmax writes, rereads and keeps until the backward): writes each row's
  // max m = max_v logits[r,v] and inverse sum inv = 1 / s, s = sum_v exp(logits[r,v] - m),
  // to stats[2r] and stats[2r+1], and losses[r] = log(s) + m - logits[r, targets[r]]
  // (logsumexp - logit). The CPU adds the exponentials in column order; a device in its
  // fixed tree per row. Row r of logits starts at logits + r * ld (ld >= V); columns V ..
  // ld - 1 are not read.
  virtual void SoftmaxCrossEntropyForward(int64_t rows, int64_t V, int64_t ld, const float* logits,
                                          const int32_t* targets, float* stats, float* losses) = 0;
  // Writes dlogits[r,v] = scale * (p - [v == targets[r]]), the probability recomputed from
  // the forward's statistics as p = exp(logits[r,v] - m) * inv: the forward's float
  // expressions, so the bits a stored softmax would have given. `dlogits` may alias `logits`;
  // both have rows ld floats apart, and columns V .. ld - 1 are neither read nor written.
  virtual void SoftmaxCrossEntropyBackward(int64_t rows, int64_t V, int64_t ld, const float* logits,
                                           const float* stats, const int32_t* targets, float scale,
                                           float* dlogits) = 0;

  // Writes diff[i] = pred[i] - target[i] and returns the sum of diff[i]^2 accumulated in
  // double, in SumSquares's order (the CPU's is index order).
  virtual double SquaredError(int64_t n, const float* pred, const float* target,
                              float* diff) = 0;
  // Writes diff as SquaredError does and out[0] = float(SquaredError(...) / n), the same
  // sum divided in double, where diff is: a device does not wait for it (MeanInto's
  // contract; a loss is read once per step). n > 0.
  virtual void SquaredErrorMeanInto(int64_t n, const float* pred, const float* target,
                                    float* diff, float* out) = 0;

  // ---- Optimizers (element-wise; one call per parameter) ----
  // PyTorch SGD semantics: g' = g + wd*w; buf = momentum*buf + g' (buf = g' on step 1);
  // w -= lr * buf. With momentum == 0, buf is not touched and may be null.
  virtual void SgdStep(int64_t n, float lr, float momentum, float weight_decay, bool first_step,
                       float* w, const float* g, float* buf) = 0;
  // AdamW (Loshchilov & Hutter): w *= 1 - lr*wd; m = b1 m + (1-b1) g;
  // v = b2 v + (1-b2) g^2; w -= lr * (m / bc1) / (sqrt(v / bc2) + eps), with
  // bc1 = 1 - b1^step and bc2 = 1 - b2^step given by the caller (step counts from 1).
  virtual void AdamWStep(int64_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float bias_correction1, float bias_correction2,
                         float* w, const float* g, float* m, float* v) = 0;
};

// The backend of `device`, or an error naming the device when this build or machine has
// none. The CPU backend always exists.
absl::StatusOr<Backend*> BackendFor(Device device);
Backend* CpuBackend();
// From now on BackendFor(device) returns `be` (not owned), nullptr: the device's own again.
// For tools that wrap a device's backend (PartProfiler): modules take their backend when
// they are built, so it applies to models built after it. CpuBackend() stays the CPU's.
void SetBackendOverride(Device device, Backend* be);

// Number of threads a CPU GEMM uses (the caller's included; the default is OpenBLAS's:
// OPENBLAS_NUM_THREADS, else the cores). Results do not depend on it: GEMM splits its
// output into row blocks of a fixed size (cpu_backend.cc); the tests check 1, 2 and 3.
void SetBlasThreads(int threads);

// BATON_FUSED_ATTENTION in the environment, read once per process (inline: both backend
// libraries read it): "1" asks for the float32 row kernels (flash_attention_math.h) in every
// job, "tiled" for the bf16 tile kernels (flash_tiles.h) in bf16 jobs, the materialised
// kernels in float32 ones. Anything else, or nothing: the materialised kernels.
inline const char* FusedAttentionSetting() {
  static const char* const setting = [] {
    const char* e = std::getenv("BATON_FUSED_ATTENTION");
    return e == nullptr ? "" : e;
  }();
  return setting;
}
inline bool FusedAttentionRequested() { return std::strcmp(FusedAttentionSetting(), "1") == 0; }
inline bool TiledAttentionRequested() { return std::strcmp(FusedAttentionSetting(), "tiled") == 0; }
// What BATON_FUSED_ATTENTION asks for: a backend's attention kernel until one is set.
inline AttentionKernel DefaultAttentionKernel() {
  return TiledAttentionRequested()   ? AttentionKernel::kTiled
         : FusedAttentionRequested() ? AttentionKernel::kFused
                                     : AttentionKernel::kMaterialised;
}
int BlasThreads();

}  // namespace baton

#endif  // BATON_COMMON_CORE_BACKEND_H_
