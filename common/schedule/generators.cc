#include "common/schedule/generators.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/core/status.h"
#include "common/schedule/internal.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"

namespace baton {
namespace {

using schedule_internal::kMaxCells;
using schedule_internal::kMaxRanks;

Schedule Empty(ScheduleKind kind, int num_ranks, int virtual_stages, int num_microbatches) {
  Schedule s;
  s.kind = kind;
  s.num_ranks = num_ranks;
  s.virtual_stages = virtual_stages;
  s.num_microbatches = num_microbatches;
  s.stage_to_rank = LoopedStageToRank(num_ranks, virtual_stages);
  s.ranks.resize(num_ranks);
  return s;
}

Action F(int stage, int mb) { return Action{ActionKind::kForward, stage, mb}; }
Action B(int stage, int mb) { return Action{ActionKind::kBackward, stage, mb}; }
Action I(int stage, int mb) { return Action{ActionKind::kBackwardInput, stage, mb}; }
Action W(int stage, int mb) { return Action{ActionKind::kBackwardWeight, stage, mb}; }

}  // namespace

absl::Status CheckScheduleOptions(const ScheduleOptions& o) {
  const ScheduleEntry& entry = ScheduleEntryOf(o.kind);
  const char* name = entry.name;
  if (o.kind == ScheduleKind::kCustom) {
    return absl::InvalidArgumentError(
        "schedule custom has no generator: custom schedules are imported from CSV");
  }
  if (o.num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages must be at least 1 (--stages, pipeline.stages), got ", o.num_ranks));
  }
  if (o.virtual_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual stages must be at least 1 (--virtual, pipeline.virtual_stages), got ",
                     o.virtual_stages));
  }
  if (o.num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batches must be at least 1 (--microbatches, pipeline.microbatches), got ",
        o.num_microbatches));
  }
  if (o.num_ranks > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages (--stages) must be at most ", kMaxRanks, ", got ", o.num_ranks));
  }
  if (entry.placement == ChunkPlacement::kV) {
    if (o.virtual_stages > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " places exactly two chunks per rank in a V: virtual stages (--virtual, "
          "pipeline.virtual_stages) must be 2 (or unset), got ", o.virtual_stages));
    }
    const int min_m = entry.min_microbatches_per_rank * o.num_ranks;
    if (o.num_microbatches < min_m) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " needs at least ",
          entry.min_microbatches_per_rank == 1
              ? "as many micro-batches as stages"
              : absl::StrCat(entry.min_microbatches_per_rank, " x as many micro-batches as stages"),
          " (its V fills the pipeline from both ends; with fewer most of it idles): "
          "--microbatches ",
          o.num_microbatches, " is below ",
          entry.min_microbatches_per_rank == 1
              ? ""
              : absl::StrCat(entry.min_microbatches_per_rank, " x "),
          "--stages ", o.num_ranks, " (pipeline.microbatches, pipeline.stages); use 1f1b or ",
          min_m, " or more"));
    }
  }
  const int64_t chunks = static_cast<int64_t>(o.num_ranks) *
                         (entry.placement == ChunkPlacement::kV ? 2 : o.virtual_stages);
  if (chunks * o.num_microbatches > kMaxCells) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages x virtual stages x micro-batches = ", chunks * o.num_microbatches,
                     " is more than this planner handles (", kMaxCells, ")"));
  }
  if (entry.placement == ChunkPlacement::kLooped) {
    if (o.virtual_stages < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("interleaved-1f1b needs at least 2 virtual stages per rank (--virtual, "
                       "pipeline.virtual_stages), got ",
                       o.virtual_stages, "; with one chunk per rank use 1f1b"));
    }
    if (o.num_microbatches % o.num_ranks != 0) {
      const int lo = o.num_microbatches / o.num_ranks * o.num_ranks;
      const int hi = lo + o.num_ranks;
      return absl::InvalidArgumentError(absl::StrCat(
          "interleaved-1f1b needs the micro-batch count to be a multiple of the stage count "
          "(Megatron's interleaved order runs the chunks S micro-batches at a time): "
          "--microbatches ",
          o.num_microbatches, " is not a multiple of --stages ", o.num_ranks, "; use ",
          lo > 0 ? absl::StrCat(lo, " or ") : "", hi));
    }
  } else if (entry.placement == ChunkPlacement::kOne && o.virtual_stages != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        " runs one stage per rank: virtual stages (--virtual, pipeline.virtual_stages) "
        "must be 1, got ",
        o.virtual_stages, "; only interleaved-1f1b takes more (zb-v and v-half take two)"));
  }
  if (o.num_blocks > 0 && chunks > o.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages x virtual stages = ", o.num_ranks, " x ", chunks / o.num_ranks, " = ",
                     chunks, " pipeline chunks, but the model has only ", o.num_blocks,
                     " blocks; every chunk needs at least one block"));
  }
  return absl::OkStatus();
}

OneFOneBPhases OneFOneBPhasesFor(int num_ranks, int rank, int num_microbatches) {
  OneFOneBPhases p;
  p.warmup = std::min(num_ranks - rank - 1, num_microbatches);
  p.steady = num_microbatches - p.warmup;
  p.cooldown = p.warmup;
  return p;
}

// Megatron's interleaved order. A rank's forwards are numbered k = 0 .. V*M-1; they run in
// groups of S*V: within a group, chunk 0 for S consecutive micro-batches, then chunk 1 for
// the same S micro-batches, and so on; the next group takes the next S micro-batches.
// Backwards use the same numbering with the chunks reversed (the last chunk's gradient is
// ready first). For S = 2, V = 2, M = 4:
//
//     k          0  1  2  3  4  5  6  7
//     chunk (F)  0  0  1  1  0  0  1  1     stage = chunk*S + rank
//     chunk (B)  1  1  0  0  1  1  0  0
//     mb         0  1  0  1  2  3  2  3
//
// Because a group covers S micro-batches, M must be a multiple of S: otherwise the last
// group would be short and the ranks' orders would no longer line up.
InterleavedSlot InterleavedForwardSlot(int k, int num_ranks, int virtual_stages) {
  const int group_size = num_ranks * virtual_stages;
  const int group = k / group_size;
  const int within = k % group_size;
  return InterleavedSlot{within / num_ranks, group * num_ranks + within % num_ranks};
}

InterleavedSlot InterleavedBackwardSlot(int k, int num_ranks, int virtual_stages) {
  InterleavedSlot s = InterleavedForwardSlot(k, num_ranks, virtual_stages);
  s.chunk = virtual_stages - 1 - s.chunk;
  return s;
}

int InterleavedWarmup(int num_ranks, int rank, int virtual_stages, int num_microbatches) {
  const int64_t total = static_cast<int64_t>(virtual_stages) * num_microbatches;
  const int64_t warm = static_cast<int64_t>(num_ranks - rank - 1) * 2 +
                       static_cast<int64_t>(virtual_stages - 1) * num_ranks;
  return static_cast<int>(std::min(warm, total));
}

Schedule GenerateGpipe(int num_ranks, int num_microbatches) {
  Schedule s = Empty(ScheduleKind::kGpipe, num_ranks, 1, num_microbatches);
  for (int r = 0; r < num_ranks; ++r) {
    auto& clock = s.ranks[r];
    clock.reserve(2 * num_microbatches);
    for (int m = 0; m < num_microbatches; ++m) clock.push_back(F(r, m));
    for (int m = 0; m < num_microbatches; ++m) clock.push_back(B(r, m));
  }
  return s;
}

Schedule Generate1F1B(int num_ranks, int num_microbatches) {
  Schedule s = Empty(ScheduleKind::k1F1B, num_ranks, 1, num_microbatches);
  for (int r = 0; r < num_ranks; ++r) {
    const OneFOneBPhases p = OneFOneBPhasesFor(num_ranks, r, num_microbatches);
    auto& clock = s.ranks[r];
    clock.reserve(2 * num_microbatches);
    int f = 0;
    int b = 0;
    for (int i = 0; i < p.warmup; ++i) clock.push_back(F(r, f++));
    for (int i = 0; i < p.steady; ++i) {
      clock.push_back(F(r, f++));
      clock.push_back(B(r, b++));
    }
    for (int i = 0; i < p.cooldown; ++i) clock.push_back(B(r, b++));
  }
  return s;
}

Schedule GenerateInterleaved1F1B(int num_ranks, int virtual_stages, int num_microbatches) {
  Schedule s = Empty(ScheduleKind::kInterleaved1F1B, num_ranks, virtual_stages, num_microbatches);
  const int total = virtual_stages * num_microbatches;
  for (int r = 0; r < num_ranks; ++r) {
    auto fwd = [&](int k) {
      const InterleavedSlot slot = InterleavedForwardSlot(k, num_ranks, virtual_stages);
      return F(slot.chunk * num_ranks + r, slot.microbatch);
    };
    auto bwd = [&](int k) {
      const InterleavedSlot slot = InterleavedBackwardSlot(k, num_ranks, virtual_stages);
      return B(slot.chunk * num_ranks + r, slot.microbatch);
    };
    const int warmup = InterleavedWarmup(num_ranks, r, virtual_stages, num_microbatches);
    const int steady = total - warmup;
    auto& clock = s.ranks[r];
    clock.reserve(2 * total);
    for (int k = 0; k < warmup; ++k) clock.push_back(fwd(k));
    for (int i = 0; i < steady; ++i) {
      clock.push_back(fwd(warmup + i));
      clock.push_back(bwd(i));
    }
    for (int i = steady; i < total; ++i) clock.push_back(bwd(i));
  }
  return s;
}

// ZB-H1: 1F1B's warm-up and steady state with the backward split into I and W. Rank r
// starts issuing Ws after its (r+1)-th I, one W after each I, which keeps at most S
// micro-batches awaiting W; the Ws left over fill the cool-down, where 1F1B idles.
Schedule GenerateZbH1(int num_ranks, int num_microbatches) {
  Schedule s = Empty(ScheduleKind::kZbH1, num_ranks, 1, num_microbatches);
  const int m = num_microbatches;
  for (int r = 0; r < num_ranks; ++r) {
    auto& clock = s.ranks[r];
    clock.reserve(3 * m);
    const int warmup = std::min(num_ranks - r - 1, m);
    int f = 0;
    int i = 0;
    int w = 0;
    while (f < warmup) clock.push_back(F(r, f++));
    while (i < m) {
      if (f < m) clock.push_back(F(r, f++));
      clock.push_back(I(r, i++));
      if (i > r && w < i) clock.push_back(W(r, w++));
    }
    while (w < m) clock.push_back(W(r, w++));
  }
  return s;
}

namespace {

// The V schedules' clocks, by list scheduling on a unit-cost timeline: F, I and W each take
// one unit; at every tick each idle rank runs its most urgent ready action:
//   1. an input gradient (I): on the critical path, and it unblocks the rank before;
//   2. a forward (F), if the rank holds fewer than `cap` micro-batch chunks with
//      activations (F run, W not yet); a first-chunk forward (stage < S) also leaves one
//      slot free, so that the V's second chunk can always take the micro-batch the rank
//      let in (without that reserve the first chunk can fill the rank and deadlock it);
//   3. a weight gradient (W), which fills what would be a bubble.
// Within a kind: the lowest micro-batch first, then the later stage. Each stage runs its
// F, I and W in ascending micro-batch order (generators.h). The reserve makes it
// deadlock-free: the earliest unfinished micro-batch can always move (its first-chunk
// forwards find empty ranks, its second-chunk forwards the reserved slot, and I and W need
// no slot).
Schedule GenerateV(ScheduleKind kind, int num_ranks, int num_microbatches, int cap) {
  const int S = num_ranks, M = num_microbatches, stages = 2 * num_ranks;
  Schedule out;
  out.kind = kind;
  out.num_ranks = S;
  out.virtual_stages = 2;
  out.num_microbatches = M;
  out.stage_to_rank = VShapeStageToRank(S);
  out.ranks.resize(S);
  // done[k][s][m]: the tick its action k (0 F, 1 I, 2 W) of (s, m) finished; -1 before.
  std::vector<std::vector<std::vector<int64_t>>> done(
      3, std::vector<std::vector<int64_t>>(stages, std::vector<int64_t>(M, -1)));
  std::vector<std::vector<int>> next(3, std::vector<int>(stages, 0));  // next micro-batch
  std::vector<int> inflight(S, 0);
  std::vector<int64_t> busy_until(S, 0);
  struct Running {
    int kind, stage, mb;
  };
  std::vector<std::vector<Running>> finishing(S);  // what each rank finishes at busy_until
  int64_t remaining = int64_t{3} * stages * M;
  auto finished = [&](int k, int s, int m, int64_t t) {
    return m >= 0 && m < M && done[k][s][m] >= 0 && done[k][s][m] <= t;
  };
  for (int64_t t = 0; remaining > 0; ++t) {
    // Retire what finishes now, so that every rank sees it at this tick.
    for (int r = 0; r < S; ++r) {
      if (busy_until[r] != t) continue;
      for (const Running& x : finishing[r]) {
        done[x.kind][x.stage][x.mb] = t;
        if (x.kind == 2) --inflight[r];
      }
      finishing[r].clear();
    }
    bool any_running = false;
    for (int r = 0; r < S; ++r) {
      if (busy_until[r] > t) {
        any_running = true;
        continue;
      }
      const int own[2] = {r, stages - 1 - r};  // the rank's two stages
      int best_kind = -1, best_stage = -1, best_mb = 0;
      auto consider = [&](int k, int s) {
        const int m = next[k][s];
        if (m >= M) return;
        bool ready = false;
        if (k == 0) {
          const bool first_chunk = s < S;
          ready = (s == 0 || finished(0, s - 1, m, t)) &&
                  inflight[r] < (first_chunk ? cap - 1 : cap);
        } else if (k == 1) {
          ready = finished(0, s, m, t) && (s == stages - 1 || finished(1, s + 1, m, t));
        } else {
          ready = finished(1, s, m, t);
        }
        if (!ready) return;
        const bool better = best_kind < 0 || k < best_kind ||
                            (k == best_kind && (m < best_mb || (m == best_mb && s > best_stage)));
        if (better) {
          best_kind = k;
          best_stage = s;
          best_mb = m;
        }
      };
      // Priority by kind: I, then F, then W.
      for (int k : {1, 0, 2}) {
        for (int s : own) consider(k, s);
        if (best_kind >= 0) break;
      }
      if (best_kind < 0) continue;
      const int s = best_stage, m = best_mb;
      ++next[best_kind][s];
      if (best_kind == 0) ++inflight[r];
      const Action a = best_kind == 0 ? F(s, m) : best_kind == 1 ? I(s, m) : W(s, m);
      out.ranks[r].push_back(a);
      busy_until[r] = t + 1;
      finishing[r].push_back(Running{best_kind, s, m});
      --remaining;
      any_running = true;
    }
    if (!any_running) break;  // cannot happen (see above); Validate would refuse the clock
  }
  return out;
}

}  // namespace

Schedule GenerateZbV(int num_ranks, int num_microbatches) {
  // 1F1B's activation memory: its rank 0 holds S micro-batches of a whole stage, that is 2S
  // chunks of half a stage.
  return GenerateV(ScheduleKind::kZbV, num_ranks, num_microbatches, 2 * num_ranks);
}

Schedule GenerateVHalf(int num_ranks, int num_microbatches) {
  return GenerateV(ScheduleKind::kVHalf, num_ranks, num_microbatches, num_ranks + 1);
}

// DualPipeV, rank by rank in the eight steps of the DualPipe repository's dualpipev.py
// (chunk 0 is the rank's stage r, chunk 1 its stage 2S-1-r; "F0" is the next forward of
// chunk 0, and so on):
//   1. 2(S-r-1) x  F0
//   2. r+1      x  F0 F1
//   3. S-r-1    x  I1 W1 F1            (zero bubble: the W right after its I)
//   4. M-2S+r+1 x  F0 B1 F1 B0         (the steady state: each F paired with the other
//                                       chunk's B; the source overlaps each pair in one
//                                       fused kernel, baton runs it in sequence)
//   5. S-r-1    x  B1 F1 B0
//   6. r+1      x  B1 B0               (the second half of them split into I, W deferred)
//   7. S-r-1    x  W I0
//   8. r+1      x  W
// A deferred W is the oldest I's (the source's weight-gradient queue, first in first out),
// so every stage's weight gradients still accumulate in micro-batch order: its full
// backwards all come before its first deferred I. M >= 2S makes step 4 non-negative.
Schedule GenerateDualPipeV(int num_ranks, int num_microbatches) {
  const int S = num_ranks, M = num_microbatches;
  Schedule out;
  out.kind = ScheduleKind::kDualPipeV;
  out.num_ranks = S;
  out.virtual_stages = 2;
  out.num_microbatches = M;
  out.stage_to_rank = VShapeStageToRank(S);
  out.ranks.resize(S);
  for (int r = 0; r < S; ++r) {
    std::vector<Action>& clock = out.ranks[r];
    clock.reserve(6 * M);
    const int stage[2] = {r, 2 * S - 1 - r};
    int next_f[2] = {0, 0};
    int next_b[2] = {0, 0};
    std::deque<Action> deferred;  // Ws whose I ran, oldest first
    auto fwd = [&](int c) { clock.push_back(F(stage[c], next_f[c]++)); };
    auto bwd = [&](int c, bool split) {
      const int m = next_b[c]++;
      if (!split) {
        clock.push_back(B(stage[c], m));
        return;
      }
      clock.push_back(I(stage[c], m));
      deferred.push_back(W(stage[c], m));
    };
    auto weight = [&] {
      clock.push_back(deferred.front());
      deferred.pop_front();
    };
    const int before = S - r - 1;  // ranks after this one
    for (int i = 0; i < 2 * before; ++i) fwd(0);
    for (int i = 0; i < r + 1; ++i) {
      fwd(0);
      fwd(1);
    }
    for (int i = 0; i < before; ++i) {
      bwd(1, true);
      weight();
      fwd(1);
    }
    for (int i = 0; i < M - 2 * S + r + 1; ++i) {
      fwd(0);
      bwd(1, false);
      fwd(1);
      bwd(0, false);
    }
    for (int i = 0; i < before; ++i) {
      bwd(1, false);
      fwd(1);
      bwd(0, false);
    }
    // Half of step 6's backwards split, from the middle on; odd ranks start one earlier.
    bool split = false;
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      bwd(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      bwd(0, split);
    }
    for (int i = 0; i < before; ++i) {
      weight();
      bwd(0, true);
    }
    while (!deferred.empty()) weight();
  }
  return out;
}

absl::StatusOr<Schedule> GenerateComputeSchedule(const ScheduleOptions& o) {
  BATON_RETURN_IF_ERROR(CheckScheduleOptions(o));
  const ScheduleEntry& entry = ScheduleEntryOf(o.kind);
  if (entry.generate == nullptr) {
    return absl::InvalidArgumentError("no generator for this schedule kind");
  }
  return entry.generate(o.num_ranks, o.virtual_stages, o.num_microbatches);
}

absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& o) {
  BATON_ASSIGN_OR_RETURN(Schedule compute, GenerateComputeSchedule(o));
  BATON_ASSIGN_OR_RETURN(Schedule lowered, Lower(compute));
  BATON_RETURN_IF_ERROR(Validate(lowered));
  return lowered;
}

}  // namespace baton
