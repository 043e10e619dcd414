#include "common/plan/partition.h"

#include <algorithm>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace baton {
namespace {

std::vector<BlockInfo> Costs(const std::vector<int64_t>& flops) {
  std::vector<BlockInfo> out;
  for (size_t i = 0; i < flops.size(); ++i) out.push_back({std::to_string(i), 0, flops[i]});
  return out;
}

std::vector<std::pair<int, int>> Ranges(const std::vector<BlockRange>& r) {
  std::vector<std::pair<int, int>> out;
  for (const BlockRange& b : r) out.emplace_back(b.first, b.last);
  return out;
}

TEST(PartitionTest, BalancesTheLargestChunk) {
  // Costs (flops + 1): 1, 101, 101, 101, 101, 51. Best max for 3 chunks is 202.
  auto r = PartitionBlocks(Costs({0, 100, 100, 100, 100, 50}), 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Ranges(*r), (std::vector<std::pair<int, int>>{{0, 2}, {2, 4}, {4, 6}}));
}

TEST(PartitionTest, OneBlockPerChunkWhenCountsMatch) {
  auto r = PartitionBlocks(Costs({5, 1, 9, 2}), 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Ranges(*r), (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
}

TEST(PartitionTest, CoversEveryBlockContiguously) {
  for (int chunks = 1; chunks <= 7; ++chunks) {
    auto r = PartitionBlocks(Costs({3, 1, 4, 1, 5, 9, 2}), chunks);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(static_cast<int>(r->size()), chunks);
    int next = 0;
    for (const BlockRange& b : *r) {
      EXPECT_EQ(b.first, next);
      EXPECT_GT(b.size(), 0);
      next = b.last;
    }
    EXPECT_EQ(next, 7);
  }
}

// The plain O(chunks * blocks^2) dynamic program, trying every start of the last chunk and
// keeping the earliest on ties: what PartitionBlocks must agree with, cut for cut.
std::vector<std::pair<int, int>> Brute(const std::vector<int64_t>& flops, int chunks) {
  const int n = static_cast<int>(flops.size());
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + flops[i] + 1;
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(chunks + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> cut(chunks + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= chunks; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        const int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<std::pair<int, int>> out(chunks);
  int end = n;
  for (int k = chunks; k >= 1; --k) {
    out[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return out;
}

TEST(PartitionTest, AgreesWithTheQuadraticProgramIncludingTies) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    // Few distinct costs, so that ties are common.
    const int64_t spread = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 4 : 1000;
    std::vector<int64_t> flops(n);
    for (int64_t& f : flops) f = static_cast<int64_t>(rng() % spread);
    const int chunks = 1 + static_cast<int>(rng() % n);
    auto r = PartitionBlocks(Costs(flops), chunks);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(Ranges(*r), Brute(flops, chunks)) << "trial " << trial;
  }
}

TEST(PartitionTest, DeepModelsPartitionInLinearTime) {
  // 200k blocks into 16 chunks: 3.2M steps, where the quadratic program needed 6.4e11.
  std::vector<int64_t> flops(200000);
  for (size_t i = 0; i < flops.size(); ++i) flops[i] = static_cast<int64_t>(i % 7) * 100;
  auto r = PartitionBlocks(Costs(flops), 16);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 16u);
  EXPECT_EQ(r->front().first, 0);
  EXPECT_EQ(r->back().last, 200000);
}

TEST(PartitionTest, RefusesMoreChunksThanBlocks) {
  auto r = PartitionBlocks(Costs({1, 1}), 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("2 blocks, fewer than the 3"), absl::string_view::npos)
      << r.status();
}

// pipeline.partition: a given split is taken as written; without one, the balanced split.
TEST(PartitionTest, AGivenSplitIsTakenAsWrittenAndCheckedNamingTheField) {
  const std::vector<BlockInfo> blocks = Costs({5, 5, 5, 5, 5});
  auto given = StageBlocks(blocks, 3, {1, 3, 1});
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(Ranges(*given), (std::vector<std::pair<int, int>>{{0, 1}, {1, 4}, {4, 5}}));
  EXPECT_EQ(PartitionSizes(*given), (std::vector<int>{1, 3, 1}));
  auto balanced = StageBlocks(blocks, 3, {});
  ASSERT_TRUE(balanced.ok());
  EXPECT_EQ(Ranges(*balanced), Ranges(*PartitionBlocks(blocks, 3)));
  struct Bad {
    std::vector<int> sizes;
    std::string expect;
  };
  for (const Bad& b : {Bad{{2, 3}, "pipeline.partition: 2 entries for 3 pipeline chunks"},
                       Bad{{2, 0, 3}, "pipeline.partition[1]: 0 blocks; every chunk needs at least 1"},
                       Bad{{2, 2, 2}, "pipeline.partition: the entries add up to 6 blocks, but "
                                      "the model has 5"}}) {
    auto r = StageBlocks(blocks, 3, b.sizes);
    ASSERT_FALSE(r.ok()) << b.expect;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(b.expect), absl::string_view::npos) << r.status();
  }
}

}  // namespace
}  // namespace baton
