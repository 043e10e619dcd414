#include "common/collective/gloo_collective.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include "common/comm/collective_test_util.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using namespace testing_collective;  // NOLINT: the shared test data

// A deadline for calls expected to succeed (or to fail for another reason): it only bounds
// a hang. Never() is one a call must not wait for at all: ending with another status than
// DEADLINE_EXCEEDED proves it did not.
absl::Time Soon() { return absl::Now() + absl::Seconds(60); }
absl::Time Never() { return absl::Now() + absl::Minutes(10); }

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
  std::vector<std::vector<float>> out(3);
  OnEveryMember(3, [&](int r, Collective& c) {
    std::vector<float> data(kOrderSensitive[r], kOrderSensitive[r] + 2);
    ASSERT_TRUE(c.AllReduceSum(data.data(), 2, Soon()).ok());
    out[r] = data;
  });
  ExpectOrderedSumOfThree(out);
}

// Fast mode: Gloo's ring. Every member gets the same bits, within a stated tolerance of the
// ordered sum (a few float roundings of the largest partial sum per element).
TEST(GlooCollectiveTest, FastModeRunsTheRingSameBitsEverywhereWithinToleranceOfTheOrderedSum) {
  constexpr int kSize = 3;
  constexpr int64_t kN = 100003;
  GlooOptions o;
  o.ordered = false;
  std::vector<std::vector<float>> out(kSize);
  OnEveryMember(
      kSize,
      [&](int r, Collective& c) {
        EXPECT_FALSE(c.ordered());
        std::vector<float> data(kN);
        for (int64_t i = 0; i < kN; ++i) data[i] = SpreadValue(r, i);
        ASSERT_TRUE(c.AllReduceSum(data.data(), kN, Soon()).ok());
        out[r] = data;
      },
      o);
  EXPECT_GT(ExpectFastSum(out, kSize, kN), 0) << "the ring summed in member order everywhere";
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
  absl::StatusOr<std::unique_ptr<GlooCollective>> c = GlooCollective::Connect(store, 0, 2, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("member 0 of 2"), std::string::npos) << c.status();
}

TEST(GlooCollectiveTest, AMemberThatSkipsACollectiveEndsItAtTheDeadline) {
  std::vector<absl::Status> got(2);
  std::promise<void> finished;
  std::shared_future<void> member0_done = finished.get_future().share();
  OnEveryMember(2, [&](int r, Collective& c) {
    if (r == 1) {
      member0_done.wait();  // stays connected, never calls (until member 0 is done)
      return;
    }
    float x = 1;
    got[0] = c.AllReduceSum(&x, 1, absl::Now() + absl::Milliseconds(300));
    // The group is out of step: later calls fail at once (not at this deadline).
    got[1] = c.AllReduceSum(&x, 1, Never());
    finished.set_value();
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
