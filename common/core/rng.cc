#include "common/core/rng.h"

#include <cmath>

namespace baton {
namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kPhiloxM0, c[0], &hi0, &lo0);
    MulHiLo(kPhiloxM1, c[2], &hi1, &lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kPhiloxW0;
    k[1] += kPhiloxW1;
  }
  return c;
}

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

RngStream::RngStream(uint64_t seed, std::string_view name) {
  const uint64_t k = SplitMix64(seed ^ Fnv1a64(name));
  key_ = {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

uint32_t RngStream::Bits(uint64_t n) const {
  const uint64_t block = n / 4;
  const auto r = Philox4x32(
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}, key_);
  return r[n % 4];
}

uint64_t RngStream::Bits64(uint64_t n) const {
  return static_cast<uint64_t>(Bits(2 * n)) | (static_cast<uint64_t>(Bits(2 * n + 1)) << 32);
}

float RngStream::Uniform(uint64_t n) const {
  return static_cast<float>(Bits(n) >> 8) * (1.0f / 16777216.0f);
}

float RngStream::Normal(uint64_t n) const {
  const uint64_t pair = n / 2;
  // u1 in (0, 1] so that log(u1) is finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(Bits(2 * pair)) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = static_cast<double>(Bits(2 * pair + 1)) * (1.0 / 4294967296.0);
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * M_PI * u2;
  return static_cast<float>(n % 2 == 0 ? r * std::cos(theta) : r * std::sin(theta));
}

uint64_t RngStream::UniformInt(uint64_t n, uint64_t bound) const {
  const unsigned __int128 p = static_cast<unsigned __int128>(Bits64(n)) * bound;
  return static_cast<uint64_t>(p >> 64);
}

void RngStream::FillNormal(float* out, int64_t count, float mean, float stddev) const {
  for (int64_t i = 0; i < count; ++i) out[i] = mean + stddev * Normal(static_cast<uint64_t>(i));
}

void RngStream::FillUniform(float* out, int64_t count, float lo, float hi) const {
  for (int64_t i = 0; i < count; ++i) out[i] = lo + (hi - lo) * Uniform(static_cast<uint64_t>(i));
}

}  // namespace baton
