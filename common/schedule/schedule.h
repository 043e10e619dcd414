// Schedules ("clocks"): per rank, the ordered actions of one training step.
//
// A Schedule is plain data. Generators (generators.h) write compute actions only (F, B,
// I, W); Lower() inserts the communication (SEND_*/RECV_*) and the final STEP, so no
// generator hand-writes a send. Validate() (validate.h) proves a lowered schedule safe
// before anyone runs it; Simulate() predicts its timeline.
#ifndef BATON_COMMON_SCHEDULE_SCHEDULE_H_
#define BATON_COMMON_SCHEDULE_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/action.h"

namespace baton {

enum class ScheduleKind : uint8_t {
  kGpipe,
  k1F1B,
  kInterleaved1F1B,
  kZbH1,
  kZbV,
  kVHalf,
  kDualPipeV,
  kCustom,  // imported from CSV
};

// The name and the parser of the schedule table (vocabulary.h): "gpipe", "1f1b", ...;
// an unknown name is INVALID_ARGUMENT listing the known ones.
const char* ScheduleKindName(ScheduleKind k);
absl::StatusOr<ScheduleKind> ParseScheduleKind(const std::string& name);

struct Schedule {
  ScheduleKind kind = ScheduleKind::kCustom;
  int num_ranks = 0;           // S
  int virtual_stages = 1;      // V: stages (chunks) per rank
  int num_microbatches = 0;    // M
  // stage_to_rank[s] is the rank that runs global stage s; size S*V.
  std::vector<int> stage_to_rank;
  // ranks[r] is rank r's clock, in execution order.
  std::vector<std::vector<Action>> ranks;

  int num_stages() const { return static_cast<int>(stage_to_rank.size()); }
  bool lowered() const;        // has any communication or STEP action
  bool reduces_grads() const;  // has REDUCE_GRAD actions (a data-parallel clock)
  bool ties_grads() const;     // has TIE_GRAD actions (a model with tied embeddings)
  bool clips_grads() const;    // has CLIP_GRAD actions (optimizer.clip_grad_norm > 0)
};

// The usual placement: stage s on rank s % S (V chunks per rank, looping; Megatron's
// interleaved placement, and the identity for V = 1).
std::vector<int> LoopedStageToRank(int num_ranks, int virtual_stages);
// The V placement of ZB-V, V-Half and DualPipeV: two chunks per rank, stage s on rank s for s < S and
// on rank 2S-1-s after, so rank 0 holds the first and the last stage.
std::vector<int> VShapeStageToRank(int num_ranks);

// Inserts communication and the final STEP into a compute-only schedule:
//  - after F(s, m), if stage s+1 lives on another rank: SEND_F(s, m) on this rank, and
//    RECV_F(s+1, m) on that rank immediately before its F(s+1, m);
//  - after the input-gradient action (B or I) of (s, m), if stage s-1 lives on another
//    rank: SEND_B(s, m) here, and RECV_B(s-1, m) there immediately before its B or I of
//    (s-1, m);
//  - receives keep each peer's send order (NCCL matches point-to-point messages in order):
//    if a rank consumes two messages from one peer in the opposite order to the one they
//    were sent in, it receives the earlier-sent one early, just before the receive it needs;
//  - STEP at the end of every rank.
// Stages on the same rank hand tensors over locally, without actions.
// Errors if the schedule is already lowered or malformed (stage out of range).
absl::StatusOr<Schedule> Lower(const Schedule& compute_only);

// Data parallelism: every replica of the pipeline runs the same clock, and each stage's
// gradients are summed across its replicas once they are complete. Inserts
// REDUCE_GRAD(s) on the rank of every stage s right after the action that completes its
// weight gradients (its last B or W, and the SEND_B that follows a B), so the reduction
// starts as early as it can and overlaps the rank's remaining actions. Errors if `lowered`
// is not lowered, already reduces, or a stage has no backward.
absl::StatusOr<Schedule> AddGradReductions(const Schedule& lowered);

// Tied embeddings (action.h): inserts TIE_GRAD(0) on the rank of the first stage and
// TIE_GRAD(S*V-1) on the rank of the last, each right before that rank's STEP (after
// every other action, its REDUCE_GRADs included, so the two ends' earlier messages all
// precede the exchange); one TIE_GRAD(0) when there is one stage. Errors if `lowered` is
// not lowered, already ties, or a rank's clock does not end with STEP.
absl::StatusOr<Schedule> AddTiedGradSums(const Schedule& lowered);

// Gradient clipping (action.h): inserts CLIP_GRAD on every rank right before its STEP
// (after its TIE_GRAD and REDUCE_GRADs: the norm is of the final gradients). Errors if
// `lowered` is not lowered, already clips, or a rank's clock does not end with STEP.
absl::StatusOr<Schedule> AddGradClips(const Schedule& lowered);

// PyTorch's CSV form: one row per rank, one action string per cell, in order. STEP is not
// written. Import of a compute-only CSV lowers it; import of a lowered CSV keeps its
// communication as written and appends STEP. The header-less CSV carries no S/V/M: they
// are inferred (ranks = rows; stages = max stage + 1; M = max micro-batch + 1) and the
// stage-to-rank map is read off the rows (each stage must appear on exactly one rank).
// Every rank must hold the same number of stages (V = stages / ranks). Empty cells and
// "None" (PyTorch's idle slots) are skipped.
std::string ToCsv(const Schedule& s);
absl::StatusOr<Schedule> FromCsv(const std::string& csv);

}  // namespace baton

#endif  // BATON_COMMON_SCHEDULE_SCHEDULE_H_
