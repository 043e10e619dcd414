#include "common/schedule/generators.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

constexpr double kTol = 1e-9;

std::string Name(const ScheduleOptions& o) {
  return absl::StrCat(ScheduleKindName(o.kind), " S=", o.num_ranks, " V=", o.virtual_stages,
                      " M=", o.num_microbatches);
}

// Every valid combination of S in {1..4}, M in {1, 2, 3, 4, 8}, and V in {2, 3} for
// interleaved-1f1b (where M is a multiple of S), V = 2 for the V schedules (M >= S, 2S for
// dualpipe-v), V = 1 for the others.
std::vector<ScheduleOptions> Sweep() {
  std::vector<ScheduleOptions> out;
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                         ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kVHalf,
                         ScheduleKind::kDualPipeV}) {
    for (int s = 1; s <= 4; ++s) {
      for (int m : {1, 2, 3, 4, 8}) {
        const ScheduleEntry& e = ScheduleEntryOf(k);
        if (e.placement == ChunkPlacement::kV) {
          if (m >= e.min_microbatches_per_rank * s) out.push_back({k, s, 2, m});
          continue;
        }
        if (k != ScheduleKind::kInterleaved1F1B) {
          out.push_back({k, s, 1, m});
          continue;
        }
        if (m % s != 0) continue;
        for (int v : {2, 3}) out.push_back({k, s, v, m});
      }
    }
  }
  return out;
}

SimResult MustSimulate(const ScheduleOptions& o, const Costs& c = Costs()) {
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << Name(o) << ": " << s.status();
  if (!s.ok()) return SimResult();
  absl::StatusOr<SimResult> r = Simulate(*s, c);
  EXPECT_TRUE(r.ok()) << Name(o) << ": " << r.status();
  return r.ok() ? *r : SimResult();
}

TEST(GeneratorsTest, EverySweptScheduleValidatesAndSimulates) {
  for (const ScheduleOptions& o : Sweep()) {
    SCOPED_TRACE(Name(o));
    absl::StatusOr<Schedule> compute = GenerateComputeSchedule(o);
    ASSERT_TRUE(compute.ok()) << compute.status();
    EXPECT_FALSE(compute->lowered());
    EXPECT_EQ(compute->kind, o.kind);
    EXPECT_EQ(compute->num_stages(), o.num_ranks * o.virtual_stages);
    const bool split = ScheduleEntryOf(o.kind).split_backward;
    const bool mixed = o.kind == ScheduleKind::kDualPipeV;  // B in the middle, I/W at the edges
    for (int r = 0; r < o.num_ranks; ++r) {
      int forwards = 0, input_grads = 0, weight_grads = 0;
      // Compute actions only, each (stage, micro-batch) once per kind; backward halves in
      // ascending micro-batch order per stage (bit-exact gradient accumulation).
      std::vector<int> next_b(compute->num_stages(), 0);
      std::vector<int> next_i(compute->num_stages(), 0);
      for (const Action& a : compute->ranks[r]) {
        ASSERT_TRUE(IsCompute(a.kind)) << a.ToString();
        EXPECT_EQ(compute->stage_to_rank[a.stage], r);
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) {
          EXPECT_EQ(a.microbatch, next_b[a.stage]++) << a.ToString();
        }
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) {
          EXPECT_EQ(a.microbatch, next_i[a.stage]++) << a.ToString();
        }
        if (a.kind != ActionKind::kForward && !mixed) {
          EXPECT_EQ(split, a.kind != ActionKind::kBackward) << a.ToString();
        }
        forwards += a.kind == ActionKind::kForward;
        input_grads += a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
        weight_grads += a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight;
      }
      // Every chunk of the rank runs every micro-batch once forward and once backward.
      const int per_rank = o.virtual_stages * o.num_microbatches;
      EXPECT_EQ(forwards, per_rank);
      EXPECT_EQ(input_grads, per_rank);
      EXPECT_EQ(weight_grads, per_rank);
    }
    // After lowering, every receive sits immediately before the action that consumes it
    // (Lower never has to receive early for the built-in generators), except under a V:
    // there a pair of ranks exchanges forwards of one chunk and backwards of the other over
    // one channel, and Lower receives some early to keep the channel's order.
    absl::StatusOr<Schedule> lowered = BuildSchedule(o);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    if (ScheduleEntryOf(o.kind).placement == ChunkPlacement::kV) continue;
    for (const auto& clock : lowered->ranks) {
      for (size_t j = 0; j < clock.size(); ++j) {
        const Action& a = clock[j];
        if (a.kind != ActionKind::kRecvF && a.kind != ActionKind::kRecvB) continue;
        ASSERT_LT(j + 1, clock.size());
        const Action& next = clock[j + 1];
        EXPECT_EQ(next.stage, a.stage) << a.ToString() << " then " << next.ToString();
        EXPECT_EQ(next.microbatch, a.microbatch) << a.ToString() << " then " << next.ToString();
        if (a.kind == ActionKind::kRecvF) {
          EXPECT_EQ(next.kind, ActionKind::kForward) << a.ToString();
        } else {
          EXPECT_TRUE(next.kind == ActionKind::kBackward || next.kind == ActionKind::kBackwardInput)
              << a.ToString() << " then " << next.ToString();
        }
      }
    }
    const SimResult r = MustSimulate(o);
    EXPECT_GT(r.makespan, 0);
    EXPECT_EQ(r.peak_inflight.size(), static_cast<size_t>(o.num_ranks));
  }
}

// The closed forms with unit costs (F = I = W = 1, B = 2).
TEST(GeneratorsTest, BubbleRatiosMatchClosedForms) {
  for (const ScheduleOptions& o : Sweep()) {
    SCOPED_TRACE(Name(o));
    const double s = o.num_ranks;
    const double m = o.num_microbatches;
    const double v = o.virtual_stages;
    const SimResult r = MustSimulate(o);
    switch (o.kind) {
      case ScheduleKind::kGpipe:
      case ScheduleKind::k1F1B:
        EXPECT_NEAR(r.bubble_ratio, (s - 1) / (m + s - 1), kTol);
        EXPECT_NEAR(r.makespan, 3 * (m + s - 1), kTol);
        break;
      case ScheduleKind::kInterleaved1F1B:
        EXPECT_NEAR(r.bubble_ratio, (s - 1) / (v * m + s - 1), kTol);
        break;
      case ScheduleKind::kZbH1:
        if (m >= s) {
          // The Zero Bubble paper's bound: idle (S-1)*(F+I-W) = S-1 on every rank.
          EXPECT_NEAR(r.makespan, 3 * m + s - 1, kTol);
          EXPECT_NEAR(r.bubble_ratio, (s - 1) / (3 * m + s - 1), kTol);
          for (int rank = 0; rank < o.num_ranks; ++rank) {
            EXPECT_NEAR(r.makespan - r.busy[rank], s - 1, kTol) << "rank " << rank;
          }
        } else {
          // Fewer micro-batches than stages: never worse than 1F1B.
          EXPECT_LE(r.bubble_ratio, (s - 1) / (m + s - 1) + kTol);
        }
        break;
      case ScheduleKind::kZbV:
        // Never worse than 1F1B's bubble on the same S and M, at 1F1B's memory.
        EXPECT_LE(r.bubble_ratio, (s - 1) / (m + s - 1) + kTol);
        break;
      case ScheduleKind::kVHalf:
        // Half the memory has a price here: no closed form (docs/schedules.md has the
        // simulated bubbles); it stays below GPipe's worst, S=1 aside.
        EXPECT_LT(r.bubble_ratio, 0.5);
        break;
      case ScheduleKind::kDualPipeV:
        // Idle S-1 on every rank, as zb-h1 (whose ranks are busy half as long): bubble
        // (S-1)/(6M+S-1).
        for (int rank = 0; rank < o.num_ranks; ++rank) {
          EXPECT_NEAR(r.makespan - r.busy[rank], s - 1, kTol) << "rank " << rank;
        }
        EXPECT_NEAR(r.bubble_ratio, (s - 1) / (6 * m + s - 1), kTol);
        break;
      case ScheduleKind::kCustom:
        break;
    }
  }
}

// The V schedules: rank r holds stages r and 2S-1-r; the activations a rank holds stay
// under the schedule's cap (2S chunks for zb-v, 1F1B's memory; S+1 for v-half); with
// enough micro-batches zb-v's bubble is below zb-h1's, and v-half holds less than zb-v.
TEST(GeneratorsTest, VSchedulesPlaceAVAndKeepTheirMemoryCaps) {
  EXPECT_EQ(VShapeStageToRank(3), (std::vector<int>{0, 1, 2, 2, 1, 0}));
  for (int s = 1; s <= 4; ++s) {
    for (int m : {s, 2 * s, 8}) {
      if (m < s) continue;
      const SimResult zbv = MustSimulate({ScheduleKind::kZbV, s, 2, m});
      const SimResult half = MustSimulate({ScheduleKind::kVHalf, s, 2, m});
      const SimResult zbh1 = MustSimulate({ScheduleKind::kZbH1, s, 1, m});
      SCOPED_TRACE(absl::StrCat("S=", s, " M=", m));
      for (int r = 0; r < s; ++r) {
        EXPECT_LE(zbv.peak_inflight[r], 2 * s) << "rank " << r;
        EXPECT_LE(half.peak_inflight[r], s + 1) << "rank " << r;
      }
      EXPECT_LE(*std::max_element(half.peak_inflight.begin(), half.peak_inflight.end()),
                *std::max_element(zbv.peak_inflight.begin(), zbv.peak_inflight.end()));
      if (m >= 2 * s && s > 1) {
        EXPECT_LT(zbv.bubble_ratio, zbh1.bubble_ratio);
      }
      if (m < 2 * s) continue;
      // DualPipeV: DualPipe's activation bound, PP+1 = 2S+1 chunks, reached on rank 0.
      const SimResult dual = MustSimulate({ScheduleKind::kDualPipeV, s, 2, m});
      for (int r = 0; r < s; ++r) EXPECT_LE(dual.peak_inflight[r], 2 * s + 1) << "rank " << r;
      EXPECT_EQ(dual.peak_inflight[0], 2 * s + 1);
    }
  }
}

// The clock of the source's figure (4 ranks, 10 micro-batches), rank 0 and rank 3, as
// dualpipev.py's eight steps give them: rank 0 holds stages 0 and 7, rank 3 stages 3 and 4.
TEST(GeneratorsTest, DualPipeVFollowsItsSource) {
  absl::StatusOr<Schedule> s = GenerateComputeSchedule({ScheduleKind::kDualPipeV, 4, 2, 10});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->stage_to_rank, VShapeStageToRank(4));
  auto row = [&](int r) {
    std::vector<std::string> out;
    for (const Action& a : s->ranks[r]) out.push_back(a.ToString());
    return out;
  };
  const std::vector<std::string> r0 = row(0);
  // Steps 1-3: six F0, then F0 F1 once, then three times I1 W1 F1.
  const std::vector<std::string> head0 = {"0F0", "0F1", "0F2", "0F3", "0F4", "0F5", "0F6",
                                          "7F0", "7I0", "7W0", "7F1", "7I1", "7W1", "7F2",
                                          "7I2", "7W2", "7F3", "0F7", "7B3", "7F4", "0B0"};
  ASSERT_GE(r0.size(), head0.size());
  EXPECT_EQ(std::vector<std::string>(r0.begin(), r0.begin() + head0.size()), head0);
  // Steps 6-8 on rank 0: B1 then a split I0, three times the oldest W then I0, the last W.
  const std::vector<std::string> tail0 = {"7B9", "0I6", "0W6", "0I7", "0W7",
                                          "0I8", "0W8", "0I9", "0W9"};
  EXPECT_EQ(std::vector<std::string>(r0.end() - tail0.size(), r0.end()), tail0);
  // Rank 3 (the V's bottom) starts with four F0 F1 pairs and has no step 1, 3, 5 or 7.
  const std::vector<std::string> r3 = row(3);
  const std::vector<std::string> head3 = {"3F0", "4F0", "3F1", "4F1", "3F2", "4F2", "3F3", "4F3",
                                          "3F4", "4B0", "4F4", "3B0"};
  EXPECT_EQ(std::vector<std::string>(r3.begin(), r3.begin() + head3.size()), head3);
}

TEST(GeneratorsTest, ZeroBubbleIsAThirdOf1F1BForFourStagesEightMicrobatches) {
  const SimResult one = MustSimulate({ScheduleKind::k1F1B, 4, 1, 8});
  const SimResult zb = MustSimulate({ScheduleKind::kZbH1, 4, 1, 8});
  const SimResult gp = MustSimulate({ScheduleKind::kGpipe, 4, 1, 8});
  const SimResult il = MustSimulate({ScheduleKind::kInterleaved1F1B, 4, 2, 8});
  EXPECT_NEAR(one.bubble_ratio, 3.0 / 11.0, kTol);  // 0.273
  EXPECT_NEAR(gp.bubble_ratio, 3.0 / 11.0, kTol);
  EXPECT_NEAR(zb.bubble_ratio, 3.0 / 27.0, kTol);  // 0.111
  EXPECT_NEAR(il.bubble_ratio, 3.0 / 19.0, kTol);
  EXPECT_NEAR(one.makespan, 33, kTol);
  EXPECT_NEAR(zb.makespan, 27, kTol);
  // Idle time per rank: 1F1B (S-1)*(F+B) = 9, ZB-H1 (S-1)*(F+I-W) = 3.
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(one.makespan - one.busy[r], 9, kTol);
    EXPECT_NEAR(zb.makespan - zb.busy[r], 3, kTol);
  }
}

TEST(GeneratorsTest, PeakInflightMatchesTheory) {
  for (const ScheduleOptions& o : Sweep()) {
    SCOPED_TRACE(Name(o));
    const int s = o.num_ranks;
    const int m = o.num_microbatches;
    const int v = o.virtual_stages;
    const SimResult r = MustSimulate(o);
    for (int rank = 0; rank < s; ++rank) {
      const int peak = r.peak_inflight[rank];
      switch (o.kind) {
        case ScheduleKind::kGpipe:
          EXPECT_EQ(peak, m) << "rank " << rank;
          break;
        case ScheduleKind::k1F1B:
          EXPECT_EQ(peak, std::min(s - rank, m)) << "rank " << rank;
          break;
        case ScheduleKind::kInterleaved1F1B:
          // (S-r-1)*2 + (V-1)*S + 1 chunks, capped at all V*M chunks when M*V is smaller
          // (e.g. M = S = 4, V = 2: ranks 0 and 1 run every forward before any backward).
          EXPECT_EQ(peak, std::min((s - rank - 1) * 2 + (v - 1) * s + 1, v * m)) << "rank " << rank;
          break;
        case ScheduleKind::kZbH1:
          // Micro-batches awaiting W: at most S+1 (the paper's bound); this generator keeps S.
          EXPECT_LE(peak, s + 1) << "rank " << rank;
          EXPECT_EQ(peak, std::min(s, m)) << "rank " << rank;
          break;
        // The V schedules count half-stage chunks: 2S is 1F1B's memory.
        case ScheduleKind::kZbV:
          EXPECT_LE(peak, 2 * s) << "rank " << rank;
          break;
        case ScheduleKind::kVHalf:
          EXPECT_LE(peak, s + 1) << "rank " << rank;
          break;
        case ScheduleKind::kDualPipeV:
          EXPECT_LE(peak, 2 * s + 1) << "rank " << rank;
          break;
        case ScheduleKind::kCustom:
          break;
      }
    }
  }
}

TEST(GeneratorsTest, InterleavedPeaksForFourStagesTwoChunks) {
  EXPECT_EQ(MustSimulate({ScheduleKind::kInterleaved1F1B, 4, 2, 8}).peak_inflight,
            (std::vector<int>{11, 9, 7, 5}));
  EXPECT_EQ(MustSimulate({ScheduleKind::kInterleaved1F1B, 4, 2, 16}).peak_inflight,
            (std::vector<int>{11, 9, 7, 5}));
  // M = S = 4, V = 2: only V*M = 8 chunks exist, so ranks 0 and 1 are capped at 8.
  EXPECT_EQ(MustSimulate({ScheduleKind::kInterleaved1F1B, 4, 2, 4}).peak_inflight,
            (std::vector<int>{8, 8, 7, 5}));
}

TEST(GeneratorsTest, OneFOneBPhases) {
  const OneFOneBPhases p0 = OneFOneBPhasesFor(4, 0, 8);
  EXPECT_EQ(p0.warmup, 3);
  EXPECT_EQ(p0.steady, 5);
  EXPECT_EQ(p0.cooldown, 3);
  const OneFOneBPhases p3 = OneFOneBPhasesFor(4, 3, 8);
  EXPECT_EQ(p3.warmup, 0);
  EXPECT_EQ(p3.steady, 8);
  const OneFOneBPhases few = OneFOneBPhasesFor(4, 0, 2);
  EXPECT_EQ(few.warmup, 2);
  EXPECT_EQ(few.steady, 0);
  EXPECT_EQ(few.cooldown, 2);
}

TEST(GeneratorsTest, InterleavedOrderTable) {
  // The table in generators.cc: S = 2, V = 2, M = 4.
  const int fwd_chunk[] = {0, 0, 1, 1, 0, 0, 1, 1};
  const int bwd_chunk[] = {1, 1, 0, 0, 1, 1, 0, 0};
  const int mb[] = {0, 1, 0, 1, 2, 3, 2, 3};
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(InterleavedForwardSlot(k, 2, 2).chunk, fwd_chunk[k]) << k;
    EXPECT_EQ(InterleavedBackwardSlot(k, 2, 2).chunk, bwd_chunk[k]) << k;
    EXPECT_EQ(InterleavedForwardSlot(k, 2, 2).microbatch, mb[k]) << k;
    EXPECT_EQ(InterleavedBackwardSlot(k, 2, 2).microbatch, mb[k]) << k;
  }
  EXPECT_EQ(InterleavedWarmup(4, 0, 2, 8), 10);
  EXPECT_EQ(InterleavedWarmup(4, 3, 2, 8), 4);
  EXPECT_EQ(InterleavedWarmup(4, 0, 2, 4), 8);
}

TEST(GeneratorsTest, CsvRoundTripForEveryGenerator) {
  for (const ScheduleOptions& o : Sweep()) {
    SCOPED_TRACE(Name(o));
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    ASSERT_TRUE(s.ok()) << s.status();
    absl::StatusOr<Schedule> back = FromCsv(ToCsv(*s));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ranks, s->ranks);
    EXPECT_EQ(back->stage_to_rank, s->stage_to_rank);
    EXPECT_EQ(back->num_ranks, s->num_ranks);
    EXPECT_EQ(back->virtual_stages, s->virtual_stages);
    EXPECT_EQ(back->num_microbatches, s->num_microbatches);
    EXPECT_TRUE(Validate(*back).ok());
    // The compute-only form imports to the same clock too (import lowers it).
    absl::StatusOr<Schedule> compute = GenerateComputeSchedule(o);
    ASSERT_TRUE(compute.ok());
    absl::StatusOr<Schedule> lowered_back = FromCsv(ToCsv(*compute));
    ASSERT_TRUE(lowered_back.ok()) << lowered_back.status();
    EXPECT_EQ(lowered_back->ranks, s->ranks);
  }
}

void ExpectRefused(const ScheduleOptions& o, const std::string& expect) {
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  ASSERT_FALSE(s.ok()) << Name(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find(expect), std::string::npos)
      << "got: " << s.status().message() << "\nexpected: " << expect;
}

TEST(GeneratorsTest, RefusalsAreClear) {
  ExpectRefused({ScheduleKind::k1F1B, 4, 1, 0},
                "micro-batches must be at least 1 (--microbatches, pipeline.microbatches), got 0");
  ExpectRefused({ScheduleKind::kGpipe, 0, 1, 4},
                "stages must be at least 1 (--stages, pipeline.stages), got 0");
  ExpectRefused({ScheduleKind::kInterleaved1F1B, 4, 0, 4},
                "virtual stages must be at least 1 (--virtual, pipeline.virtual_stages), got 0");
  ExpectRefused({ScheduleKind::kInterleaved1F1B, 4, 2, 6},
                "--microbatches 6 is not a multiple of --stages 4; use 4 or 8");
  ExpectRefused({ScheduleKind::kInterleaved1F1B, 4, 2, 3}, "use 4");
  ExpectRefused({ScheduleKind::kInterleaved1F1B, 4, 1, 8}, "at least 2 virtual stages");
  ExpectRefused({ScheduleKind::k1F1B, 4, 2, 8}, "1f1b runs one stage per rank");
  ExpectRefused({ScheduleKind::kZbH1, 4, 2, 8}, "zb-h1 runs one stage per rank");
  ExpectRefused({ScheduleKind::kCustom, 4, 1, 8}, "imported from CSV");
  ExpectRefused({ScheduleKind::kZbV, 4, 3, 8}, "zb-v places exactly two chunks per rank");
  ExpectRefused({ScheduleKind::kZbV, 4, 2, 3},
                "--microbatches 3 is below --stages 4 (pipeline.microbatches, pipeline.stages); "
                "use 1f1b or 4 or more");
  ExpectRefused({ScheduleKind::kDualPipeV, 4, 2, 7},
                "dualpipe-v needs at least 2 x as many micro-batches as stages");
  ExpectRefused({ScheduleKind::kDualPipeV, 4, 2, 7},
                "--microbatches 7 is below 2 x --stages 4 (pipeline.microbatches, pipeline.stages); "
                "use 1f1b or 8 or more");
  ExpectRefused({ScheduleKind::kDualPipeV, 2, 3, 8}, "dualpipe-v places exactly two chunks");
  ExpectRefused({ScheduleKind::kVHalf, 4, 2, 8, /*num_blocks=*/6},
                "4 x 2 = 8 pipeline chunks, but the model has only 6 blocks");
  ExpectRefused({ScheduleKind::kInterleaved1F1B, 4, 2, 8, /*num_blocks=*/6},
                "4 x 2 = 8 pipeline chunks, but the model has only 6 blocks");
  ExpectRefused({ScheduleKind::k1F1B, 8, 1, 8, /*num_blocks=*/5},
                "8 x 1 = 8 pipeline chunks, but the model has only 5 blocks");
  ExpectRefused({ScheduleKind::k1F1B, 64, 1, 1 << 20}, "more than this planner handles");
  EXPECT_TRUE(BuildSchedule({ScheduleKind::kInterleaved1F1B, 4, 2, 8, 8}).ok());
}

TEST(GeneratorsTest, LargePipelineBuilds) {
  // S=64, V=2, M=512: ~131k compute actions (timed in bench/plan_bench.cc).
  absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::kInterleaved1F1B, 64, 2, 512});
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<SimResult> r = Simulate(*s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->bubble_ratio, 63.0 / (2 * 512 + 63), kTol);
}

}  // namespace
}  // namespace baton
