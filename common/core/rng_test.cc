#include "common/core/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace baton {
namespace {

using Words4 = std::array<uint32_t, 4>;
using Words2 = std::array<uint32_t, 2>;

// Known-answer tests from the Random123 distribution (kat_vectors, "philox4x32 10").
TEST(PhiloxTest, Random123KnownAnswersZero) {
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (Words4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
}

TEST(PhiloxTest, Random123KnownAnswersAllOnes) {
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Words4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
}

TEST(PhiloxTest, Random123KnownAnswersPi) {
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Words4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(RngHashTest, Fnv1a64KnownValues) {
  // The FNV-1a 64-bit reference values (offset basis, "a", "foobar").
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(RngHashTest, SplitMix64KnownValues) {
  // SplitMix64(x) is the first output of Vigna's splitmix64 generator seeded with x.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(1), 0x910a2dec89025cc1ull);
}

// The documented scheme (rng.h), spelled out: changing it changes every digest, so this test
// pins it.
TEST(RngStreamTest, FollowsTheDocumentedScheme) {
  const uint64_t seed = 1234;
  const char* name = "block.3.attn.qkv.weight";
  const uint64_t k = SplitMix64(seed ^ Fnv1a64(name));
  const Words2 key = {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
  RngStream s(seed, name);
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{4},
                     uint64_t{1001}, (uint64_t{1} << 34) + 6, ~uint64_t{0}}) {
    const uint64_t block = n / 4;
    const Words4 words = Philox4x32(
        {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0}, key);
    EXPECT_EQ(s.Bits(n), words[n % 4]) << n;
    EXPECT_EQ(s.Uniform(n), static_cast<float>(words[n % 4] >> 8) * 0x1p-24f) << n;
  }
  for (uint64_t n : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40}) {
    EXPECT_EQ(s.Bits64(n), static_cast<uint64_t>(s.Bits(2 * n)) |
                               (static_cast<uint64_t>(s.Bits(2 * n + 1)) << 32));
  }
}

TEST(RngStreamTest, NormalIsBoxMullerInDouble) {
  RngStream s(7, "normal");
  for (uint64_t n = 0; n < 64; ++n) {
    const uint64_t pair = n / 2;
    const double u1 = (static_cast<double>(s.Bits(2 * pair)) + 1.0) / 4294967296.0;
    const double u2 = static_cast<double>(s.Bits(2 * pair + 1)) / 4294967296.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * M_PI * u2;
    const float want = static_cast<float>(n % 2 == 0 ? r * std::cos(theta) : r * std::sin(theta));
    EXPECT_EQ(s.Normal(n), want) << n;
  }
}

TEST(RngStreamTest, Deterministic) {
  RngStream a(42, "data/step/12");
  RngStream b(42, "data/step/12");
  RngStream copy = a;
  for (uint64_t n = 0; n < 1000; ++n) {
    ASSERT_EQ(a.Bits(n), b.Bits(n)) << n;
    ASSERT_EQ(a.Uniform(n), copy.Uniform(n)) << n;
    ASSERT_EQ(a.Normal(n), b.Normal(n)) << n;
  }
  // Random access: the value at an index does not depend on what was drawn before.
  const float late = a.Normal(123456789);
  for (uint64_t n = 0; n < 10; ++n) a.Normal(n);
  EXPECT_EQ(a.Normal(123456789), late);
  EXPECT_EQ(b.Normal(123456789), late);
}

int CountEqualBits(const RngStream& a, const RngStream& b, uint64_t count) {
  int equal = 0;
  for (uint64_t n = 0; n < count; ++n) equal += a.Bits(n) == b.Bits(n);
  return equal;
}

TEST(RngStreamTest, DifferentNamesAndSeedsGiveDifferentStreams) {
  RngStream base(42, "block.0.weight");
  // Two random 32-bit words collide with probability 2^-32; over 1000 draws, more than one
  // collision means correlated streams.
  EXPECT_LE(CountEqualBits(base, RngStream(42, "block.1.weight"), 1000), 1);
  EXPECT_LE(CountEqualBits(base, RngStream(42, "block.0.bias"), 1000), 1);
  EXPECT_LE(CountEqualBits(base, RngStream(43, "block.0.weight"), 1000), 1);
  EXPECT_LE(CountEqualBits(base, RngStream(42, ""), 1000), 1);
  EXPECT_LE(CountEqualBits(RngStream(0, "a"), RngStream(0, "b"), 1000), 1);
}

TEST(RngStreamTest, UniformInUnitInterval) {
  // Mean over 100k samples: standard error sqrt(1/12/1e5) = 9.1e-4; bound 5e-3 (> 5 sigma).
  RngStream s(1, "uniform");
  constexpr int kN = 100000;
  double sum = 0.0;
  float lo = 1.0f, hi = 0.0f;
  int buckets[10] = {};
  for (int i = 0; i < kN; ++i) {
    const float u = s.Uniform(static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f) << i;
    ASSERT_LT(u, 1.0f) << i;
    sum += u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    ++buckets[static_cast<int>(u * 10.0f)];
  }
  EXPECT_NEAR(sum / kN, 0.5, 5e-3);
  EXPECT_LT(lo, 1e-3f);
  EXPECT_GT(hi, 1.0f - 1e-3f);
  // Chi-square over 10 equal buckets, 9 degrees of freedom: 99.99th percentile is 33.7.
  double chi2 = 0.0;
  for (int b : buckets) chi2 += (b - kN / 10.0) * (b - kN / 10.0) / (kN / 10.0);
  EXPECT_LT(chi2, 33.7);
  // The largest possible value is 1 - 2^-24, never 1.
  EXPECT_EQ(static_cast<float>(0xffffffffu >> 8) * 0x1p-24f, 1.0f - 0x1p-24f);
}

TEST(RngStreamTest, NormalMomentsOver100kSamples) {
  // Standard errors over 100k samples: mean 1/sqrt(1e5) = 3.2e-3, standard deviation
  // 1/sqrt(2e5) = 2.2e-3, P(|x| < 1) sqrt(.68*.32/1e5) = 1.5e-3. Bounds are ~5 sigma.
  RngStream s(2024, "normal");
  constexpr int kN = 100000;
  double sum = 0.0, sum_sq = 0.0, sum_cube = 0.0;
  int within_one = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = s.Normal(static_cast<uint64_t>(i));
    ASSERT_TRUE(std::isfinite(x)) << i;
    sum += x;
    sum_sq += x * x;
    sum_cube += x * x * x;
    within_one += std::fabs(x) < 1.0;
  }
  const double mean = sum / kN;
  const double stddev = std::sqrt(sum_sq / kN - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.016);
  EXPECT_NEAR(stddev, 1.0, 0.011);
  EXPECT_NEAR(sum_cube / kN, 0.0, 0.04);  // skewness; standard error sqrt(15/1e5) = 0.012
  EXPECT_NEAR(static_cast<double>(within_one) / kN, 0.682689, 0.0075);
}

TEST(RngStreamTest, FillNormalAndFillUniform) {
  RngStream s(5, "fill");
  std::vector<float> n(257), u(257);
  s.FillNormal(n.data(), static_cast<int64_t>(n.size()), 0.5f, 0.02f);
  s.FillUniform(u.data(), static_cast<int64_t>(u.size()), -2.0f, 3.0f);
  for (size_t i = 0; i < n.size(); ++i) {
    EXPECT_EQ(n[i], 0.5f + 0.02f * s.Normal(i)) << i;
    EXPECT_EQ(u[i], -2.0f + 5.0f * s.Uniform(i)) << i;
    EXPECT_GE(u[i], -2.0f);
    EXPECT_LT(u[i], 3.0f);
  }
}

TEST(RngStreamTest, UniformIntBelowBound) {
  RngStream s(9, "int");
  for (uint64_t bound : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{10}, uint64_t{50257},
                         uint64_t{1} << 31, (uint64_t{1} << 32) - 1}) {
    for (uint64_t n = 0; n < 2000; ++n) ASSERT_LT(s.UniformInt(n, bound), bound) << bound;
  }
  for (uint64_t n = 0; n < 100; ++n) EXPECT_EQ(s.UniformInt(n, 1), 0u);
  // Lemire multiply-shift: the high 64 bits of Bits64(n) * bound.
  EXPECT_EQ(s.UniformInt(17, 1000),
            static_cast<uint64_t>((static_cast<unsigned __int128>(s.Bits64(17)) * 1000) >> 64));
  // Roughly uniform over 10 values: chi-square, 9 degrees of freedom, 99.99th pct 33.7.
  constexpr int kN = 100000;
  int counts[10] = {};
  for (int i = 0; i < kN; ++i) ++counts[s.UniformInt(static_cast<uint64_t>(i), 10)];
  double chi2 = 0.0;
  for (int c : counts) chi2 += (c - kN / 10.0) * (c - kN / 10.0) / (kN / 10.0);
  EXPECT_LT(chi2, 33.7);
}

}  // namespace
}  // namespace baton
