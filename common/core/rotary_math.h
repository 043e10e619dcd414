// The rotary-embedding angles both backends compute (backend.h, RotaryForward), written
// once: the CPU backend compiles this as host code, the CUDA backend as device code.
//
// The roundings are those of transformers' LlamaRotaryEmbedding in float32:
//   inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D))   -> float32 pow, reciprocal
//   freqs    = t.float() * inv_freq                              -> float32 product
//   cos, sin = freqs.cos(), freqs.sin()                          -> float32
// The power, cosine and sine are evaluated in double and rounded to float: the correctly
// rounded float32 value in all but vanishingly rare cases, so within torch's 1 ulp (it uses
// SLEEF's 1-ulp float32 functions), and the same bits on the CPU and the GPU (both evaluate
// the double functions to within an ulp of double, far below a float's rounding).
// Measured against transformers 5.17's LlamaRotaryEmbedding (torch 2.11, D = 128; theta
// 10000 for T = 4096, 500000 for T = 8192): every cos and sin within 1 ulp (max |diff|
// 6e-8) of torch's on the CPU and on CUDA; 5% (CPU) to 19% (CUDA) of them differ by that
// ulp, torch's own two devices differing likewise.
#ifndef BATON_COMMON_CORE_ROTARY_MATH_H_
#define BATON_COMMON_CORE_ROTARY_MATH_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define BATON_HOST_DEVICE __host__ __device__
#else
#define BATON_HOST_DEVICE
#endif

namespace baton::rotary_math {

// 1 / theta^(2i / D) for pair i (0 <= i < D/2), in float32 as transformers computes it.
BATON_HOST_DEVICE inline float InvFreq(int64_t i, int64_t D, float theta) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(D);
  const float p =
      static_cast<float>(::pow(static_cast<double>(theta), static_cast<double>(exponent)));
  return 1.0f / p;
}

// cos and sin of the float32 angle t * inv_freq.
BATON_HOST_DEVICE inline void CosSin(int64_t t, float inv_freq, float* c, float* s) {
  const double angle = static_cast<double>(static_cast<float>(t) * inv_freq);
  *c = static_cast<float>(::cos(angle));
  *s = static_cast<float>(::sin(angle));
}

}  // namespace baton::rotary_math

#undef BATON_HOST_DEVICE

#endif  // BATON_COMMON_CORE_ROTARY_MATH_H_
