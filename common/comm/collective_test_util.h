// Data and checks the engines' tests share (collective.h's contract). Include from
// *_test.cc only.
#ifndef BATON_COMMON_COMM_COLLECTIVE_TEST_UTIL_H_
#define BATON_COMMON_COMM_COLLECTIVE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace baton::testing_collective {

// Three members' buffers whose sum depends on the order: in member order they sum to 0 in
// element 0, in another order to 1.
inline constexpr float kOrderSensitive[3][2] = {{1.0f, 0.1f}, {1e8f, 0.2f}, {-1e8f, 0.3f}};

// Every member's result (out[m], two elements) is the ordered sum of kOrderSensitive, bit
// for bit.
inline void ExpectOrderedSumOfThree(const std::vector<std::vector<float>>& out) {
  const auto& v = kOrderSensitive;
  const float want0 = (v[0][0] + v[1][0]) + v[2][0];
  const float want1 = (v[0][1] + v[1][1]) + v[2][1];
  ASSERT_NE(want0, v[0][0] + (v[1][0] + v[2][0])) << "the data cannot tell";
  ASSERT_EQ(out.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(out[r].size(), 2u);
    EXPECT_EQ(std::memcmp(&out[r][0], &want0, sizeof(float)), 0) << "member " << r;
    EXPECT_EQ(std::memcmp(&out[r][1], &want1, sizeof(float)), 0) << "member " << r;
  }
}

// Member r's element i for the larger tests: magnitudes spread over four decades.
inline float SpreadValue(int r, int64_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r)) *
         (i % 5 == 0 ? 1e4f : 1.0f);
}

// Fast mode's contract on SpreadValue data of `members` x `n`: every member has the same
// bits, each element within 4 * members * epsilon * (the largest partial magnitude) of the
// ordered sum. Returns how many elements differ from the ordered sum.
inline int64_t ExpectFastSum(const std::vector<std::vector<float>>& out, int members, int64_t n) {
  for (int r = 1; r < members; ++r) {
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), n * sizeof(float)), 0) << "member " << r;
  }
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    float ordered = SpreadValue(0, i);
    float scale = std::fabs(ordered);
    for (int r = 1; r < members; ++r) {
      ordered += SpreadValue(r, i);
      scale = std::max(scale, std::fabs(ordered) + std::fabs(SpreadValue(r, i)));
    }
    EXPECT_LE(std::fabs(out[0][i] - ordered),
              4 * members * std::numeric_limits<float>::epsilon() * scale)
        << i;
    differ += out[0][i] != ordered;
  }
  return differ;
}

}  // namespace baton::testing_collective

#endif  // BATON_COMMON_COMM_COLLECTIVE_TEST_UTIL_H_
