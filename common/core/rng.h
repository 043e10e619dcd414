// Counter-based random numbers: any value is a pure function of (seed, stream name, index).
//
// Every parameter, every batch and every synthetic teacher is drawn from a stream named for
// what it initialises ("block.3.attn.qkv.weight", "data/step/12"), so any worker can
// regenerate exactly the values any other worker would have drawn, in any order, without
// sharing state. The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11), the same family cuRAND and PyTorch use on GPUs, so a CUDA
// backend can draw identical values on the device.
//
// Scheme (documented in docs/architecture.md; changing it changes every digest):
//   key     = SplitMix64(seed ^ FNV1a64(name)), split into two 32-bit words (lo, hi)
//   block i = Philox4x32-10(counter = (i lo, i hi, 0, 0), key) -> 4 uint32 words
//   Bits(n) = word n % 4 of block n / 4
//   Uniform(n) = (Bits(n) >> 8) * 2^-24, in [0, 1)
//   Normal(n)  = Box-Muller on (Bits(2k), Bits(2k+1)) with k = n / 2, computed in double,
//                cos branch for even n and sin branch for odd n, rounded to float.
#ifndef BATON_COMMON_CORE_RNG_H_
#define BATON_COMMON_CORE_RNG_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace baton {

// Philox4x32 with 10 rounds.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

uint64_t Fnv1a64(std::string_view s);
uint64_t SplitMix64(uint64_t x);

// A stateless stream of random values. Cheap to copy; thread-safe (const).
class RngStream {
 public:
  RngStream(uint64_t seed, std::string_view name);

  uint32_t Bits(uint64_t n) const;
  uint64_t Bits64(uint64_t n) const;  // Bits(2n) | Bits(2n+1) << 32
  float Uniform(uint64_t n) const;
  float Normal(uint64_t n) const;
  // An integer in [0, bound) from Bits64(n) by multiply-shift (Lemire); bias below 2^-32
  // for any bound under 2^32.
  uint64_t UniformInt(uint64_t n, uint64_t bound) const;

  // out[i] = mean + stddev * Normal(i) for i in [0, count).
  void FillNormal(float* out, int64_t count, float mean, float stddev) const;
  // out[i] = lo + (hi - lo) * Uniform(i).
  void FillUniform(float* out, int64_t count, float lo, float hi) const;

 private:
  std::array<uint32_t, 2> key_;
};

}  // namespace baton

#endif  // BATON_COMMON_CORE_RNG_H_
