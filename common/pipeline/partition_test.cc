#include "common/pipeline/partition.h"

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

TEST(PartitionTest, RefusesMoreChunksThanBlocks) {
  auto r = PartitionBlocks(Costs({1, 1}), 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("2 blocks, fewer than the 3"), absl::string_view::npos)
      << r.status();
}

}  // namespace
}  // namespace baton
