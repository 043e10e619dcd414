// What one step of the stage executor holds between its actions (stage_executor.cc):
// the tensors in flight on this rank, keyed by (stage, micro-batch), and the step's
// bookkeeping. One thread (the executor's) uses it.
#ifndef BATON_COMMON_PIPELINE_STEP_STATE_H_
#define BATON_COMMON_PIPELINE_STEP_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/comm/transport.h"
#include "common/core/tensor.h"
#include "common/data/dataset.h"
#include "common/nn/module.h"
#include "common/pipeline/action_timing.h"
#include "common/schedule/action.h"

namespace baton {

// Everything one step holds, keyed by (stage, micro-batch). Tensors are dropped as soon as
// they are sent or consumed.
class StepState {
 public:
  StepState(int64_t step, int num_microbatches) : step(step), M(num_microbatches) {}

  static int64_t Key(int stage, int mb) { return (static_cast<int64_t>(stage) << 32) | mb; }

  // Removes and returns the tensor under (stage, mb), or an error naming what is missing.
  absl::StatusOr<Tensor> Take(std::unordered_map<int64_t, Tensor>& map, int stage, int mb,
                              const char* what, const Action& a) {
    auto it = map.find(Key(stage, mb));
    if (it == map.end()) {
      return absl::FailedPreconditionError(absl::StrCat(a.ToString(), ": no ", what, " for stage ",
                                                        stage, " micro-batch ", mb,
                                                        " (the clock runs it too early)"));
    }
    Tensor t = std::move(it->second);
    map.erase(it);
    return t;
  }

  // OK once every weight gradient of `stage` has run this step; otherwise
  // FAILED_PRECONDITION saying that `what` came before them.
  absl::Status WeightGradientsRan(int stage, absl::string_view what) {
    const int done = next_w[stage];
    if (done == M) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        what, " before every weight gradient of stage ", stage, " ran (", done, " of ", M, ")"));
  }

  const int64_t step;
  const int M;
  std::unordered_map<int, Batch> batches;               // by micro-batch
  std::unordered_map<int64_t, Tensor> activations_in;   // received input of (s, m)
  std::unordered_map<int64_t, Tensor> activations_out;  // output of (s, m) not yet handed on
  std::unordered_map<int64_t, Tensor> gradients_in;     // received dL/d(output) of (s, m)
  std::unordered_map<int64_t, Tensor> gradients_out;    // dL/d(input) of (s, m) not yet sent
  // RECOMPUTE_FULL: the input (and, on the last stage, the targets) of (s, m), kept from its
  // forward to its backward, which reruns the forward from them.
  struct Kept {
    Tensor input;
    Tensor targets;
  };
  std::unordered_map<int64_t, Kept> kept;
  std::unordered_map<int, std::set<int>> deferred_w;  // stage -> micro-batches waiting
  std::unordered_map<int, int> next_w;                // stage -> next micro-batch to W
  std::vector<std::pair<Action, std::unique_ptr<SendWork>>> sends;  // in clock order
  // Last stage only: each micro-batch's loss as its module wrote it (on the device), read
  // once the step's work is issued.
  std::vector<Tensor> losses;
  std::vector<ActionTiming> reductions;  // filled when STEP has waited for them
  int64_t reduce_wait_ns = 0;
  // Data parallelism: per chunk (the executor's index), its buckets queued so far.
  std::unordered_map<size_t, size_t> buckets_queued;
  int inflight = 0;
  int peak_inflight = 0;
  bool tied = false;               // the tied embedding's gradient is summed (TIE_GRAD)
  std::optional<float> grad_norm;  // CLIP_GRAD's norm, once it ran
  float learning_rate = 0.0f;      // STEP's
  bool stepped = false;
};

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_STEP_STATE_H_
