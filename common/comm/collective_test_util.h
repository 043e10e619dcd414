// Data and checks the engines' tests share (collective.h's contract). Include from
// *_test.cc only.
#ifndef BATON_COMMON_COMM_COLLECTIVE_TEST_UTIL_H_
#define BATON_COMMON_COMM_COLLECTIVE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/comm/collective.h"
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

// Runs body(rank, member) on every member of a new group of `size`, one thread each, and
// returns once all are done: how an engine's test lends its group to the checks below.
using GroupRunner =
    std::function<void(int size, const std::function<void(int, Collective&)>& body)>;

// Shard layouts for a group of `size`: equal, unequal with zeros, all empty, one member
// holding everything, and one large enough to be sent in pieces.
inline std::vector<std::vector<int64_t>> ShardCountCases(int size) {
  std::vector<std::vector<int64_t>> cases;
  cases.emplace_back(size, 5);
  std::vector<int64_t> uneven;
  for (int m = 0; m < size; ++m) uneven.push_back(m % 3 == 1 ? 0 : 3 + 4 * m);
  cases.push_back(uneven);
  cases.emplace_back(size, 0);
  std::vector<int64_t> last(size, 0);
  last.back() = 11;
  cases.push_back(last);
  std::vector<int64_t> large;
  for (int m = 0; m < size; ++m) large.push_back(m == 1 ? 0 : 40000 + 977 * m);
  cases.push_back(large);
  return cases;
}

// Member r's buffer for a sharded case: magnitudes over eight decades, so that the sum of
// most elements depends on the order of the additions.
inline std::vector<float> ShardedInput(int r, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed * 131u + static_cast<uint32_t>(r));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> decade(0, 8);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = unit(gen) * std::pow(10.0f, static_cast<float>(decade(gen)));
  return x;
}

inline bool SameBits(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// The sharded operations' contract (collective.h) in ordered mode, for groups of 1 to 4
// and every layout of ShardCountCases: ReduceScatterSum leaves in this member's shard the
// bits AllReduceSum leaves there (which are the ordered sum); AllGather of a shard-wise
// buffer gives every member every shard; ReduceScatterSum then AllGather equals
// AllReduceSum bit for bit.
inline void ExpectShardedOpsMatchAllReduce(const GroupRunner& run) {
  for (int size = 1; size <= 4; ++size) {
    const std::vector<std::vector<int64_t>> cases = ShardCountCases(size);
    run(size, [&](int r, Collective& c) {
      ASSERT_TRUE(c.ordered());
      for (size_t k = 0; k < cases.size(); ++k) {
        const std::vector<int64_t>& counts = cases[k];
        std::vector<int64_t> off(counts.size() + 1, 0);
        for (size_t m = 0; m < counts.size(); ++m) off[m + 1] = off[m] + counts[m];
        const int64_t n = off.back();
        const uint32_t seed = static_cast<uint32_t>(size * 100 + k);
        SCOPED_TRACE(testing::Message()
                     << "group of " << size << ", layout " << k << ", member " << r);
        // The ordered sum, computed here from every member's input.
        std::vector<float> want = ShardedInput(0, n, seed);
        for (int m = 1; m < size; ++m) {
          const std::vector<float> x = ShardedInput(m, n, seed);
          for (int64_t i = 0; i < n; ++i) want[i] += x[i];
        }
        std::vector<float> all = ShardedInput(r, n, seed);
        ASSERT_TRUE(c.AllReduceSum(all.data(), n, absl::Now() + absl::Seconds(60)).ok());
        ASSERT_TRUE(SameBits(all.data(), want.data(), n)) << "all-reduce is not the ordered sum";

        std::vector<float> sharded = ShardedInput(r, n, seed);
        absl::Status s =
            c.ReduceScatterSum(sharded.data(), counts, absl::Now() + absl::Seconds(60));
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_TRUE(SameBits(sharded.data() + off[r], all.data() + off[r], counts[r]))
            << "reduce-scatter's shard differs from all-reduce's";

        s = c.AllGather(sharded.data(), counts, absl::Now() + absl::Seconds(60));
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_TRUE(SameBits(sharded.data(), all.data(), n))
            << "reduce-scatter then all-gather differs from all-reduce";

        // All-gather alone: member m's shard holds m's values, the rest is noise.
        std::vector<float> gathered(static_cast<size_t>(n), std::nanf(""));
        for (int64_t i = off[r]; i < off[r + 1]; ++i)
          gathered[i] = static_cast<float>(r * 1000 + i);
        s = c.AllGather(gathered.data(), counts, absl::Now() + absl::Seconds(60));
        ASSERT_TRUE(s.ok()) << s;
        for (int m = 0; m < size; ++m) {
          for (int64_t i = off[m]; i < off[m + 1]; ++i) {
            ASSERT_EQ(gathered[i], static_cast<float>(m * 1000 + i))
                << "shard " << m << " at " << i;
          }
        }
      }
    });
  }
}

// Counts the call can refuse on its own: INVALID_ARGUMENT, and the group is still usable.
inline void ExpectBadCountsAreRefused(const GroupRunner& run) {
  run(2, [&](int r, Collective& c) {
    float x[4] = {1, 2, 3, 4};
    const std::vector<int64_t> too_few = {4};
    const std::vector<int64_t> negative = {5, -1};
    const absl::Time soon = absl::Now() + absl::Seconds(60);
    for (const auto* counts : {&too_few, &negative}) {
      absl::Status s = c.ReduceScatterSum(x, *counts, soon);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      s = c.AllGather(x, *counts, soon);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    }
    const std::vector<int64_t> fine = {1, 3};
    absl::Status s = c.ReduceScatterSum(x, fine, soon);
    EXPECT_TRUE(s.ok()) << "member " << r << ": " << s;
  });
}

// Members passing different counts fail the group, each with an error (and none hangs).
inline void ExpectMismatchedCountsFailTheGroup(const GroupRunner& run, bool gather) {
  std::vector<absl::Status> got(3), agreed(3);
  run(3, [&](int r, Collective& c) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    auto call = [&](const std::vector<int64_t>& counts) {
      std::vector<float> data(6, 1.0f);
      return gather ? c.AllGather(data.data(), counts, deadline)
                    : c.ReduceScatterSum(data.data(), counts, deadline);
    };
    // Counts the group agreed on (twice: the second call skips the check) do not stop a
    // new set that differs from being checked.
    agreed[r] = call({2, 2, 2});
    if (agreed[r].ok()) agreed[r] = call({2, 2, 2});
    got[r] = call(r == 2 ? std::vector<int64_t>{2, 3, 1} : std::vector<int64_t>{1, 2, 3});
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(agreed[r].ok()) << "member " << r << ": " << agreed[r];
  int invalid = 0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(got[r].ok()) << "member " << r;
    invalid += got[r].code() == absl::StatusCode::kInvalidArgument;
  }
  EXPECT_GT(invalid, 0) << "no member was told the counts differ";
}

}  // namespace baton::testing_collective

#endif  // BATON_COMMON_COMM_COLLECTIVE_TEST_UTIL_H_
