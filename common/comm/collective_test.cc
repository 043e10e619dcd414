#include <cstring>
#include <thread>
#include <vector>

#include "common/comm/collective_test_util.h"
#include "common/comm/inproc_collective.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using namespace testing_collective;  // NOLINT: the shared contract checks

// A deadline for calls expected to succeed (or to fail for another reason): it only bounds
// a hang, so no load makes a call miss it.
absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

// Runs body(rank) on one thread per member and joins them.
template <typename F>
void OnEveryMember(int size, F body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&body, r] { body(r); });
  for (std::thread& t : threads) t.join();
}

// Float addition is not associative: these three sum to 0 in member order and to 1 in
// others, so the test sees which order the engine used.
TEST(InProcessCollectiveTest, SumsInMemberOrderAndEveryMemberGetsTheSameBits) {
  const float values[3][2] = {{1.0f, 0.1f}, {1e8f, 0.2f}, {-1e8f, 0.3f}};
  const float want0 = (values[0][0] + values[1][0]) + values[2][0];
  const float want1 = (values[0][1] + values[1][1]) + values[2][1];
  ASSERT_NE(want0, values[0][0] + (values[1][0] + values[2][0])) << "the data cannot tell";
  InProcessGroup group(3);
  std::vector<std::vector<float>> out(3);
  OnEveryMember(3, [&](int r) {
    std::unique_ptr<Collective> c = group.Member(r);
    std::vector<float> data(values[r], values[r] + 2);
    ASSERT_TRUE(c->AllReduceSum(data.data(), 2, Soon()).ok());
    out[r] = data;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(std::memcmp(&out[r][0], &want0, sizeof(float)), 0) << "member " << r;
    EXPECT_EQ(std::memcmp(&out[r][1], &want1, sizeof(float)), 0) << "member " << r;
  }
}

TEST(InProcessCollectiveTest, ManyRoundsOfDifferentSizesStayMatched) {
  constexpr int kSize = 4;
  InProcessGroup group(kSize);
  OnEveryMember(kSize, [&](int r) {
    std::unique_ptr<Collective> c = group.Member(r);
    for (int round = 0; round < 50; ++round) {
      std::vector<float> data(1 + round % 7, static_cast<float>(r + round));
      ASSERT_TRUE(c->AllReduceSum(data.data(), static_cast<int64_t>(data.size()), Soon()).ok());
      // sum over members of (m + round)
      const float want = static_cast<float>(kSize * round + kSize * (kSize - 1) / 2);
      for (float v : data) ASSERT_EQ(v, want) << "round " << round;
    }
  });
}

TEST(InProcessCollectiveTest, AOneMemberGroupLeavesTheDataAsItIs) {
  InProcessGroup group(1);
  std::unique_ptr<Collective> c = group.Member(0);
  std::vector<float> data = {1.5f, -2.0f};
  ASSERT_TRUE(c->AllReduceSum(data.data(), 2, Soon()).ok());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f}));
}

TEST(InProcessCollectiveTest, AMissingMemberEndsTheCallAtTheDeadlineAndFailsTheGroup) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> a = group.Member(0);
  std::unique_ptr<Collective> b = group.Member(1);
  float x = 1;
  absl::Status s = a->AllReduceSum(&x, 1, absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("1 of 2 replicas had not joined"), std::string::npos) << s;
  // The late member does not wait for a group that has failed.
  s = b->AllReduceSum(&x, 1, Soon());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST(InProcessCollectiveTest, AbortWakesAWaitingMemberWithTheReason) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> a = group.Member(0);
  std::unique_ptr<Collective> b = group.Member(1);
  absl::Status waited;
  std::thread t([&] {
    float x = 1;
    waited = a->AllReduceSum(&x, 1, Soon());
  });
  // As a rule `a` waits by now; a call that starts after the abort fails the same way.
  absl::SleepFor(absl::Milliseconds(50));
  b->Abort(absl::UnavailableError("replica 1's stage 0 failed"));
  t.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("replica 1's stage 0 failed"), std::string::npos) << waited;
}

TEST(InProcessCollectiveTest, MembersPassingDifferentSizesFailTheGroup) {
  InProcessGroup group(2);
  std::vector<absl::Status> got(2);
  OnEveryMember(2, [&](int r) {
    std::unique_ptr<Collective> c = group.Member(r);
    std::vector<float> data(r == 0 ? 3 : 4, 1.0f);
    got[r] = c->AllReduceSum(data.data(), static_cast<int64_t>(data.size()), Soon());
  });
  EXPECT_FALSE(got[0].ok());
  EXPECT_FALSE(got[1].ok());
}

// A fresh in-process group per call, for the shared contract checks.
void RunGroup(int size, const std::function<void(int, Collective&)>& body) {
  InProcessGroup group(size);
  OnEveryMember(size, [&](int r) {
    std::unique_ptr<Collective> c = group.Member(r);
    body(r, *c);
  });
}

TEST(InProcessCollectiveTest, ShardedOpsMatchAllReduceBitForBit) {
  ExpectShardedOpsMatchAllReduce(RunGroup);
}

TEST(InProcessCollectiveTest, BadShardCountsAreRefused) { ExpectBadCountsAreRefused(RunGroup); }

TEST(InProcessCollectiveTest, MismatchedShardCountsFailTheGroup) {
  ExpectMismatchedCountsFailTheGroup(RunGroup, /*gather=*/false);
  ExpectMismatchedCountsFailTheGroup(RunGroup, /*gather=*/true);
}

TEST(InProcessCollectiveTest, MembersCallingDifferentCollectivesFailTheGroup) {
  InProcessGroup group(2);
  std::vector<absl::Status> got(2);
  OnEveryMember(2, [&](int r) {
    std::unique_ptr<Collective> c = group.Member(r);
    std::vector<float> data(4, 1.0f);
    const std::vector<int64_t> counts = {2, 2};
    got[r] = r == 0 ? c->AllReduceSum(data.data(), 4, Soon())
                    : c->ReduceScatterSum(data.data(), counts, Soon());
  });
  EXPECT_FALSE(got[0].ok());
  EXPECT_FALSE(got[1].ok());
}

TEST(InProcessCollectiveTest, AMissingMemberEndsAShardedCallAtTheDeadline) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> a = group.Member(0);
  std::unique_ptr<Collective> b = group.Member(1);
  float x[2] = {1, 2};
  const std::vector<int64_t> counts = {1, 1};
  absl::Status s = a->ReduceScatterSum(x, counts, absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("reduce-scatter"), std::string::npos) << s;
  s = b->AllGather(x, counts, Soon());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST(InProcessCollectiveTest, AbortWakesAMemberWaitingInAllGather) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> a = group.Member(0);
  std::unique_ptr<Collective> b = group.Member(1);
  absl::Status waited;
  std::thread t([&] {
    float x[2] = {1, 2};
    const std::vector<int64_t> counts = {1, 1};
    waited = a->AllGather(x, counts, Soon());
  });
  absl::SleepFor(absl::Milliseconds(50));
  b->Abort(absl::UnavailableError("replica 1's stage 0 failed"));
  t.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("replica 1's stage 0 failed"), std::string::npos) << waited;
}

}  // namespace
}  // namespace baton
