#include "common/pipeline/grad_reducer.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/comm/inproc_collective.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

Action Reduce(int stage) { return Action{ActionKind::kReduceGrad, stage, 0}; }

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// Parameters whose gradients hold `value` + their element index.
std::vector<std::unique_ptr<Parameter>> Params(const std::vector<int64_t>& sizes, float value) {
  std::vector<std::unique_ptr<Parameter>> out;
  for (int64_t n : sizes) {
    auto p = std::make_unique<Parameter>();
    p->grad = Tensor::Zeros({n});
    for (int64_t i = 0; i < n; ++i) p->grad.f32()[i] = value + static_cast<float>(i);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<Parameter*> Ptrs(const std::vector<std::unique_ptr<Parameter>>& ps) {
  std::vector<Parameter*> out;
  for (const auto& p : ps) out.push_back(p.get());
  return out;
}

// A one-member group that records each all-reduce's length, leaves the data as it is, and
// fails the calls numbered in `fail` (0-based) with UNAVAILABLE.
class RecordingCollective : public Collective {
 public:
  explicit RecordingCollective(std::vector<int> fail = {}) : fail_(std::move(fail)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* engine() const override { return "recording"; }
  absl::Status AllReduceSum(float*, int64_t n, absl::Time) override {
    const int call = static_cast<int>(calls.size());
    calls.push_back(n);
    for (int f : fail_) {
      if (f == call) return absl::UnavailableError("peer gone");
    }
    return absl::OkStatus();
  }
  void Abort(const absl::Status&) override {}

  std::vector<int64_t> calls;  // written by the reducer's thread; read after WaitAll

 private:
  const std::vector<int> fail_;
};

// Sharded: the reduce-scatter leaves each member's own parameters with the group's sums
// (member 0 owns the first two, member 1 the last), and the all-gather hands each owner's
// weights to the other; the other gradients and weights are not touched where they are
// another member's result.
TEST(GradReducerTest, ReduceScatterSumsTheOwnedGradientsAndAllGatherHandsWeightsOn) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> c0 = group.Member(0);
  std::unique_ptr<Collective> c1 = group.Member(1);
  GradReducer r0(c0.get(), /*bucket_bytes=*/1 << 20);
  GradReducer r1(c1.get(), /*bucket_bytes=*/1 << 20);
  auto p0 = Params({2, 3, 7}, 1.0f);
  auto p1 = Params({2, 3, 7}, 10.0f);
  for (const auto* ps : {&p0, &p1}) {
    const float base = ps == &p0 ? 100.0f : 200.0f;
    for (const auto& p : *ps) {
      p->value = Tensor::Zeros({p->grad.numel()});
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = base + i;
    }
  }
  const std::vector<int64_t> counts = {5, 7};
  const auto t0 = std::chrono::steady_clock::now();
  r0.BeginStep(t0);
  r1.BeginStep(t0);
  r0.EnqueueReduceScatter(Reduce(0), Ptrs(p0), counts, Soon());
  r1.EnqueueReduceScatter(Reduce(0), Ptrs(p1), counts, Soon());
  r0.EnqueueAllGather(Action{ActionKind::kStep, 0, 0}, Ptrs(p0), counts, Soon());
  r1.EnqueueAllGather(Action{ActionKind::kStep, 0, 0}, Ptrs(p1), counts, Soon());
  std::vector<ActionTiming> t_0, t_1;
  ASSERT_TRUE(r0.WaitAll(Soon(), &t_0).ok());
  ASSERT_TRUE(r1.WaitAll(Soon(), &t_1).ok());
  for (int k = 0; k < 3; ++k) {
    const auto& owned = k < 2 ? p0[k] : p1[k];  // its owner's copy
    for (int64_t i = 0; i < owned->grad.numel(); ++i) {
      EXPECT_EQ(owned->grad.f32()[i], 11.0f + 2.0f * static_cast<float>(i)) << k;
    }
    // After the all-gather both members hold the owner's weights.
    const float owner_base = k < 2 ? 100.0f : 200.0f;
    for (const auto* ps : {&p0, &p1}) {
      for (int64_t i = 0; i < (*ps)[k]->value.numel(); ++i) {
        EXPECT_EQ((*ps)[k]->value.f32()[i], owner_base + static_cast<float>(i)) << k;
      }
    }
  }
  ASSERT_EQ(t_0.size(), 2u);
  EXPECT_EQ(t_0[0].bytes, 12 * 4);
  EXPECT_EQ(t_0[1].action.kind, ActionKind::kStep);
  // Runs that do not add up to the bucket fail the step, naming the op.
  r0.BeginStep(t0);
  r0.EnqueueReduceScatter(Reduce(0), Ptrs(p0), {5, 6}, Soon());
  const absl::Status bad = r0.WaitAll(Soon(), &t_0);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("reduce-scatter"), std::string::npos) << bad;
}

TEST(GradReducerTest, SumsEveryGradientOverTheGroup) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> c0 = group.Member(0);
  std::unique_ptr<Collective> c1 = group.Member(1);
  GradReducer r0(c0.get(), /*bucket_bytes=*/5 * sizeof(float));
  GradReducer r1(c1.get(), /*bucket_bytes=*/5 * sizeof(float));
  auto p0 = Params({2, 3, 7}, 1.0f);
  auto p1 = Params({2, 3, 7}, 10.0f);
  const auto t0 = std::chrono::steady_clock::now();
  r0.BeginStep(t0);
  r1.BeginStep(t0);
  r0.Enqueue(Reduce(1), Ptrs(p0), Soon());
  r1.Enqueue(Reduce(1), Ptrs(p1), Soon());
  std::vector<ActionTiming> t_0, t_1;
  ASSERT_TRUE(r0.WaitAll(Soon(), &t_0).ok());
  ASSERT_TRUE(r1.WaitAll(Soon(), &t_1).ok());
  for (const auto* ps : {&p0, &p1}) {
    for (const auto& p : *ps) {
      for (int64_t i = 0; i < p->grad.numel(); ++i) {
        EXPECT_EQ(p->grad.f32()[i], 11.0f + 2.0f * static_cast<float>(i)) << p->grad.numel();
      }
    }
  }
  ASSERT_EQ(t_0.size(), 1u);
  EXPECT_EQ(t_0[0].action, Reduce(1));
  EXPECT_EQ(t_0[0].bytes, 12 * static_cast<int64_t>(sizeof(float)));
  EXPECT_LE(t_0[0].start_ns, t_0[0].end_ns);
}

TEST(GradReducerTest, BucketsNeverSplitAParameter) {
  RecordingCollective c;
  GradReducer r(&c, /*bucket_bytes=*/5 * sizeof(float));
  auto ps = Params({2, 3, 7, 1, 1}, 0.0f);
  r.BeginStep(std::chrono::steady_clock::now());
  r.Enqueue(Reduce(0), Ptrs(ps), Soon());
  std::vector<ActionTiming> timings;
  ASSERT_TRUE(r.WaitAll(Soon(), &timings).ok());
  // 2 + 3 fill a bucket; 7 is larger than one and goes alone; 1 + 1 share the last.
  EXPECT_EQ(c.calls, (std::vector<int64_t>{5, 7, 2}));
}

TEST(GradReducerTest, RunsInQueueOrderAndEachStepStartsClean) {
  RecordingCollective c;
  GradReducer r(&c, 1 << 20);
  auto a = Params({4}, 0.0f);
  auto b = Params({6}, 0.0f);
  r.BeginStep(std::chrono::steady_clock::now());
  r.Enqueue(Reduce(2), Ptrs(a), Soon());
  r.Enqueue(Reduce(1), Ptrs(b), Soon());
  std::vector<ActionTiming> timings;
  ASSERT_TRUE(r.WaitAll(Soon(), &timings).ok());
  ASSERT_EQ(timings.size(), 2u);
  EXPECT_EQ(timings[0].action, Reduce(2));
  EXPECT_EQ(timings[1].action, Reduce(1));
  EXPECT_LE(timings[0].end_ns, timings[1].start_ns);
  EXPECT_EQ(c.calls, (std::vector<int64_t>{4, 6}));

  r.BeginStep(std::chrono::steady_clock::now());
  ASSERT_TRUE(r.WaitAll(Soon(), &timings).ok());
  EXPECT_TRUE(timings.empty());
}

TEST(GradReducerTest, FirstErrorSkipsTheRestOfTheStep) {
  RecordingCollective c(/*fail=*/{0});
  GradReducer r(&c, 1 << 20);
  auto a = Params({4}, 0.0f);
  auto b = Params({6}, 0.0f);
  r.BeginStep(std::chrono::steady_clock::now());
  r.Enqueue(Reduce(3), Ptrs(a), Soon());
  r.Enqueue(Reduce(2), Ptrs(b), Soon());
  std::vector<ActionTiming> timings;
  const absl::Status s = r.WaitAll(Soon(), &timings);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), Reduce(3).ToString() + ": peer gone");
  ASSERT_EQ(timings.size(), 1u);  // the failed one; the skipped one is not timed
  EXPECT_EQ(c.calls.size(), 1u);

  // The next step runs again.
  r.BeginStep(std::chrono::steady_clock::now());
  r.Enqueue(Reduce(3), Ptrs(a), Soon());
  EXPECT_TRUE(r.WaitAll(Soon(), &timings).ok());
  EXPECT_EQ(timings.size(), 1u);
}

TEST(GradReducerTest, AWaitPastItsDeadlineAbortsTheGroup) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> c0 = group.Member(0);
  std::unique_ptr<Collective> c1 = group.Member(1);
  GradReducer r(c0.get(), 1 << 20);
  auto ps = Params({4}, 0.0f);
  r.BeginStep(std::chrono::steady_clock::now());
  r.Enqueue(Reduce(0), Ptrs(ps), Soon());  // member 1 never joins
  std::vector<ActionTiming> timings;
  const absl::Status s = r.WaitAll(absl::Now() + absl::Milliseconds(50), &timings);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("did not finish by its deadline"), std::string::npos)
      << s;
  // The peer sees the abort instead of waiting for this member.
  std::vector<float> data(4, 0.0f);
  EXPECT_FALSE(c1->AllReduceSum(data.data(), 4, Soon()).ok());
}

TEST(GradReducerTest, AbortEndsARunningReduction) {
  InProcessGroup group(2);
  std::unique_ptr<Collective> c0 = group.Member(0);
  std::unique_ptr<Collective> c1 = group.Member(1);
  GradReducer r(c0.get(), 1 << 20);
  auto ps = Params({4}, 0.0f);
  r.BeginStep(std::chrono::steady_clock::now());
  r.Enqueue(Reduce(0), Ptrs(ps), Soon());  // member 1 never joins
  r.Abort(absl::CancelledError("the job was cancelled"));
  std::vector<ActionTiming> timings;
  const absl::Status s = r.WaitAll(Soon(), &timings);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("the job was cancelled"), std::string::npos) << s;
}

}  // namespace
}  // namespace baton
