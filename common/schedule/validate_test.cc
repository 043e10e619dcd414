#include "common/schedule/validate.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/schedule/generators.h"
#include "common/schedule/schedule.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

constexpr double kTol = 1e-9;

std::string Refusal(const std::string& csv) {
  absl::StatusOr<Schedule> s = FromCsv(csv);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return "";
  const absl::Status v = Validate(*s);
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << v;
  // Simulate refuses the same clocks with the same message.
  absl::StatusOr<SimResult> r = Simulate(*s);
  EXPECT_FALSE(r.ok());
  if (!r.ok()) {
    EXPECT_EQ(r.status(), v);
  }
  return std::string(v.message());
}

void ExpectContains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing: " << part << "\nin:\n" << text;
}

// The grid line of `rank` in a refusal message.
std::string GridRow(const std::string& msg, int rank) {
  const std::string prefix = "rank " + std::to_string(rank) + " ";
  for (absl::string_view line : absl::StrSplit(msg, '\n')) {
    if (line.substr(0, prefix.size()) == prefix) return std::string(line);
  }
  return "";
}

// Rank 1 waits for micro-batch 1's activation before running micro-batch 0's backward;
// rank 0 sends that activation only after micro-batch 0's backward came back.
constexpr char kDeadlockCsv[] =
    "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1\n"
    "1RECV_F0,1RECV_F1,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n";

// Compute-only 1F1B for S=2, M=2 with rank 1's backward of micro-batch 1 missing.
constexpr char kMissingBackwardCsv[] = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n";

// Rank 1 receives micro-batch 1's activation before micro-batch 0's; rank 0 sends 0 first.
constexpr char kMismatchedOrderCsv[] =
    "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
    "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n";

TEST(ValidateTest, RefusesDeadlockWithGridAndStuckActions) {
  const std::string msg = Refusal(kDeadlockCsv);
  ExpectContains(msg, "deadlock: no rank can progress");
  ExpectContains(msg, "rank 0 waits in 0RECV_B0 for rank 1");
  ExpectContains(msg, "rank 1 waits in 1RECV_F1 for rank 0");
  ExpectContains(GridRow(msg, 0), ">0RECV_B0<");
  ExpectContains(GridRow(msg, 1), ">1RECV_F1<");
}

TEST(ValidateTest, RefusesMissingBackwardWithGridAndOffendingAction) {
  const std::string msg = Refusal(kMissingBackwardCsv);
  ExpectContains(msg, "1F1 has no backward: neither 1B1 nor 1I1 + 1W1");
  ExpectContains(GridRow(msg, 1), ">1F1<");
  ExpectContains(GridRow(msg, 0), "0F0");
}

TEST(ValidateTest, RefusesMismatchedSendReceiveOrder) {
  const std::string msg = Refusal(kMismatchedOrderCsv);
  ExpectContains(msg, "receive order differs from send order between rank 0 and rank 1");
  ExpectContains(msg, "rank 1's receive #1 from rank 0 is 1RECV_F1");
  ExpectContains(msg, "rank 0's send #1 to rank 1 is 0SEND_F0");
  ExpectContains(GridRow(msg, 1), ">1RECV_F1<");
  ExpectContains(GridRow(msg, 0), ">0SEND_F0<");
}

TEST(ValidateTest, StructuralRefusals) {
  struct Case {
    std::string csv;
    std::string expect;
    std::string marked;
  };
  const Case cases[] = {
      // Backward before forward (compute-only; import lowers it).
      {"0F0,0B0\n1B0,1F0\n", "1B0 runs before its forward 1F0", ">1B0<"},
      // W before I.
      {"0F0,0I0,0W0\n1F0,1W0,1I0\n", "1W0 runs before 1I0", ">1W0<"},
      // I without W.
      {"0F0,0I0,0W0\n1F0,1I0\n", "1I0 has no weight-gradient 1W0", ">1I0<"},
      // Both B and I (one rank holding both stages, so no communication is involved).
      {"0F0,1F0,1B0,1I0,1W0,0B0\n",
       "stage 1 micro-batch 0 has both a full backward (B) and a split one", ">1B0<"},
      // Duplicate forward.
      {"0F0,0F0,0B0\n1F0,1B0\n", "0F0 appears twice on rank 0", ">0F0<"},
      // Backward without forward.
      {"0F0,0B0,0B1\n1F0,1B0,1F1,1B1\n", "0B1 has no forward: 0F1 is missing", ">0B1<"},
      // Local hand-over out of order: stages 0 and 1 both on rank 0.
      {"1F0,0F0,0B0,1B0\n", "1F0 runs before 0F0, whose output it takes", ">1F0<"},
      {"0F0,1F0,0B0,1B0\n", "0B0 runs before 1B0, whose gradient it takes", ">0B0<"},
      // A lowered clock missing a receive.
      {"0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n",
       "1F0 needs the output of stage 0 from rank 0, but no 1RECV_F0 precedes it", ">1F0<"},
      // A lowered clock whose receive comes after its consumer.
      {"0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n", "1F0 runs before 1RECV_F0",
       ">1F0<"},
      // A send before the forward that produces it.
      {"0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
       "0SEND_F0 sends before its forward 0F0 ran", ">0SEND_F0<"},
      // Communication between stages on the same rank.
      {"0F0,0SEND_F0,1F0,1B0,0B0\n",
       "0SEND_F0: stages 0 and 1 are both on rank 0 and hand over locally", ">0SEND_F0<"},
      // Communication past the last stage.
      {"0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1SEND_F0,1B0,1SEND_B0\n",
       "1SEND_F0: stage 1 is the last stage", ">1SEND_F0<"},
      // STEP not last.
      {"0F0,0SEND_F0,STEP,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
       "STEP at position 2 on rank 0 is not the rank's last action", ">STEP<"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.csv);
    const std::string msg = Refusal(c.csv);
    ExpectContains(msg, c.expect);
    ExpectContains(msg, c.marked);
    // The reason comes first, then the grid.
    EXPECT_EQ(msg.find(c.expect), 0u) << msg;
  }
}

TEST(ValidateTest, ShapeRefusals) {
  absl::StatusOr<Schedule> good = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(Validate(*good).ok());

  absl::StatusOr<Schedule> compute = GenerateComputeSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(compute.ok());
  EXPECT_EQ(Validate(*compute).code(), absl::StatusCode::kFailedPrecondition);

  Schedule s = *good;
  s.ranks[1].pop_back();  // no STEP
  EXPECT_NE(Validate(s).message().find("rank 1 does not end with STEP"), std::string::npos);

  s = *good;
  s.ranks[0][0].stage = 1;  // 1F0 on rank 0
  EXPECT_NE(Validate(s).message().find("1F0 is on rank 0 but stage 1 runs on rank 1"),
            std::string::npos)
      << Validate(s);

  s = *good;
  s.ranks[0][0].microbatch = 7;
  EXPECT_NE(Validate(s).message().find("micro-batch 7 outside [0, 2)"), std::string::npos);

  s = *good;
  s.stage_to_rank[1] = 5;
  EXPECT_NE(Validate(s).message().find("outside [0, 2)"), std::string::npos);

  s = *good;
  s.num_ranks = 3;
  EXPECT_NE(Validate(s).message().find("2 rank clocks for num_ranks = 3"), std::string::npos);
}

TEST(ValidateTest, GridIsWindowedForLargeClocks) {
  // A missing backward deep inside a big clock: the grid shows a window around it and only
  // the neighbouring ranks, not 64 rows of 2000 columns.
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::k1F1B, 64, 1, 256});
  ASSERT_TRUE(s.ok());
  auto& clock = s->ranks[40];
  for (size_t j = 0; j < clock.size(); ++j) {
    if (clock[j] == Action{ActionKind::kBackward, 40, 100}) {
      clock.erase(clock.begin() + j);
      break;
    }
  }
  const absl::Status v = Validate(*s);
  ASSERT_FALSE(v.ok());
  const std::string msg(v.message());
  ExpectContains(msg, "40F100 has no backward");
  ExpectContains(GridRow(msg, 40), ">40F100<");
  EXPECT_LT(msg.size(), 4000u) << msg;
  EXPECT_EQ(GridRow(msg, 10), "");
}

TEST(SimulateTest, CostsScaleTheTimeline) {
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::k1F1B, 4, 1, 8});
  ASSERT_TRUE(s.ok());
  Costs c;
  c.f = 2;
  c.i = 2;
  c.w = 2;  // B = 4
  absl::StatusOr<SimResult> r = Simulate(*s, c);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan, 66, kTol);
  EXPECT_NEAR(r->bubble_ratio, 3.0 / 11.0, kTol);
  // Every action of every rank appears once in the timeline, in clock order.
  size_t actions = 0;
  for (const auto& clock : s->ranks) actions += clock.size();
  ASSERT_EQ(r->timeline.size(), actions);
  EXPECT_EQ(r->timeline[0].rank, 0);
  EXPECT_EQ(r->timeline[0].action.ToString(), "0F0");
  EXPECT_NEAR(r->timeline[0].end, 2, kTol);
  for (size_t i = 1; i < r->timeline.size(); ++i) {
    if (r->timeline[i].rank == r->timeline[i - 1].rank) {
      EXPECT_GE(r->timeline[i].start, r->timeline[i - 1].end - kTol);
    }
  }

  c.b = 3;  // an explicit full-backward cost: 1F1B's makespan is (M+S-1)*(F+B)
  r = Simulate(*s, c);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan, 55, kTol);
}

TEST(SimulateTest, ZeroBubbleBoundWithOtherCosts) {
  // The Zero Bubble paper's idle time (S-1)*(F+I-W) per rank also holds with a cheaper W.
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::kZbH1, 4, 1, 8});
  ASSERT_TRUE(s.ok());
  absl::StatusOr<Costs> c = ParseCosts("F=1,I=1,W=0.5");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<SimResult> r = Simulate(*s, *c);
  ASSERT_TRUE(r.ok());
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NEAR(r->makespan - r->busy[rank], 3 * (1 + 1 - 0.5), kTol) << rank;
  }
}

TEST(SimulateTest, CommunicationCostsAndPerStageCosts) {
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::kGpipe, 2, 1, 1});
  ASSERT_TRUE(s.ok());
  Costs c;
  c.send = 0.5;
  c.recv = 0.25;
  absl::StatusOr<SimResult> r = Simulate(*s, c);
  ASSERT_TRUE(r.ok());
  // 0F0 [0,1], 0SEND_F0 [1,1.5], 1RECV_F0 [1.5,1.75], 1F0, 1B0 [1.75,4.75], 1SEND_B0
  // [4.75,5.25], 0RECV_B0 [5.25,5.5], 0B0 [5.5,7.5].
  EXPECT_NEAR(r->makespan, 7.5, kTol);

  Costs per;
  per.per_stage.resize(2);
  per.per_stage[1].f = 3;
  per.per_stage[1].b = 3;
  r = Simulate(*s, per);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan, 1 + 3 + 3 + 2, kTol);

  per.per_stage.resize(3);
  r = Simulate(*s, per);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 entries for 2 stages"), std::string::npos);

  Costs bad;
  bad.f = -1;
  EXPECT_FALSE(Simulate(*s, bad).ok());
  bad.f = std::nan("");
  EXPECT_FALSE(Simulate(*s, bad).ok());
}

TEST(SimulateTest, ParseCosts) {
  absl::StatusOr<Costs> c = ParseCosts("F=1,I=1,W=1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backward(), 2);
  c = ParseCosts(" f=2 , b=3,send=0.1,RECV=0.2,step=4 ");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->f, 2);
  EXPECT_EQ(c->backward(), 3);
  EXPECT_EQ(c->send, 0.1);
  EXPECT_EQ(c->recv, 0.2);
  EXPECT_EQ(c->step, 4);
  EXPECT_TRUE(ParseCosts("").ok());
  for (const char* bad : {"F", "F=x", "F=-1", "Q=1", "F=inf"}) {
    absl::StatusOr<Costs> b = ParseCosts(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("costs '"), std::string::npos);
  }
}

TEST(SimulateTest, SingleRankHasNoBubble) {
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::kInterleaved1F1B, 1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<SimResult> r = Simulate(*s);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->bubble_ratio, 0, kTol);
  EXPECT_NEAR(r->makespan, 2 * 3 * 3, kTol);
}

}  // namespace
}  // namespace baton

namespace baton {
namespace {

// CLIP_GRAD (action.h): on every rank or none, each rank's last action before STEP.
TEST(ValidateClipTest, EveryRankOrNoneRightBeforeStep) {
  // Accepted: on both ranks, after TIE_GRAD where there is one.
  const std::string good =
      "0F0,0SEND_F0,0RECV_B0,0B0,0TIE_GRAD,CLIP_GRAD\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1TIE_GRAD,CLIP_GRAD\n";
  absl::StatusOr<Schedule> s = FromCsv(good);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->clips_grads());
  EXPECT_TRUE(Validate(*s).ok()) << Validate(*s);
  ASSERT_EQ(s->ranks[0].size(), 7u);  // STEP appended after CLIP_GRAD
  EXPECT_EQ(s->ranks[0][5].ToString(), "CLIP_GRAD");
  EXPECT_EQ(s->stage_to_rank, (std::vector<int>{0, 1}));  // CLIP_GRAD names no stage

  ExpectContains(Refusal("0F0,0SEND_F0,0RECV_B0,0B0,CLIP_GRAD\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
                 "CLIP_GRAD is missing on rank 1");
  const std::string early = Refusal(
      "0F0,0SEND_F0,CLIP_GRAD,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,CLIP_GRAD\n");
  ExpectContains(early, "CLIP_GRAD on rank 0 runs before 0RECV_B0");
  ExpectContains(early, ">CLIP_GRAD<");
  ExpectContains(Refusal("0F0,0SEND_F0,0RECV_B0,0B0,0TIE_GRAD,CLIP_GRAD\n"
                         "1RECV_F0,1F0,1B0,1SEND_B0,CLIP_GRAD,1TIE_GRAD\n"),
                 "CLIP_GRAD on rank 1 runs before 1TIE_GRAD");
  ExpectContains(Refusal("0F0,0SEND_F0,0RECV_B0,0B0,CLIP_GRAD,CLIP_GRAD\n"
                         "1RECV_F0,1F0,1B0,1SEND_B0,CLIP_GRAD\n"),
                 "CLIP_GRAD appears twice on rank 0");
}

TEST(ValidateClipTest, AddGradClipsPutsItLastBeforeStepAndTheSimulatorGivesItNoTime) {
  ScheduleOptions o;
  o.kind = ScheduleKind::k1F1B;
  o.num_ranks = 3;
  o.num_microbatches = 4;
  absl::StatusOr<Schedule> plain = BuildSchedule(o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Schedule> tied = AddTiedGradSums(*plain);
  ASSERT_TRUE(tied.ok()) << tied.status();
  absl::StatusOr<Schedule> clipped = AddGradClips(*tied);
  ASSERT_TRUE(clipped.ok()) << clipped.status();
  for (const auto& clock : clipped->ranks) {
    ASSERT_GE(clock.size(), 2u);
    EXPECT_EQ(clock[clock.size() - 2].kind, ActionKind::kClipGrad);
    EXPECT_EQ(clock.back().kind, ActionKind::kStep);
  }
  EXPECT_EQ(clipped->ranks[0][clipped->ranks[0].size() - 3].ToString(), "0TIE_GRAD");
  EXPECT_TRUE(Validate(*clipped).ok()) << Validate(*clipped);
  EXPECT_EQ(AddGradClips(*clipped).status().code(), absl::StatusCode::kFailedPrecondition);
  Costs c;
  c.f = 1;
  c.b = 2;
  c.step = 0.5;
  absl::StatusOr<SimResult> with = Simulate(*clipped, c);
  absl::StatusOr<SimResult> without = Simulate(*tied, c);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_DOUBLE_EQ(with->makespan, without->makespan);
}

}  // namespace
}  // namespace baton
