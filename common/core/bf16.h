// bfloat16: the upper 16 bits of an IEEE float32 (8 exponent bits, 7 stored mantissa bits).
//
// baton's bf16 mixed precision stores activations, the inputs of every matrix product and
// the tensors between stages as bfloat16 values, and computes in float32
// (docs/precision.md). Rounding is round-to-nearest-even, NaN kept NaN (quieted), exactly as
// PyTorch's float -> bfloat16 conversion: the same float gives the same bf16 bits on every
// backend, host and device (this header is usable from CUDA code too).
#ifndef BATON_COMMON_CORE_BF16_H_
#define BATON_COMMON_CORE_BF16_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BATON_BF16_FN __host__ __device__ inline
#else
#define BATON_BF16_FN inline
#endif

namespace baton {

// The bf16 bits nearest to `f` (ties to even); a NaN stays a quiet NaN with its sign.
BATON_BF16_FN uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, sizeof(u));
#endif
  // Both results, then a select: branch-free, so the CPU's loops over it vectorise.
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// The float32 whose upper half is `b` (exact: every bf16 value is a float).
BATON_BF16_FN float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// `f` rounded to the nearest bf16 value, as a float.
BATON_BF16_FN float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

}  // namespace baton

#undef BATON_BF16_FN

#endif  // BATON_COMMON_CORE_BF16_H_
