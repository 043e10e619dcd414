// Schedule generators: the pipeline schedules baton knows by name.
//
// A generator writes compute actions only (F, B, I, W) for S ranks, V model chunks per rank
// (stages 0..S*V-1, stage s on rank s % S) and M micro-batches; Lower() (schedule.h) adds
// the communication. BuildSchedule() = generate + Lower + Validate: what callers use.
//
//   gpipe             all forwards, then all backwards. Peak in-flight M on every rank;
//                     bubble (S-1)/(M+S-1) with unit costs.
//   1f1b              PipeDream-Flush: warm-up forwards, steady one-forward-one-backward,
//                     cool-down backwards (OneFOneBPhases). Rank r holds at most
//                     min(S-r, M) micro-batches; bubble (S-1)/(M+S-1).
//   interleaved-1f1b  Megatron-LM's interleaved 1F1B with V >= 2 chunks per rank; needs M to
//                     be a multiple of S. Peak min((S-r-1)*2 + (V-1)*S + 1, V*M) chunks on
//                     rank r; bubble (S-1)/(V*M+S-1).
//   zb-h1             Zero Bubble H1 (Qi et al. 2024): backward split into I (input
//                     gradient, on the critical path) and W (weight gradient), the Ws
//                     filling 1F1B's cool-down bubbles. At most S micro-batches await W on
//                     any rank (the paper's bound is S+1); for M >= S and unit costs the
//                     makespan is 3M+S-1, idle (S-1)*(F+I-W) per rank.
//
// Every generator emits each stage's B (or W) actions in ascending micro-batch order, and
// its I actions too: gradients accumulate into the weights in micro-batch order 0..M-1, the
// same order as the reference trainer, which the runtime relies on for bit-exact weights.
// New generators (ZB-V, DualPipeV: V-shaped stage placement, see docs/schedules.md) must
// keep that property.
#ifndef BATON_COMMON_SCHEDULE_GENERATORS_H_
#define BATON_COMMON_SCHEDULE_GENERATORS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/schedule/schedule.h"

namespace baton {

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int num_ranks = 1;         // S (--stages, pipeline.stages)
  int virtual_stages = 1;    // V (--virtual, pipeline.virtual_stages)
  int num_microbatches = 1;  // M (--microbatches, pipeline.microbatches)
  // The model's block count when known (> 0): S*V chunks need at least S*V blocks. 0: not
  // checked.
  int64_t num_blocks = 0;
};

// Checks `o` for the generator it names. INVALID_ARGUMENT, naming the flag and spec field,
// when S, V or M is below 1; V != 1 outside interleaved-1f1b; V < 2 or M not a multiple of
// S for interleaved-1f1b; S*V above num_blocks; sizes beyond the library's limits; or kind
// custom (custom schedules come from FromCsv).
absl::Status CheckScheduleOptions(const ScheduleOptions& o);

// The compute-only schedule `o` names (stage_to_rank = LoopedStageToRank(S, V)).
absl::StatusOr<Schedule> GenerateComputeSchedule(const ScheduleOptions& o);

// GenerateComputeSchedule, Lower, Validate: a lowered schedule proven safe.
absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& o);

// The three phases of 1F1B on one rank: `warmup` forwards, `steady` (forward, backward)
// pairs, then `cooldown` backwards. warmup = cooldown = min(S-rank-1, M); steady = M-warmup.
struct OneFOneBPhases {
  int warmup = 0;
  int steady = 0;
  int cooldown = 0;
};
OneFOneBPhases OneFOneBPhasesFor(int num_ranks, int rank, int num_microbatches);

// Interleaved 1F1B's order: the k-th forward (or backward) a rank runs works on model chunk
// `chunk` (stage chunk*S + rank) and micro-batch `microbatch` (see generators.cc).
struct InterleavedSlot {
  int chunk = 0;
  int microbatch = 0;
};
InterleavedSlot InterleavedForwardSlot(int k, int num_ranks, int virtual_stages);
InterleavedSlot InterleavedBackwardSlot(int k, int num_ranks, int virtual_stages);
// Forwards rank r runs before its first backward: min((S-r-1)*2 + (V-1)*S, V*M).
int InterleavedWarmup(int num_ranks, int rank, int virtual_stages, int num_microbatches);

// The generators themselves (compute-only; options already checked).
Schedule GenerateGpipe(int num_ranks, int num_microbatches);
Schedule Generate1F1B(int num_ranks, int num_microbatches);
Schedule GenerateInterleaved1F1B(int num_ranks, int virtual_stages, int num_microbatches);
Schedule GenerateZbH1(int num_ranks, int num_microbatches);

}  // namespace baton

#endif  // BATON_COMMON_SCHEDULE_GENERATORS_H_
