// The exchanges between ranks that finish a step's gradients before STEP: the tied
// embedding's sum (TIE_GRAD) and the global gradient norm's clipping (CLIP_GRAD), as the
// stage executor describes them (stage_executor.h). Each is a blocking exchange over the
// pipeline's Transport on the caller's thread; it takes the gradients as final (the
// caller has run every weight gradient and waited for the replica sums) and adds the
// payload bytes it moved to `*bytes`.
#ifndef BATON_COMMON_PIPELINE_GRADIENT_EXCHANGE_H_
#define BATON_COMMON_PIPELINE_GRADIENT_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/comm/transport.h"
#include "common/core/tensor.h"
#include "common/nn/module.h"
#include "common/schedule/action.h"
#include "common/schedule/schedule.h"

namespace baton {

// Where an exchange's messages go, and by when: every send and receive fails at
// `deadline`. Tags name the job and the training step.
struct ExchangeLink {
  Transport* transport = nullptr;  // not owned
  uint64_t job_id = 0;
  int64_t step = 0;
  absl::Time deadline;
};

// Whether rank `rank`'s clock in `schedule` has the exchanges the job needs
// (AddJobActions): CLIP_GRAD exactly when the optimizer clips (`clips`), on every rank, and
// TIE_GRAD on each end stage the rank holds exactly when the model ties its embeddings
// (`tied`). INVALID_ARGUMENT naming the action missing or extra. A rank outside the
// schedule passes (the caller checks the rank).
absl::Status CheckExchangeActions(const Schedule& schedule, int rank, bool clips, bool tied);

// TIE_GRAD `a` with the other end on another rank (`peer`, holding stage `other_stage`):
// `mine` is this end's copy, the embedding on stage 0 or the output projection on the
// last stage, its gradient on `device`. Afterwards both ends hold embedding's + output
// projection's gradient, the same bits (SumTiedGradients, model.h). Stage 0 sends and then
// receives, the last stage the reverse, so the pair never waits on each other; the sum is
// written only once this rank's part has left.
absl::Status SumTiedGradientWithPeer(const Action& a, int other_stage, int peer, Parameter& mine,
                                     Device device, const ExchangeLink& link, int64_t* bytes);

// A model block this rank holds, with its index in the model.
struct IndexedBlock {
  size_t index = 0;
  Module* block = nullptr;
};

// What CLIP_GRAD needs of a rank.
struct ClipInputs {
  int rank = 0;  // in the chain 0 .. num_ranks-1 the norm's parts travel along
  int num_ranks = 1;
  size_t num_blocks = 0;             // the model's (ModelBlockCount)
  std::vector<IndexedBlock> blocks;  // this rank's, in any order
  bool tied = false;               // the model ties its embeddings: its output copy does not count
  float max_norm = 0.0f;           // optimizer.clip_grad_norm
  std::vector<Parameter*> params;  // this rank's parameters, whose gradients are scaled
  // When set, this rank's parts, one per entry of `blocks` (a sharded optimizer computes
  // them from every owner's squares); otherwise BlockGradSquares of the blocks.
  std::optional<std::vector<double>> block_squares;
};

// CLIP_GRAD `a`: the global gradient norm from every rank's block parts (BlockGradSquares)
// summed in block order by the last rank and sent back down the chain, then this rank's
// gradients scaled by ClipFromSquaredNorm's coefficient when it clips. Every rank of the
// step calls it. Returns the norm before clipping, the same on every rank; DIVERGED
// (DivergedError) when the norm is not finite, with nothing scaled.
absl::StatusOr<float> ClipGradients(const Action& a, const ClipInputs& in, const ExchangeLink& link,
                                    int64_t* bytes);

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_GRADIENT_EXCHANGE_H_
