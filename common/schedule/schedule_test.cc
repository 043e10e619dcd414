#include "common/schedule/schedule.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/schedule/generators.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

// A compute-only schedule from one space-separated row of action strings per rank.
Schedule Rows(const std::vector<std::string>& rows, int virtual_stages, int microbatches) {
  Schedule s;
  s.num_ranks = static_cast<int>(rows.size());
  s.virtual_stages = virtual_stages;
  s.num_microbatches = microbatches;
  s.stage_to_rank = LoopedStageToRank(s.num_ranks, virtual_stages);
  for (const std::string& row : rows) {
    s.ranks.emplace_back();
    for (absl::string_view cell : absl::StrSplit(row, ' ', absl::SkipEmpty())) {
      absl::StatusOr<Action> a = Action::Parse(std::string(cell));
      EXPECT_TRUE(a.ok()) << a.status();
      s.ranks.back().push_back(*a);
    }
  }
  return s;
}

std::string Row(const std::vector<Action>& clock) {
  std::vector<std::string> out;
  for (const Action& a : clock) out.push_back(a.ToString());
  return absl::StrJoin(out, " ");
}

TEST(ScheduleTest, KindNamesRoundTrip) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                         ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kVHalf,
                         ScheduleKind::kDualPipeV, ScheduleKind::kCustom}) {
    absl::StatusOr<ScheduleKind> back = ParseScheduleKind(ScheduleKindName(k));
    ASSERT_TRUE(back.ok()) << ScheduleKindName(k);
    EXPECT_EQ(*back, k);
  }
  EXPECT_EQ(*ParseScheduleKind("ZB_H1"), ScheduleKind::kZbH1);
  EXPECT_EQ(*ParseScheduleKind("interleaved"), ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(*ParseScheduleKind("DualPipeV"), ScheduleKind::kDualPipeV);
  absl::StatusOr<ScheduleKind> bad = ParseScheduleKind("v-min");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown schedule 'v-min'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("interleaved-1f1b"), std::string::npos);
}

TEST(ScheduleTest, LoopedPlacement) {
  EXPECT_EQ(LoopedStageToRank(4, 2), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(LoopedStageToRank(3, 1), (std::vector<int>{0, 1, 2}));
}

// Lower() on 1F1B with S=2, M=2: exactly these sends and receives, and a final STEP.
TEST(LowerTest, InsertsExactlyTheCommunicationOf1F1B) {
  absl::StatusOr<Schedule> compute = GenerateComputeSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_FALSE(compute->lowered());
  EXPECT_EQ(Row(compute->ranks[0]), "0F0 0F1 0B0 0B1");
  EXPECT_EQ(Row(compute->ranks[1]), "1F0 1B0 1F1 1B1");
  absl::StatusOr<Schedule> lowered = Lower(*compute);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_TRUE(lowered->lowered());
  EXPECT_EQ(Row(lowered->ranks[0]), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 STEP");
  EXPECT_EQ(Row(lowered->ranks[1]), "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 STEP");
  EXPECT_TRUE(Validate(*lowered).ok());
}

// Data parallelism: each stage's REDUCE_GRAD right after its last backward (and the send
// of that backward's gradient), on the stage's own rank.
TEST(GradReductionTest, PlacedAfterEachStagesLastBackward) {
  absl::StatusOr<Schedule> lowered = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_FALSE(lowered->reduces_grads());
  absl::StatusOr<Schedule> dp = AddGradReductions(*lowered);
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_TRUE(dp->reduces_grads());
  EXPECT_EQ(Row(dp->ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD STEP");
  EXPECT_EQ(Row(dp->ranks[1]),
            "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD STEP");
  EXPECT_TRUE(Validate(*dp).ok());
  // Refused twice, and on a clock that is not lowered.
  EXPECT_FALSE(AddGradReductions(*dp).ok());
  absl::StatusOr<Schedule> compute = GenerateComputeSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(compute.ok());
  EXPECT_FALSE(AddGradReductions(*compute).ok());
}

// Interleaved: a rank's early chunk finishes its backward before its later one, and its
// reduction starts there, under the rest of the clock; zb-h1: after the last W.
TEST(GradReductionTest, InterleavedAndSplitBackwards) {
  absl::StatusOr<Schedule> il = BuildSchedule({ScheduleKind::kInterleaved1F1B, 2, 2, 4});
  ASSERT_TRUE(il.ok()) << il.status();
  absl::StatusOr<Schedule> dp = AddGradReductions(*il);
  ASSERT_TRUE(dp.ok()) << dp.status();
  ASSERT_TRUE(Validate(*dp).ok());
  for (int r = 0; r < 2; ++r) {
    const std::vector<Action>& clock = dp->ranks[r];
    int reductions = 0;
    for (size_t j = 0; j < clock.size(); ++j) {
      if (clock[j].kind != ActionKind::kReduceGrad) continue;
      ++reductions;
      // Nothing of that stage's backward comes after it.
      for (size_t k = j + 1; k < clock.size(); ++k) {
        EXPECT_FALSE(clock[k].stage == clock[j].stage &&
                     (clock[k].kind == ActionKind::kBackward ||
                      clock[k].kind == ActionKind::kBackwardWeight))
            << Row(clock);
      }
    }
    EXPECT_EQ(reductions, 2);
    EXPECT_NE(clock[clock.size() - 2].kind, ActionKind::kStep);
  }
  // The higher stage (r + 2) finishes its backward first: its reduction is not last.
  const std::vector<Action>& r0 = dp->ranks[0];
  EXPECT_EQ(r0[r0.size() - 2].ToString(), "0REDUCE_GRAD") << Row(r0);
  absl::StatusOr<Schedule> zb = BuildSchedule({ScheduleKind::kZbH1, 2, 1, 4});
  ASSERT_TRUE(zb.ok());
  absl::StatusOr<Schedule> zdp = AddGradReductions(*zb);
  ASSERT_TRUE(zdp.ok());
  ASSERT_TRUE(Validate(*zdp).ok());
  EXPECT_EQ(zdp->ranks[1][zdp->ranks[1].size() - 3].ToString(), "1W3") << Row(zdp->ranks[1]);
}

TEST(GradReductionTest, ValidatorRefusesAnEarlyOrMissingReduction) {
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(s.ok());
  absl::StatusOr<Schedule> dp = AddGradReductions(*s);
  ASSERT_TRUE(dp.ok());
  // Stage 0's reduction moved before its last backward.
  Schedule early = *dp;
  std::vector<Action>& r0 = early.ranks[0];
  const Action reduce = r0[r0.size() - 2];
  r0.erase(r0.end() - 2);
  r0.insert(r0.begin() + 1, reduce);
  absl::Status v = Validate(early);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("0REDUCE_GRAD runs before 0B"), std::string::npos) << v;
  // Only one of the two stages reduced.
  Schedule half = *dp;
  half.ranks[1].erase(half.ranks[1].end() - 2);
  v = Validate(half);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("1REDUCE_GRAD is missing"), std::string::npos) << v;
  // Twice.
  Schedule twice = *dp;
  twice.ranks[0].insert(twice.ranks[0].end() - 1, reduce);
  v = Validate(twice);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("appears twice"), std::string::npos) << v;
}

TEST(GradReductionTest, CsvRoundTripKeepsReductions) {
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::kGpipe, 2, 1, 2});
  ASSERT_TRUE(s.ok());
  absl::StatusOr<Schedule> dp = AddGradReductions(*s);
  ASSERT_TRUE(dp.ok());
  const std::string csv = ToCsv(*dp);
  EXPECT_NE(csv.find("0REDUCE_GRAD"), std::string::npos) << csv;
  absl::StatusOr<Schedule> back = FromCsv(csv);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ranks, dp->ranks);
  EXPECT_TRUE(Validate(*back).ok());
}

TEST(LowerTest, CountsForLargerPipelines) {
  // 1F1B S=4, M=8: (S-1)*M of each of the four communication kinds; interleaved S=4, V=2,
  // M=8: (S*V-1)*M each; one rank (S=1, V=2) needs none.
  struct Case {
    ScheduleOptions o;
    int per_kind;
  };
  const Case cases[] = {{{ScheduleKind::k1F1B, 4, 1, 8}, 3 * 8},
                        {{ScheduleKind::kZbH1, 4, 1, 8}, 3 * 8},
                        {{ScheduleKind::kInterleaved1F1B, 4, 2, 8}, 7 * 8},
                        {{ScheduleKind::kInterleaved1F1B, 1, 2, 3}, 0}};
  for (const Case& c : cases) {
    absl::StatusOr<Schedule> s = BuildSchedule(c.o);
    ASSERT_TRUE(s.ok()) << s.status();
    int counts[9] = {};
    for (const auto& clock : s->ranks) {
      for (const Action& a : clock) ++counts[static_cast<int>(a.kind)];
      EXPECT_EQ(clock.back().kind, ActionKind::kStep);
    }
    for (ActionKind k :
         {ActionKind::kSendF, ActionKind::kRecvF, ActionKind::kSendB, ActionKind::kRecvB}) {
      EXPECT_EQ(counts[static_cast<int>(k)], c.per_kind) << ActionKindName(k);
    }
    EXPECT_EQ(counts[static_cast<int>(ActionKind::kStep)], c.o.num_ranks);
  }
}

// When a rank consumes two messages from one peer in the opposite order to the one they
// were sent in, Lower receives the earlier-sent one first (NCCL matches in order).
TEST(LowerTest, ReceivesInSendOrder) {
  const Schedule compute = Rows({"0F0 0F1 0B0 0B1", "1F1 1F0 1B1 1B0"}, 1, 2);
  absl::StatusOr<Schedule> lowered = Lower(compute);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(Row(lowered->ranks[0]), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0RECV_B0 0B0 0B1 STEP");
  EXPECT_EQ(Row(lowered->ranks[1]), "1RECV_F0 1RECV_F1 1F1 1F0 1B1 1SEND_B1 1B0 1SEND_B0 STEP");
  EXPECT_TRUE(Validate(*lowered).ok()) << Validate(*lowered);
}

TEST(LowerTest, Refusals) {
  absl::StatusOr<Schedule> lowered = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(lowered.ok());
  absl::StatusOr<Schedule> again = Lower(*lowered);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("already lowered"), std::string::npos);

  Schedule wrong_rank = Rows({"1F0", "0F0"}, 1, 1);
  absl::StatusOr<Schedule> w = Lower(wrong_rank);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("1F0 is on rank 0 but stage 1 runs on rank 1"),
            std::string::npos)
      << w.status();

  Schedule out_of_range = Rows({"0F0 5F0"}, 1, 1);
  EXPECT_FALSE(Lower(out_of_range).ok());
}

TEST(CsvTest, ExportsOneRowPerRankWithoutStep) {
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(ToCsv(*s),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
}

TEST(CsvTest, ImportsComputeOnlyAndLowers) {
  // PyTorch writes idle slots as empty cells or None; CRLF line ends are accepted too.
  absl::StatusOr<Schedule> s = FromCsv("0F0,0F1,,0B0,0B1\r\nNone,1F0,1B0,1F1,1B1\r\n\r\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kind, ScheduleKind::kCustom);
  EXPECT_EQ(s->num_ranks, 2);
  EXPECT_EQ(s->virtual_stages, 1);
  EXPECT_EQ(s->num_microbatches, 2);
  EXPECT_EQ(s->stage_to_rank, (std::vector<int>{0, 1}));
  absl::StatusOr<Schedule> built = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(built.ok());
  EXPECT_EQ(s->ranks, built->ranks);
}

TEST(CsvTest, ImportsLoweredAsWrittenAndReadsThePlacement) {
  // A V-shaped placement (stages 0 and 3 on rank 0, 1 and 2 on rank 1), as ZB-V and
  // DualPipeV use.
  Schedule v;
  v.num_ranks = 2;
  v.virtual_stages = 2;
  v.num_microbatches = 1;
  v.stage_to_rank = {0, 1, 1, 0};
  v.ranks = Rows({"0F0 3F0 3B0 0B0", "1F0 2F0 2B0 1B0"}, 2, 1).ranks;
  absl::StatusOr<Schedule> lowered = Lower(v);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  ASSERT_TRUE(Validate(*lowered).ok()) << Validate(*lowered);
  absl::StatusOr<Schedule> back = FromCsv(ToCsv(*lowered));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(back->virtual_stages, 2);
  EXPECT_EQ(back->ranks, lowered->ranks);
}

TEST(CsvTest, ImportErrors) {
  struct Case {
    std::string csv;
    std::string expect;
  };
  const Case cases[] = {
      {"", "no rows"},
      {"\n\n", "no rows"},
      {"0F0,0B0\n1F0,0X0\n", "row 2 (rank 1), column 2: action '0X0'"},
      {"0F0,0B0\n0F1,0B1\n", "stage 0 appears on rank 0 (0F0) and on rank 1 (0F1)"},
      {"0F0,0B0\n2F0,2B0\n", "stage 1 appears on no rank"},
      {"0F0,0B0,2F0,2B0\n1F0,1B0\n", "3 stages over 2 ranks, rank 0 holding 2"},
      {"0F0,0B0,2F0,2B0,3F0,3B0\n1F0,1B0\n", "4 stages over 2 ranks, rank 0 holding 3"},
      {"0F0,1F0\n", ""},  // fine: one rank, two local stages (missing backwards: Validate's job)
  };
  for (const Case& c : cases) {
    absl::StatusOr<Schedule> s = FromCsv(c.csv);
    if (c.expect.empty()) {
      EXPECT_TRUE(s.ok()) << s.status();
      continue;
    }
    ASSERT_FALSE(s.ok()) << c.csv;
    EXPECT_NE(s.status().message().find(c.expect), std::string::npos) << s.status();
  }
}

}  // namespace
}  // namespace baton

namespace baton {
namespace {

// The vocabulary table: every kind has one entry, names and aliases are unique, parsing
// accepts names and aliases in any case and refuses the rest listing the known names.
TEST(VocabularyTest, OneEntryPerKindAndUnknownNamesRefused) {
  std::set<std::string> names;
  std::set<int> values;
  for (const ScheduleEntry& e : ScheduleTable()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    for (const std::string& a : e.aliases) EXPECT_TRUE(names.insert(a).second) << a;
    EXPECT_EQ(&ScheduleEntryOf(e.kind), &e) << e.name;
    EXPECT_EQ(ScheduleKindName(e.kind), std::string(e.name));
    if (e.kind != ScheduleKind::kCustom) {
      EXPECT_TRUE(values.insert(e.spec_value).second) << e.name;
      EXPECT_NE(e.generate, nullptr) << e.name;
      absl::StatusOr<const ScheduleEntry*> by_value = ScheduleEntryForSpecValue(e.spec_value);
      ASSERT_TRUE(by_value.ok()) << e.name;
      EXPECT_EQ(*by_value, &e);
    }
    absl::StatusOr<ScheduleKind> parsed = ParseScheduleKind(absl::AsciiStrToUpper(e.name));
    ASSERT_TRUE(parsed.ok()) << e.name;
    EXPECT_EQ(*parsed, e.kind);
  }
  EXPECT_EQ(*ParseScheduleKind("interleaved"), ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(*ParseScheduleKind("ZB_V"), ScheduleKind::kZbV);
  absl::StatusOr<ScheduleKind> bad = ParseScheduleKind("dualpipe");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown schedule 'dualpipe' (known: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, "
            "v-half, dualpipe-v, custom)");
  EXPECT_EQ(ScheduleEntryForSpecValue(0).value()->kind, ScheduleKind::k1F1B);
  EXPECT_FALSE(ScheduleEntryForSpecValue(99).ok());
}

}  // namespace
}  // namespace baton
