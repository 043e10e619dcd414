#include "common/optim/optimizer_shards.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "gtest/gtest.h"

namespace baton {
namespace {

using Ints = std::vector<int64_t>;

ReduceLayout Plan(const std::vector<Ints>& groups, int64_t bucket_bytes, int members, bool shard,
                  const std::vector<bool>& pinned = {}) {
  absl::StatusOr<ReduceLayout> l = PlanReduceLayout(groups, bucket_bytes, members, shard, pinned);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : ReduceLayout();
}

// Every parameter in exactly one bucket, in order; counts lay each member's run out in member
// order; the owned totals add up.
void ExpectConsistent(const ReduceLayout& l, const std::vector<Ints>& groups) {
  std::vector<int64_t> sizes;
  std::vector<int> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t s : groups[g]) {
      sizes.push_back(s);
      group_of.push_back(static_cast<int>(g));
    }
  }
  int next = 0;
  std::vector<int64_t> owned(l.members, 0);
  for (const GradBucket& b : l.buckets) {
    int64_t floats = 0;
    int last_owner = 0;
    std::vector<int64_t> counts(l.members, 0);
    std::vector<int> sorted = b.params;  // a consecutive range, whatever its layout
    std::sort(sorted.begin(), sorted.end());
    for (int p : sorted) EXPECT_EQ(p, next++);
    for (int p : b.params) {
      EXPECT_EQ(group_of[p], b.group);
      floats += sizes[p];
      EXPECT_GE(l.owner[p], last_owner) << "runs in member order";
      last_owner = l.owner[p];
      counts[l.owner[p]] += sizes[p];
      owned[l.owner[p]] += sizes[p];
    }
    EXPECT_EQ(b.floats, floats);
    if (l.sharded) {
      EXPECT_EQ(b.counts, counts);
    } else {
      EXPECT_TRUE(b.counts.empty());
    }
  }
  EXPECT_EQ(next, static_cast<int>(sizes.size()));
  EXPECT_EQ(l.owned_floats, owned);
}

TEST(ReduceLayoutTest, BucketsFillInOrderAndNeverSpanGroups) {
  const std::vector<Ints> groups = {{3, 3, 10, 1}, {2, 2}};
  const ReduceLayout l = Plan(groups, /*bucket_bytes=*/6 * 4, 1, false);
  ASSERT_EQ(l.buckets.size(), 4u);
  EXPECT_EQ(l.buckets[0].params, (std::vector<int>{0, 1}));
  EXPECT_EQ(l.buckets[1].params, (std::vector<int>{2}));  // larger than a bucket: alone
  EXPECT_EQ(l.buckets[2].params, (std::vector<int>{3}));  // the group ends
  EXPECT_EQ(l.buckets[3].params, (std::vector<int>{4, 5}));
  EXPECT_EQ(l.buckets[3].group, 1);
  EXPECT_EQ(l.owned_floats, (Ints{21}));
  ExpectConsistent(l, groups);
}

TEST(ReduceLayoutTest, ShardingKeepsTheBucketsAndSplitsEachIntoRuns) {
  const std::vector<Ints> groups = {{4, 4, 4, 4, 4, 4, 4, 4}};
  const ReduceLayout plain = Plan(groups, 16 * 4, 1, false);
  const ReduceLayout l = Plan(groups, 16 * 4, 4, true);
  ASSERT_EQ(l.buckets.size(), plain.buckets.size());
  for (size_t b = 0; b < l.buckets.size(); ++b) {
    EXPECT_EQ(l.buckets[b].params, plain.buckets[b].params);
    EXPECT_EQ(l.buckets[b].counts, (Ints{4, 4, 4, 4}));
  }
  EXPECT_EQ(l.owned_floats, (Ints{8, 8, 8, 8}));
  ExpectConsistent(l, groups);
}

TEST(ReduceLayoutTest, ALoneParameterGoesToTheLeastLoadedMember) {
  // Bucket 1 is {6, 2}: member 0 takes the 6 and member 1 the 2 (a 6/2 split costs less
  // than 8/0); bucket 2 is a lone 7, which member 1 takes (2 + 7 beats 6 + 7).
  const std::vector<Ints> groups = {{6, 2, 7}};
  const ReduceLayout l = Plan(groups, 8 * 4, 2, true);
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].counts, (Ints{6, 2}));
  EXPECT_EQ(l.buckets[1].counts, (Ints{0, 7}));
  EXPECT_EQ(l.owner, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(l.owned_floats, (Ints{6, 9}));
  ExpectConsistent(l, groups);
}

TEST(ReduceLayoutTest, APinnedParameterIsMemberZerosWhateverItsLoad) {
  // Ties give the earlier members more.
  EXPECT_EQ(Plan({{5, 5}, {9}}, 5 * 4, 2, true).owner, (std::vector<int>{0, 1, 0}));
  // Without the pin, the last bucket's lone parameter goes to member 1.
  const ReduceLayout unpinned = Plan({{9, 1}, {9}}, 40 * 4, 2, true);
  EXPECT_EQ(unpinned.owner, (std::vector<int>{0, 1, 1}));
  const ReduceLayout pinned = Plan({{9, 1}, {9}}, 40 * 4, 2, true, {false, false, true});
  // Counted against member 0 from the start, the pinned 9 sends the first bucket to
  // member 1: 9 and 10.
  EXPECT_EQ(pinned.owner, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(pinned.owned_floats, (Ints{9, 10}));
  // A pinned parameter leads its bucket's layout, so it takes nothing else to member 0:
  // the others balance around it.
  const ReduceLayout late = Plan({{3, 3, 3}}, 40 * 4, 3, true, {false, true, false});
  ASSERT_EQ(late.buckets.size(), 1u);
  EXPECT_EQ(late.buckets[0].params, (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(late.buckets[0].counts, (Ints{3, 3, 3}));
  EXPECT_EQ(late.owner, (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(late.owned_floats, (Ints{3, 3, 3}));
  ExpectConsistent(late, {{3, 3, 3}});
  // Unsharded, pins change nothing.
  EXPECT_EQ(Plan({{3, 3, 3}}, 40 * 4, 1, false, {false, true, false}).buckets[0].params,
            (std::vector<int>{0, 1, 2}));
}

TEST(ReduceLayoutTest, ManyParametersBalanceWithinTheLargestOne) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> size(1, 1000);
  std::vector<Ints> groups(3);
  for (Ints& g : groups) {
    for (int i = 0; i < 40; ++i) g.push_back(size(rng));
  }
  for (int members : {2, 3, 4, 8}) {
    const ReduceLayout l = Plan(groups, 4000 * 4, members, true);
    ExpectConsistent(l, groups);
    const int64_t total = std::accumulate(l.owned_floats.begin(), l.owned_floats.end(), int64_t{0});
    for (int64_t owned : l.owned_floats) {
      EXPECT_LE(owned, total / members + 1000) << members << " members";
      EXPECT_GE(owned, total / members - 1000) << members << " members";
    }
    // The same inputs, the same layout: every member computes it alone.
    const ReduceLayout again = Plan(groups, 4000 * 4, members, true);
    EXPECT_EQ(again.owner, l.owner);
  }
}

TEST(ReduceLayoutTest, BadInputIsRefused) {
  EXPECT_EQ(PlanReduceLayout({{3, 0}}, 64, 2, true, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanReduceLayout({{3}}, 64, 2, true, {true, false}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanReduceLayout({{3}}, 0, 2, true, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanReduceLayout({{3}}, 64, 0, true, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
