// The GELU arithmetic both backends compute, written once: the CPU backend compiles it as
// host code, the CUDA backend as device code (with --fmad=false, so nothing is fused into
// an FMA), and both get the same bits for the same input. Plain float arithmetic, no libm,
// branch-free: the CPU loops calling it vectorise without changing a bit.
#ifndef BATON_COMMON_CORE_GELU_MATH_H_
#define BATON_COMMON_CORE_GELU_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define BATON_HOST_DEVICE __host__ __device__
#else
#define BATON_HOST_DEVICE
#endif

namespace baton::gelu_math {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

BATON_HOST_DEVICE inline float FloatFromBits(int32_t bits) {
#ifdef __CUDA_ARCH__
  return __int_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// exp(x) for x in [-87, 88]: Cody-Waite reduction by ln 2 and Cephes' degree-6 polynomial.
BATON_HOST_DEVICE inline float ExpApprox(float x) {
  x = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: rounds to nearest integer
  const float fx = (x * 1.44269504088896341f + round_magic) - round_magic;
  float r = x - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * FloatFromBits((static_cast<int32_t>(fx) + 127) << 23);
}

// tanh within 2 ulp of the correctly rounded value: odd Taylor polynomial below |u| = 0.4,
// 1 - 2 / (exp(2|u|) + 1) above.
BATON_HOST_DEVICE inline float TanhApprox(float u) {
  const float a = fabsf(u);
  const float e = ExpApprox(2.0f * (a > 10.0f ? 10.0f : a));  // tanh(10) rounds to 1
  const float big = 1.0f - 2.0f / (e + 1.0f);
  const float u2 = u * u;
  float s = -1382.0f / 155925.0f;
  s = s * u2 + 62.0f / 2835.0f;
  s = s * u2 + -17.0f / 315.0f;
  s = s * u2 + 2.0f / 15.0f;
  s = s * u2 + -1.0f / 3.0f;
  const float small = u + u * u2 * s;
  const float signed_big = u < 0.0f ? -big : big;
  return a < 0.4f ? small : signed_big;
}

// GELU, tanh approximation (as in GPT-2), and its derivative.
BATON_HOST_DEVICE inline float GeluOf(float x) {
  const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + TanhApprox(inner));
}

BATON_HOST_DEVICE inline float GeluGrad(float x) {
  const float x2 = x * x;
  const float inner = kGeluScale * (x + kGeluCubic * x2 * x);
  const float th = TanhApprox(inner);
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x2);
}

}  // namespace baton::gelu_math

#undef BATON_HOST_DEVICE

#endif  // BATON_COMMON_CORE_GELU_MATH_H_
