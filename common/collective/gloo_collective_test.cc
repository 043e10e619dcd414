#include "common/collective/gloo_collective.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// Connects `size` members through one in-process store, each on its own thread, and runs
// body(rank, member) there.
template <typename F>
void OnEveryMember(int size, F body, GlooOptions options = {}) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<GlooCollective>> c =
          GlooCollective::Connect(store, r, size, options);
      ASSERT_TRUE(c.ok()) << c.status();
      body(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(GlooCollectiveTest, SumsInMemberOrderOverTcpAndEveryMemberGetsTheSameBits) {
  // Float addition is not associative: in member order these sum to 0, otherwise to 1.
  const float values[3][2] = {{1.0f, 0.1f}, {1e8f, 0.2f}, {-1e8f, 0.3f}};
  const float want0 = (values[0][0] + values[1][0]) + values[2][0];
  const float want1 = (values[0][1] + values[1][1]) + values[2][1];
  ASSERT_NE(want0, values[0][0] + (values[1][0] + values[2][0])) << "the data cannot tell";
  std::vector<std::vector<float>> out(3);
  OnEveryMember(3, [&](int r, Collective& c) {
    std::vector<float> data(values[r], values[r] + 2);
    ASSERT_TRUE(c.AllReduceSum(data.data(), 2, Soon()).ok());
    out[r] = data;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(out[r].size(), 2u);
    EXPECT_EQ(std::memcmp(&out[r][0], &want0, sizeof(float)), 0) << "member " << r;
    EXPECT_EQ(std::memcmp(&out[r][1], &want1, sizeof(float)), 0) << "member " << r;
  }
}

// Fast mode: Gloo's ring. Every member gets the same bits, within a stated tolerance of the
// ordered sum (a few float roundings of the largest partial sum per element).
TEST(GlooCollectiveTest, FastModeRunsTheRingSameBitsEverywhereWithinToleranceOfTheOrderedSum) {
  constexpr int kSize = 3;
  constexpr int64_t kN = 100003;
  auto value = [](int r, int64_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r)) *
           (i % 5 == 0 ? 1e4f : 1.0f);
  };
  GlooOptions o;
  o.ordered = false;
  std::vector<std::vector<float>> out(kSize);
  OnEveryMember(
      kSize,
      [&](int r, Collective& c) {
        EXPECT_FALSE(c.ordered());
        std::vector<float> data(kN);
        for (int64_t i = 0; i < kN; ++i) data[i] = value(r, i);
        ASSERT_TRUE(c.AllReduceSum(data.data(), kN, Soon()).ok());
        out[r] = data;
      },
      o);
  for (int r = 1; r < kSize; ++r) {
    ASSERT_EQ(std::memcmp(out[r].data(), out[0].data(), kN * sizeof(float)), 0) << "member " << r;
  }
  for (int64_t i = 0; i < kN; ++i) {
    float ordered = value(0, i);
    float scale = std::fabs(ordered);
    for (int r = 1; r < kSize; ++r) {
      ordered += value(r, i);
      scale = std::max(scale, std::fabs(ordered) + std::fabs(value(r, i)));
    }
    ASSERT_LE(std::fabs(out[0][i] - ordered), 4 * kSize * std::numeric_limits<float>::epsilon() * scale)
        << i;
  }
}

TEST(GlooCollectiveTest, RoundsOfDifferentSizesIncludingLargeOnes) {
  constexpr int kSize = 2;
  OnEveryMember(kSize, [&](int r, Collective& c) {
    for (int64_t n : {1, 7, 1 << 20, 3}) {
      std::vector<float> data(static_cast<size_t>(n), static_cast<float>(r + 1));
      ASSERT_TRUE(c.AllReduceSum(data.data(), n, Soon()).ok()) << n;
      for (float v : data) ASSERT_EQ(v, 3.0f) << n;
    }
  });
}

TEST(GlooCollectiveTest, AMemberThatNeverComesEndsTheJoinAtItsTimeout) {
  gloo::rendezvous::HashStore store;
  GlooOptions o;
  o.connect_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GlooCollective>> c = GlooCollective::Connect(store, 0, 2, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("member 0 of 2"), std::string::npos) << c.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(GlooCollectiveTest, AMemberThatSkipsACollectiveEndsItAtTheDeadline) {
  std::vector<absl::Status> got(2);
  OnEveryMember(2, [&](int r, Collective& c) {
    if (r == 1) {
      absl::SleepFor(absl::Seconds(2));  // stays connected, never calls
      return;
    }
    float x = 1;
    const absl::Time start = absl::Now();
    got[0] = c.AllReduceSum(&x, 1, absl::Now() + absl::Milliseconds(300));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    // The group is out of step: later calls fail at once.
    got[1] = c.AllReduceSum(&x, 1, Soon());
  });
  EXPECT_EQ(got[0].code(), absl::StatusCode::kDeadlineExceeded) << got[0];
  EXPECT_EQ(got[1].code(), absl::StatusCode::kAborted) << got[1];
}

TEST(GlooCollectiveTest, AbortFailsLaterCallsAtOnceWithTheReason) {
  OnEveryMember(1, [&](int, Collective& c) {
    c.Abort(absl::UnavailableError("replica 0's worker is shutting down"));
    float x = 1;
    absl::Status s = c.AllReduceSum(&x, 1, Soon());
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
    EXPECT_NE(s.message().find("shutting down"), std::string::npos) << s;
  });
}

}  // namespace
}  // namespace baton
