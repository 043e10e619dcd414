#include "common/collective/gloo_collective.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/comm/collective_test_util.h"
#include "common/core/mutex.h"
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

// A member whose process ends closes its sockets. Gloo writes to its peers with writev; a
// write that lands after the peer's FIN is answered by a reset, and the next one raises
// SIGPIPE, whose default action ends the writing process without a word (so a worker
// whose replica's worker was killed died too, silently). The survivors must instead get a
// status naming the loss and live on to report it. Which write meets the closed socket is
// a race, so each round ends the member after a different number of collectives; before
// SIGPIPE was ignored, most runs of this test died of it.
TEST(GlooCollectiveTest, AMemberWhoseProcessEndsFailsItsPeersCallsAndTheyLiveOn) {
  constexpr int64_t kN = 1000;
  for (int round = 0; round < 200; ++round) {
    gloo::rendezvous::HashStore store;
    absl::Status member1_status;
    std::thread member1([&] {
      absl::StatusOr<std::unique_ptr<GlooCollective>> c = GlooCollective::Connect(store, 1, 2);
      if (!c.ok()) {
        member1_status = c.status();
        return;
      }
      std::vector<float> d(kN, 1.0f);
      for (int k = 0; k < round % 7 && member1_status.ok(); ++k) {
        member1_status = (*c)->AllReduceSum(d.data(), kN, Soon());
      }
      c->reset();  // as its process ends: every socket closed, mid-group
    });
    absl::StatusOr<std::unique_ptr<GlooCollective>> c = GlooCollective::Connect(store, 0, 2);
    int calls = 0;
    std::vector<float> data(kN, 1.0f);
    absl::Status s = c.status();
    while (s.ok() && calls < 100) {
      s = (*c)->AllReduceSum(data.data(), kN, Soon());
      ++calls;
    }
    member1.join();
    if (!c.ok()) {  // member 1 ended before the group was whole (rounds without collectives)
      ASSERT_EQ(round % 7, 0) << c.status();
      ASSERT_NE(c.status().message().find("could not join its group"), std::string::npos)
          << c.status();
      continue;
    }
    ASSERT_TRUE(member1_status.ok()) << "round " << round << ": " << member1_status;
    ASSERT_FALSE(s.ok()) << "round " << round << ": 100 all-reduces with a member gone";
    ASSERT_GT(calls, round % 7) << "round " << round << ": failed while both members ran: " << s;
    ASSERT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
                s.code() == absl::StatusCode::kAborted)
        << "round " << round << ": " << s;
    ASSERT_NE(s.message().find("replica 0 of 2"), std::string::npos) << s;
  }
}

// Joining a group is what exposes a process to Gloo's writes, so joining makes SIGPIPE
// ignored; a handler the process installed itself is left in place.
TEST(GlooCollectiveTest, JoiningAGroupIgnoresSigpipeAndKeepsAHandlerTheProcessInstalled) {
  std::signal(SIGPIPE, SIG_DFL);
  OnEveryMember(1, [](int, Collective&) {});
  EXPECT_EQ(std::signal(SIGPIPE, SIG_DFL), SIG_IGN) << "SIGPIPE still ends the process";

  static void (*const kOwn)(int) = [](int) {};
  std::signal(SIGPIPE, kOwn);
  OnEveryMember(1, [](int, Collective&) {});
  EXPECT_EQ(std::signal(SIGPIPE, SIG_DFL), kOwn) << "the process's own handler was replaced";
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

// A fresh group per call, for the shared contract checks (collective_test_util.h).
void RunGroup(int size, const std::function<void(int, Collective&)>& body) {
  OnEveryMember(size, [&](int r, Collective& c) { body(r, c); });
}

TEST(GlooCollectiveTest, ShardedOpsMatchAllReduceBitForBit) {
  ExpectShardedOpsMatchAllReduce(RunGroup);
}

TEST(GlooCollectiveTest, BadShardCountsAreRefused) { ExpectBadCountsAreRefused(RunGroup); }

TEST(GlooCollectiveTest, MismatchedShardCountsFailEveryMember) {
  for (bool gather : {false, true}) {
    ExpectMismatchedCountsFailTheGroup(RunGroup, gather);
    // Every member sees every member's counts, so each is told which member differs.
    std::vector<absl::Status> got(2);
    RunGroup(2, [&](int r, Collective& c) {
      const std::vector<int64_t> counts =
          r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
      float x[3] = {1, 2, 3};
      got[r] = gather ? c.AllGather(x, counts, Soon()) : c.ReduceScatterSum(x, counts, Soon());
      // The group is failed: a later call fails at once.
      const absl::Status later = c.AllReduceSum(x, 3, Never());
      EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
    });
    for (const absl::Status& s : got) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("passes shard counts"), std::string::npos) << s;
    }
  }
}

// Fast mode changes AllReduceSum only: the sharded operations still give the ordered bits.
TEST(GlooCollectiveTest, FastModeReduceScatterStillGivesTheOrderedShard) {
  GlooOptions o;
  o.ordered = false;
  std::vector<std::vector<float>> out(3);
  OnEveryMember(
      3,
      [&](int r, Collective& c) {
        // Member r's values in element 0 of each shard of one float.
        std::vector<float> data = {kOrderSensitive[r][0], kOrderSensitive[r][0],
                                   kOrderSensitive[r][0]};
        const std::vector<int64_t> counts = {1, 1, 1};
        ASSERT_TRUE(c.ReduceScatterSum(data.data(), counts, Soon()).ok());
        ASSERT_TRUE(c.AllGather(data.data(), counts, Soon()).ok());
        out[r] = data;
      },
      o);
  const float want = (kOrderSensitive[0][0] + kOrderSensitive[1][0]) + kOrderSensitive[2][0];
  for (int r = 0; r < 3; ++r) {
    for (float v : out[r]) EXPECT_EQ(std::memcmp(&v, &want, sizeof v), 0) << "member " << r;
  }
}

TEST(GlooCollectiveTest, AMemberThatSkipsAShardedCallEndsItAtTheDeadline) {
  for (bool gather : {false, true}) {
    std::vector<absl::Status> got(2);
    std::promise<void> finished;
    std::shared_future<void> member0_done = finished.get_future().share();
    OnEveryMember(2, [&](int r, Collective& c) {
      if (r == 1) {
        member0_done.wait();  // stays connected, never calls
        return;
      }
      float x[2] = {1, 2};
      const std::vector<int64_t> counts = {1, 1};
      const absl::Time deadline = absl::Now() + absl::Milliseconds(300);
      got[0] = gather ? c.AllGather(x, counts, deadline) : c.ReduceScatterSum(x, counts, deadline);
      got[1] = c.ReduceScatterSum(x, counts, Never());
      finished.set_value();
    });
    EXPECT_EQ(got[0].code(), absl::StatusCode::kDeadlineExceeded) << got[0];
    EXPECT_EQ(got[1].code(), absl::StatusCode::kAborted) << got[1];
  }
}

TEST(GlooCollectiveTest, AbortFailsLaterShardedCallsAtOnceWithTheReason) {
  Mutex mu;
  std::condition_variable changed;
  int joined = 0;
  OnEveryMember(2, [&](int, Collective& c) {
    // Both members have joined before either aborts: an abort closes the member's
    // connections, which fails a join the other member may still be finishing. (The wait's
    // deadline only bounds a hang: a member whose join failed never gets here.)
    bool both = false;
    {
      MutexLock lock(mu);
      ++joined;
      changed.notify_all();
      both = changed.wait_until(lock.native(), absl::ToChronoTime(Soon()),
                                [&] { return joined == 2; });
    }
    ASSERT_TRUE(both) << "the other member did not join";
    c.Abort(absl::UnavailableError("replica 0's worker is shutting down"));
    float x[2] = {1, 2};
    const std::vector<int64_t> counts = {1, 1};
    for (const absl::Status& s :
         {c.ReduceScatterSum(x, counts, Never()), c.AllGather(x, counts, Never())}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
      EXPECT_NE(s.message().find("shutting down"), std::string::npos) << s;
    }
  });
}

}  // namespace
}  // namespace baton
