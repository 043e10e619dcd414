// Fused causal attention, flash-style: the per-row arithmetic both backends run.
//
// No T x T matrix: each query row visits its keys j = 0 .. i in ascending order with an
// online softmax (a running maximum m, a running sum l of exp(s - m), and the running
// weighted sum of value rows, rescaled when m grows), and keeps only the row's
// logsumexp lse = m + log(l). The backward recomputes each probability as
// p = exp(s - lse) in three passes, none of which adds into memory another thread writes
// (no atomics):
//   1. delta_i = dy_i . y_i                       per (b, h, query row i)
//   2. dq_i = scale * sum_{j <= i} ds_ij k_j      per (b, h, query row i), j ascending
//   3. dv_j = sum_h sum_{i >= j} p_ij dy_i,       per (b, kv head, key row j): the group's
//      dk_j = scale * sum_h sum_{i >= j} ds_ij q_i   query heads ascending, then i ascending
// with ds_ij = p_ij (dy_i . v_j - delta_i). Every sum has a fixed order, so the results are
// the same bits on every run; the CPU backend (cpu_backend.cc) runs these functions in
// loops and the CUDA backend (cuda_kernels.cu) runs one thread per row, so the two agree to
// the rounding of exp and log (host libm against the device's).
//
// Layout as Backend::AttentionForward: qkv [B, T, (H + 2 KVH) D] (q of head h at column
// h*D, k of kv head g at C + g*D, v at C + KVH*D + g*D, C = H*D), query head h reading kv
// head h / (H / KVH); y and dy [B, T, C]; lse and delta [B, H, T].
//
// Compiled for host and device: the CUDA file is built with --fmad=false and the host with
// -ffp-contract=off, so neither contracts a*b+c.
#ifndef BATON_COMMON_CORE_FLASH_ATTENTION_MATH_H_
#define BATON_COMMON_CORE_FLASH_ATTENTION_MATH_H_

#include <cstdint>

#if defined(__CUDACC__)
#define BATON_FA_FN __host__ __device__ inline
#else
#include <cmath>
#define BATON_FA_FN inline
#endif

namespace baton {
namespace flash {

// The largest head size the fused kernels take (their per-row accumulators are arrays of
// this size); larger heads use the materialised kernels.
inline constexpr int64_t kMaxHeadSize = 128;

BATON_FA_FN float Exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

BATON_FA_FN float Log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

// sum_d a[d] * b[d], d ascending, in float.
BATON_FA_FN float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Query row i of one (b, h): q is its query (D floats), k and v the rows 0 of its kv head
// (rows W floats apart). Writes the row's output to y (D floats) and returns its
// logsumexp. `acc` is D floats of scratch.
BATON_FA_FN float ForwardRow(const float* q, const float* k, const float* v, int64_t W,
                             int64_t D, int64_t i, float scale, float* acc, float* y) {
  float m = -INFINITY;
  float l = 0.0f;
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    const float s = Dot(q, k + j * W, D) * scale;
    if (s > m) {  // a new maximum: rescale what was summed against the old one
      const float c = Exp(m - s);  // 0 for the first key (m = -inf)
      l *= c;
      for (int64_t d = 0; d < D; ++d) acc[d] *= c;
      m = s;
    }
    const float p = Exp(s - m);
    l += p;
    const float* vj = v + j * W;
    for (int64_t d = 0; d < D; ++d) acc[d] += p * vj[d];
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < D; ++d) y[d] = acc[d] * inv;
  return m + Log(l);
}

// Pass 2 for query row i of one (b, h): dq (D floats, written) from its query q, output
// gradient dy, logsumexp and delta; k and v as ForwardRow's. `acc` is D floats of scratch.
BATON_FA_FN void BackwardQueryRow(const float* q, const float* k, const float* v, int64_t W,
                                  int64_t D, int64_t i, float scale, float lse, const float* dy,
                                  float delta, float* acc, float* dq) {
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    const float* kj = k + j * W;
    const float p = Exp(Dot(q, kj, D) * scale - lse);
    const float ds = p * (Dot(dy, v + j * W, D) - delta);
    for (int64_t d = 0; d < D; ++d) acc[d] += ds * kj[d];
  }
  for (int64_t d = 0; d < D; ++d) dq[d] = acc[d] * scale;
}

// Pass 3 for key row j of kv head g of one batch element: dk and dv (D floats each,
// written). qkv, dy, lse and delta point at the batch element's first row (lse and delta:
// [H, T]). `dk_acc` and `dv_acc` are D floats of scratch each; `dv_acc` may be `dv` itself
// (the CUDA kernel sums there: the same bits).
BATON_FA_FN void BackwardKeyRow(const float* qkv, const float* dy, const float* lse,
                                const float* delta, int64_t T, int64_t H, int64_t KVH,
                                int64_t D, int64_t g, int64_t j, float scale, float* dk_acc,
                                float* dv_acc, float* dk, float* dv) {
  const int64_t C = H * D, W = (H + 2 * KVH) * D, G = H / KVH;
  const float* kj = qkv + j * W + C + g * D;
  const float* vj = qkv + j * W + C + KVH * D + g * D;
  for (int64_t d = 0; d < D; ++d) {
    dk_acc[d] = 0.0f;
    dv_acc[d] = 0.0f;
  }
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    for (int64_t i = j; i < T; ++i) {
      const float* qi = qkv + i * W + h * D;
      const float* dyi = dy + i * C + h * D;
      const float p = Exp(Dot(qi, kj, D) * scale - lse[h * T + i]);
      for (int64_t d = 0; d < D; ++d) dv_acc[d] += p * dyi[d];
      const float ds = p * (Dot(dyi, vj, D) - delta[h * T + i]);
      for (int64_t d = 0; d < D; ++d) dk_acc[d] += ds * qi[d];
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    dk[d] = dk_acc[d] * scale;
    dv[d] = dv_acc[d];
  }
}

}  // namespace flash
}  // namespace baton

#undef BATON_FA_FN

#endif  // BATON_COMMON_CORE_FLASH_ATTENTION_MATH_H_
