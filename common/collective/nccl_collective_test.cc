// The NCCL engine against the fake NCCL (common/nccl/nccl_fake_test_util.h): members are threads,
// each with its own FakeNccl so that faults can differ per member.
#include "common/collective/nccl_collective.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include "common/comm/collective_test_util.h"
#include "common/nccl/nccl_fake_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using namespace testing_collective;  // NOLINT: the shared test data

// A deadline for calls expected to succeed (or to fail for another reason): it only bounds
// a hang. Never() is one a call must not wait for at all: ending with another status than
// DEADLINE_EXCEEDED proves it did not.
absl::Time Soon() { return absl::Now() + absl::Seconds(60); }
absl::Time Never() { return absl::Now() + absl::Minutes(10); }

struct Member {
  std::unique_ptr<FakeNccl> api;
  std::unique_ptr<NcclCollective> collective;
  CudaStream compute = nullptr;  // with a compute stream only
};

// Joins `size` members (each on its own thread, as they must: a join completes only once all
// joined), with per-member fake options, and runs body(rank, member) on each thread.
template <typename F>
// With `compute_stream`, each member's engine follows a stream of its fake (Member::compute).
void OnEveryMember(int size, F body, bool ordered = true,
                   std::vector<FakeNcclOptions> faults = {}, bool compute_stream = false) {
  faults.resize(size);
  FakeNccl id_maker;
  NcclUniqueId id;
  ASSERT_EQ(id_maker.GetUniqueId(&id), NcclResult::kSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Member m;
      m.api = MakeFakeNccl(faults[r]);
      NcclCollectiveOptions o;
      o.api = m.api.get();
      o.id = id;
      o.ordered = ordered;
      o.init_timeout = absl::Seconds(60);  // the members' threads may start far apart
      if (compute_stream) {
        absl::StatusOr<CudaStream> compute = m.api->StreamCreate(0);
        ASSERT_TRUE(compute.ok()) << compute.status();
        m.compute = *compute;
        o.compute_stream = m.compute;
      }
      absl::StatusOr<std::unique_ptr<NcclCollective>> c = NcclCollective::Connect(r, size, o);
      ASSERT_TRUE(c.ok()) << c.status();
      m.collective = *std::move(c);
      EXPECT_EQ(m.collective->follows_compute_stream(), compute_stream);
      body(r, m);
      m.collective.reset();
      if (m.compute != nullptr) {
        EXPECT_TRUE(m.api->StreamDestroy(m.compute).ok());
      }
      const FakeNccl::Counts left = m.api->counts();
      EXPECT_EQ(left.comms, 0) << "member " << r;
      EXPECT_EQ(left.streams, 0) << "member " << r;
      EXPECT_EQ(left.events, 0) << "member " << r;
      EXPECT_EQ(left.buffers, 0) << "member " << r;
      // Never cudaFree while the communicator lives (it would wait for the whole device,
      // and so for NCCL kernels that may wait for a peer): stream-ordered frees only.
      EXPECT_EQ(left.device_wide_frees, 0) << "member " << r;
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(NcclCollectiveTest, OrderedModeSumsInMemberOrderAndEveryMemberGetsTheSameBits) {
  std::vector<std::vector<float>> out(3);
  OnEveryMember(3, [&](int r, Member& m) {
    EXPECT_TRUE(m.collective->ordered());
    EXPECT_STREQ(m.collective->engine(), "nccl");
    EXPECT_EQ(m.collective->device(), Device::kCpu);  // the fake's buffers are host memory
    std::vector<float> data(kOrderSensitive[r], kOrderSensitive[r] + 2);
    ASSERT_TRUE(m.collective->AllReduceSum(data.data(), 2, Soon()).ok());
    out[r] = data;
  });
  ExpectOrderedSumOfThree(out);
}

// An engine that follows the compute stream sums what that stream writes, even when the
// writes are still queued behind slow work there when AllReduceSum is called; the result is
// there when the call returns. Without following it, the same calls would sum the zeros.
TEST(NcclCollectiveTest, AnEngineThatFollowsTheComputeStreamSumsWhatTheStreamWrites) {
  constexpr int kRounds = 3;
  std::vector<std::vector<float>> out(3);
  OnEveryMember(
      3,
      [&](int r, Member& m) {
        // Each round's buffer outlives the stream's work on it, whatever the engine does.
        std::vector<std::vector<float>> data(kRounds, std::vector<float>(2, 0.0f));
        for (int round = 0; round < kRounds; ++round) {
          float* at = data[round].data();
          const float* src = kOrderSensitive[r];
          ASSERT_TRUE(m.api
                          ->LaunchHostFunc(m.compute,
                                           [at, src] {
                                             std::this_thread::sleep_for(
                                                 std::chrono::milliseconds(150));
                                             std::memcpy(at, src, 2 * sizeof(float));
                                           })
                          .ok());
          ASSERT_TRUE(m.collective->AllReduceSum(at, 2, Soon()).ok());
          out[r] = data[round];
          ExpectOrderedSumOfThree({out[r], out[r], out[r]});
        }
        std::promise<void> drained;
        ASSERT_TRUE(m.api->LaunchHostFunc(m.compute, [&drained] { drained.set_value(); }).ok());
        drained.get_future().wait();
      },
      /*ordered=*/true, /*faults=*/{}, /*compute_stream=*/true);
  ExpectOrderedSumOfThree(out);
}

// The ordered paths' gather buffer comes from the allocator of the engine's device (the
// fake's is the CPU's; a GPU's is the caching allocator its tensors share), grows with the
// largest call, and goes back to it with the engine. One member, so nothing else allocates
// meanwhile.
TEST(NcclCollectiveTest, TheGatherBufferComesFromTheDevicesAllocator) {
  const int64_t before = CpuAllocator()->Stats().bytes_in_use;
  OnEveryMember(1, [&](int, Member& m) {
    std::vector<float> data(1000, 1.5f);
    ASSERT_TRUE(m.collective->AllReduceSum(data.data(), 1000, Soon()).ok());
    EXPECT_EQ(data[999], 1.5f);
    EXPECT_GE(CpuAllocator()->Stats().bytes_in_use - before, 1000 * 4);
    data.resize(3000, 2.0f);
    const std::vector<int64_t> counts = {3000};
    ASSERT_TRUE(m.collective->ReduceScatterSum(data.data(), counts, Soon()).ok());
    EXPECT_EQ(data[2999], 2.0f);
    EXPECT_GE(CpuAllocator()->Stats().bytes_in_use - before, 3000 * 4);
  });
  EXPECT_EQ(CpuAllocator()->Stats().bytes_in_use, before);
}

TEST(NcclCollectiveTest, RoundsOfGrowingAndShrinkingSizesAllEqualTheOrderedSum) {
  constexpr int kSize = 2;
  OnEveryMember(kSize, [&](int r, Member& m) {
    for (int64_t n : {1, 7, 1 << 18, 3, 1 << 19}) {
      std::vector<float> data(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) data[i] = SpreadValue(r, i);
      ASSERT_TRUE(m.collective->AllReduceSum(data.data(), n, Soon()).ok()) << n;
      for (int64_t i = 0; i < n; ++i) {
        const float want = SpreadValue(0, i) + SpreadValue(1, i);
        ASSERT_EQ(std::memcmp(&data[i], &want, sizeof(float)), 0) << "n " << n << " i " << i;
      }
    }
  });
}

// Fast mode: one ncclAllReduce. The fake sums each chunk starting at another member, as a
// ring does, so the result differs from the ordered sum in the last places: same bits on
// every member, within a stated tolerance of the ordered sum.
TEST(NcclCollectiveTest, FastModeIsOneAllReduceSameBitsEverywhereWithinToleranceOfTheOrderedSum) {
  constexpr int kSize = 3;
  constexpr int64_t kN = 30011;
  std::vector<std::vector<float>> out(kSize);
  OnEveryMember(
      kSize,
      [&](int r, Member& m) {
        EXPECT_FALSE(m.collective->ordered());
        std::vector<float> data(kN);
        for (int64_t i = 0; i < kN; ++i) data[i] = SpreadValue(r, i);
        ASSERT_TRUE(m.collective->AllReduceSum(data.data(), kN, Soon()).ok());
        out[r] = data;
      },
      /*ordered=*/false);
  EXPECT_GT(ExpectFastSum(out, kSize, kN), 0)
      << "fast mode summed in member order everywhere: the test cannot tell";
}

TEST(NcclCollectiveTest, CallsThatTheCommunicatorTakesInProgressStillComplete) {
  std::vector<FakeNcclOptions> faults(2);
  for (FakeNcclOptions& f : faults) f.in_progress_polls = 3;
  OnEveryMember(
      2,
      [&](int r, Member& m) {
        float x[4] = {1, 2, 3, static_cast<float>(r)};
        ASSERT_TRUE(m.collective->AllReduceSum(x, 4, Soon()).ok());
        EXPECT_EQ(x[0], 2.0f);
        EXPECT_EQ(x[3], 1.0f);
      },
      true, faults);
}

TEST(NcclCollectiveTest, AMemberThatNeverJoinsEndsTheJoinAtItsTimeout) {
  FakeNccl api;
  NcclCollectiveOptions o;
  o.api = &api;
  ASSERT_EQ(api.GetUniqueId(&o.id), NcclResult::kSuccess);
  o.init_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<NcclCollective>> c = NcclCollective::Connect(0, 2, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("member 0 of 2"), std::string::npos) << c.status();
  EXPECT_EQ(api.counts().comms, 0);
  EXPECT_EQ(api.counts().aborted, 1);
}

TEST(NcclCollectiveTest, AFailedJoinIsUnavailableWithNcclsWords) {
  FakeNcclOptions f;
  f.init_fails = true;
  FakeNccl api(f);
  NcclCollectiveOptions o;
  o.api = &api;
  ASSERT_EQ(api.GetUniqueId(&o.id), NcclResult::kSuccess);
  absl::StatusOr<std::unique_ptr<NcclCollective>> c = NcclCollective::Connect(0, 1, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find("ncclSystemError"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("injected initialisation failure"), std::string::npos)
      << c.status();
}

TEST(NcclCollectiveTest, AMemberThatSkipsACollectiveEndsItAtTheDeadlineAndTheGroupStaysFailed) {
  std::vector<absl::Status> got(2);
  std::promise<void> finished;
  std::shared_future<void> member0_done = finished.get_future().share();
  OnEveryMember(2, [&](int r, Member& m) {
    if (r == 1) {
      member0_done.wait();  // joined, never calls (and stays until member 0 is done)
      return;
    }
    float x = 1;
    got[0] = m.collective->AllReduceSum(&x, 1, absl::Now() + absl::Milliseconds(300));
    // Failed at once with the first reason, not after waiting for this deadline.
    got[1] = m.collective->AllReduceSum(&x, 1, Never());
    finished.set_value();
  });
  EXPECT_EQ(got[0].code(), absl::StatusCode::kDeadlineExceeded) << got[0];
  EXPECT_NE(got[0].message().find("replica 0 of 2"), std::string::npos) << got[0];
  EXPECT_EQ(got[1].code(), absl::StatusCode::kDeadlineExceeded) << got[1];
  EXPECT_NE(got[1].message().find(got[0].message()), std::string::npos) << got[1];
}

TEST(NcclCollectiveTest, AnAsynchronousNcclErrorFailsTheCallNamingIt) {
  std::vector<FakeNcclOptions> faults(2);
  faults[0].async_error_at_op = 2;  // the second collective breaks member 0's communicator
  std::vector<absl::Status> got(2);
  OnEveryMember(
      2,
      [&](int r, Member& m) {
        float x = 1;
        ASSERT_TRUE(m.collective->AllReduceSum(&x, 1, Soon()).ok());
        // Member 0 fails on the error, not at a deadline; member 1 only has its deadline.
        got[r] = m.collective->AllReduceSum(
            &x, 1, r == 0 ? Never() : absl::Now() + absl::Seconds(1));
      },
      true, faults);
  EXPECT_EQ(got[0].code(), absl::StatusCode::kUnavailable) << got[0];
  EXPECT_NE(got[0].message().find("ncclRemoteError"), std::string::npos) << got[0];
  // Its peer hears nothing from NCCL: its deadline ends the call.
  EXPECT_EQ(got[1].code(), absl::StatusCode::kDeadlineExceeded) << got[1];
}

TEST(NcclCollectiveTest, AbortFromAnotherThreadEndsACallInFlightWithTheReason) {
  std::vector<absl::Status> got(2);
  std::promise<void> finished;
  std::shared_future<void> member0_done = finished.get_future().share();
  OnEveryMember(2, [&](int r, Member& m) {
    if (r == 1) {
      member0_done.wait();  // joined, never calls
      return;
    }
    // As a rule the call is in flight by the time the abort comes; an abort that came
    // first fails the call with the same reason.
    std::thread aborter([&] {
      absl::SleepFor(absl::Milliseconds(100));
      m.collective->Abort(absl::UnavailableError("rank 3 of the pipeline failed"));
    });
    float x = 1;
    got[0] = m.collective->AllReduceSum(&x, 1, Never());
    aborter.join();
    finished.set_value();
  });
  EXPECT_EQ(got[0].code(), absl::StatusCode::kUnavailable) << got[0];
  EXPECT_NE(got[0].message().find("rank 3 of the pipeline failed"), std::string::npos) << got[0];
}

// A call NCCL keeps "in progress" (a communicator that does not take the operation) ends
// on Abort with Abort's reason, not a made-up deadline.
TEST(NcclCollectiveTest, AbortWhileNcclHoldsACallInProgressEndsItWithTheReason) {
  std::vector<FakeNcclOptions> faults(2);
  for (FakeNcclOptions& f : faults) f.in_progress_polls = 1'000'000;
  std::vector<absl::Status> got(2);
  OnEveryMember(
      2,
      [&](int r, Member& m) {
        std::thread aborter([&] {
          absl::SleepFor(absl::Milliseconds(100));
          m.collective->Abort(absl::CancelledError("the job was cancelled"));
        });
        float x = 1;
        got[r] = m.collective->AllReduceSum(&x, 1, Never());
        aborter.join();
      },
      true, faults);
  for (const absl::Status& s : got) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_NE(s.message().find("the job was cancelled"), std::string::npos) << s;
  }
}

// A one-member group runs the same NCCL calls and kernel as a larger one (what one GPU can
// test: nccl_collective_real_test), and keeps its data.
TEST(NcclCollectiveTest, OneMemberGroupKeepsItsData) {
  OnEveryMember(1, [&](int, Member& m) {
    float x[2] = {1.5f, -2.0f};
    ASSERT_TRUE(m.collective->AllReduceSum(x, 2, Soon()).ok());
    EXPECT_EQ(x[0], 1.5f);
    EXPECT_EQ(x[1], -2.0f);
  });
}

// A fresh group per call, for the shared contract checks (collective_test_util.h).
void RunGroup(int size, const std::function<void(int, Collective&)>& body) {
  OnEveryMember(size, [&](int r, Member& m) { body(r, *m.collective); });
}

TEST(NcclCollectiveTest, ShardedOpsMatchAllReduceBitForBit) {
  ExpectShardedOpsMatchAllReduce(RunGroup);
}

TEST(NcclCollectiveTest, BadShardCountsAreRefused) { ExpectBadCountsAreRefused(RunGroup); }

TEST(NcclCollectiveTest, MismatchedShardCountsFailEveryMemberNamingTheCounts) {
  for (bool gather : {false, true}) {
    ExpectMismatchedCountsFailTheGroup(RunGroup, gather);
    std::vector<absl::Status> got(2);
    RunGroup(2, [&](int r, Collective& c) {
      const std::vector<int64_t> counts =
          r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
      float x[3] = {1, 2, 3};
      got[r] = gather ? c.AllGather(x, counts, Soon()) : c.ReduceScatterSum(x, counts, Soon());
      // The group is failed: a later call fails at once, with the same reason.
      const absl::Status later = c.AllReduceSum(x, 3, Never());
      EXPECT_EQ(later.code(), absl::StatusCode::kInvalidArgument) << later;
    });
    for (const absl::Status& s : got) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("passes shard counts"), std::string::npos) << s;
    }
  }
}

// Fast mode changes AllReduceSum only: the sharded operations still give the ordered bits.
TEST(NcclCollectiveTest, FastModeReduceScatterStillGivesTheOrderedShard) {
  std::vector<std::vector<float>> out(3);
  OnEveryMember(
      3,
      [&](int r, Member& m) {
        std::vector<float> data(3, kOrderSensitive[r][0]);
        const std::vector<int64_t> counts = {1, 1, 1};
        ASSERT_TRUE(m.collective->ReduceScatterSum(data.data(), counts, Soon()).ok());
        ASSERT_TRUE(m.collective->AllGather(data.data(), counts, Soon()).ok());
        out[r] = data;
      },
      /*ordered=*/false);
  const float want = (kOrderSensitive[0][0] + kOrderSensitive[1][0]) + kOrderSensitive[2][0];
  for (int r = 0; r < 3; ++r) {
    for (float v : out[r]) EXPECT_EQ(std::memcmp(&v, &want, sizeof v), 0) << "member " << r;
  }
}

// The grouped sends and receives end with a GroupEnd the communicator may take in progress.
TEST(NcclCollectiveTest, ShardedCallsThatTheCommunicatorTakesInProgressStillComplete) {
  std::vector<FakeNcclOptions> faults(3);
  for (FakeNcclOptions& f : faults) f.in_progress_polls = 3;
  OnEveryMember(
      3,
      [&](int r, Member& m) {
        const std::vector<int64_t> counts = {2, 0, 3};
        std::vector<float> x(5, static_cast<float>(r + 1));
        ASSERT_TRUE(m.collective->ReduceScatterSum(x.data(), counts, Soon()).ok());
        ASSERT_TRUE(m.collective->AllGather(x.data(), counts, Soon()).ok());
        for (float v : x) EXPECT_EQ(v, 6.0f) << "member " << r;
      },
      true, faults);
}

// With a compute stream, the sharded calls read what that stream writes (queued behind slow
// work when the call is made), as AllReduceSum does.
TEST(NcclCollectiveTest, ShardedCallsFollowTheComputeStream) {
  OnEveryMember(
      2,
      [&](int r, Member& m) {
        std::vector<float> data(4, 0.0f);
        float* at = data.data();
        const float value = static_cast<float>(r + 1);
        ASSERT_TRUE(m.api
                        ->LaunchHostFunc(m.compute,
                                         [at, value] {
                                           std::this_thread::sleep_for(
                                               std::chrono::milliseconds(150));
                                           std::fill(at, at + 4, value);
                                         })
                        .ok());
        const std::vector<int64_t> counts = {1, 3};
        ASSERT_TRUE(m.collective->ReduceScatterSum(at, counts, Soon()).ok());
        ASSERT_TRUE(m.collective->AllGather(at, counts, Soon()).ok());
        for (float v : data) EXPECT_EQ(v, 3.0f) << "member " << r;
      },
      /*ordered=*/true, /*faults=*/{}, /*compute_stream=*/true);
}

TEST(NcclCollectiveTest, AMemberThatSkipsAShardedCallEndsItAtTheDeadline) {
  for (bool gather : {false, true}) {
    std::vector<absl::Status> got(2);
    std::promise<void> finished;
    std::shared_future<void> member0_done = finished.get_future().share();
    OnEveryMember(2, [&](int r, Member& m) {
      if (r == 1) {
        member0_done.wait();  // joined, never calls
        return;
      }
      float x[2] = {1, 2};
      const std::vector<int64_t> counts = {1, 1};
      const absl::Time deadline = absl::Now() + absl::Milliseconds(300);
      got[0] = gather ? m.collective->AllGather(x, counts, deadline)
                      : m.collective->ReduceScatterSum(x, counts, deadline);
      got[1] = m.collective->ReduceScatterSum(x, counts, Never());
      finished.set_value();
    });
    EXPECT_EQ(got[0].code(), absl::StatusCode::kDeadlineExceeded) << got[0];
    EXPECT_NE(got[0].message().find("replica 0 of 2"), std::string::npos) << got[0];
    EXPECT_EQ(got[1].code(), absl::StatusCode::kDeadlineExceeded) << got[1];
    EXPECT_NE(got[1].message().find(got[0].message()), std::string::npos) << got[1];
  }
}

// A member that stops receiving: its peer's grouped exchange never completes, and Abort
// from another thread ends it with the reason.
TEST(NcclCollectiveTest, AbortEndsAShardedExchangeInFlightWithTheReason) {
  std::vector<FakeNcclOptions> faults(2);
  faults[1].drop_recvs_from_op = 1;
  std::vector<absl::Status> got(2);
  OnEveryMember(
      2,
      [&](int r, Member& m) {
        std::thread aborter([&] {
          absl::SleepFor(absl::Milliseconds(200));
          m.collective->Abort(absl::UnavailableError("rank 3 of the pipeline failed"));
        });
        std::vector<float> x(4, 1.0f);
        const std::vector<int64_t> counts = {2, 2};
        got[r] = m.collective->AllGather(x.data(), counts, Never());
        aborter.join();
      },
      true, faults);
  for (const absl::Status& s : got) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("rank 3 of the pipeline failed"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace baton
