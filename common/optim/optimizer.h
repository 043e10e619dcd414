// Optimizers over a set of parameters, with per-parameter state, and the rest of the
// training recipe (docs/training.md): the learning-rate schedule, the weight-decay scope,
// and the pieces of global-norm gradient clipping.
//
// A pipeline stage creates one optimizer over the parameters of its own blocks; because
// every update is element-wise and per parameter, a stage's update equals the reference
// trainer's update of the same parameters, bit for bit. Everything here that decides a
// number every rank must agree on (the step's learning rate, which parameters decay, the
// clipping coefficient) is a pure function of the spec and of values every rank holds.
#ifndef BATON_COMMON_OPTIM_OPTIMIZER_H_
#define BATON_COMMON_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/nn/module.h"

namespace baton {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' current gradients (it does not zero them), at
  // learning rate `lr` (LearningRateAt of the step).
  virtual void Step(float lr) = 0;
  int64_t steps_taken() const { return steps_; }

  // One state tensor of one parameter, named as PyTorch's optimizers name it
  // ("momentum_buffer"; "exp_avg", "exp_avg_sq"). `state` is the optimizer's own tensor: a
  // checkpoint reads it, a resume writes it.
  struct Slot {
    Parameter* param = nullptr;
    std::string name;
    Tensor* state = nullptr;
  };
  // Every slot, parameter by parameter in the order given at construction.
  virtual std::vector<Slot> Slots() = 0;
  // Restores the count of updates taken, with the slots: a resumed run then continues
  // AdamW's bias correction and SGD's first-step momentum rule where the checkpoint left
  // them.
  void set_steps_taken(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;
};

// Builds the optimizer a validated spec names, over `params` (not owned; they must outlive
// the optimizer). Weight decay applies to the parameters DecaysWeight selects under
// spec.weight_decay_scope; `tied_embeddings` says whether the model's output projection is
// its token embedding (TokenModel::tie_embeddings). Its state lives on the parameters'
// device (they share one) and is allocated here, once: RESOURCE_EXHAUSTED naming the
// parameter when the device is full, INVALID_ARGUMENT when the parameters are on different
// devices.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const baton::v1::OptimizerSpec& spec,
                                                         std::vector<Parameter*> params,
                                                         bool tied_embeddings);

// The names of the state slots the optimizer a spec names keeps per parameter, in Slots'
// order: AdamW {exp_avg, exp_avg_sq}, SGD with momentum {momentum_buffer}, else none.
std::vector<std::string> OptimizerSlotNames(const baton::v1::OptimizerSpec& spec);

// ---- The learning-rate schedule ----

// The algorithm's learning_rate: the schedule's peak.
float PeakLearningRate(const baton::v1::OptimizerSpec& spec);
// The learning rate of step `step` (0-based) of a job of `total_steps` steps, under
// spec.lr_schedule (docs/training.md has the formulas and their edge cases), computed in
// double and rounded to float once: every rank and the reference trainer get the same bits.
// W = warmup_steps, N = total_steps, peak, min = min_lr:
//   s < W:      peak * (s + 1) / W
//   CONSTANT:   peak
//   COSINE:     min + 0.5 * (1 + cos(pi * p)) * (peak - min),  p = (s - W) / (N - W)
//   LINEAR:     peak - (peak - min) * p
//   WSD:        peak - (peak - min) * q,  q = (s - (N - D)) / D,  D = decay_steps
// (after warmup in every case). p and q are clamped to [0, 1]: each decay starts at the
// peak and would reach min at s = N, one past the last step, as torch's schedulers with
// T_max = N - W do. When N - W <= 0, p = 1; when D = 0, q = 0 (WSD never decays). A spec
// without lr_schedule is CONSTANT without warmup.
float LearningRateAt(const baton::v1::OptimizerSpec& spec, int64_t step, int64_t total_steps);

// ---- Weight-decay scope ----

// Whether weight decay applies to parameter `name` of shape `shape` under `scope`:
//  MATRICES (the default): parameters of two or more dimensions that are not an embedding
//    table ("embed.token", "embed.position") nor, when `tied_embeddings`, the output
//    projection "head.logits.weight" (it is the token embedding; both copies must take the
//    same update). Norm weights and biases have one dimension and never decay here.
//  MATRICES_AND_EMBEDDINGS: every parameter of two or more dimensions (nanoGPT).
//  ALL: every parameter.
bool DecaysWeight(const std::string& name, const Shape& shape,
                  baton::v1::WeightDecayScope scope, bool tied_embeddings);

// ---- Global-norm gradient clipping (docs/training.md) ----

// Backend::Sum of each parameter's gradient (`squares`: Backend::SumSquares), in the order
// given: out[i] has exactly the bits of that call on the gradient's backend, and 0 for a
// parameter without a gradient. The gradients of one device go through one
// Backend::SumEach (SumSquaresEach) call: on a GPU one launch sequence and one read back for
// them all, not one per parameter. Waits for the work issued before; an error only when a
// gradient's device has no backend.
absl::StatusOr<std::vector<double>> GradientSums(const std::vector<Parameter*>& params,
                                                 bool squares);

// The parameters each block counts in the squared gradient norm, in their order: those with
// a gradient, less the tied output projection ("head.logits.weight") with
// `tied_embeddings` (the tied parameter counts once, at the embedding).
std::vector<std::vector<Parameter*>> NormParameters(const std::vector<Module*>& blocks,
                                                    bool tied_embeddings);

// One block's part of the squared gradient norm: the sum over its parameters, in their
// canonical order, of Backend::SumSquares of each gradient, in double (the per-gradient sums
// from GradientSums, added here in that order). With `tied_embeddings` the output projection
// ("head.logits.weight", the tied copy) is not counted: the tied parameter counts once, at
// the embedding. Parameters without a gradient count 0. On a device it waits for the work
// issued before.
absl::StatusOr<double> BlockGradSquares(Module& block, bool tied_embeddings);
// The same for several blocks at once: out[b] has exactly the bits BlockGradSquares(
// *blocks[b]) returns, from one GradientSums call over all their gradients (on a GPU one
// read back per step, not one per block).
absl::StatusOr<std::vector<double>> BlockGradSquares(const std::vector<Module*>& blocks,
                                                     bool tied_embeddings);

// The norm and the coefficient from every block's part, in block order.
struct GradClip {
  double norm = 0.0;  // sqrt of the parts summed in block order, in double
  float coef = 1.0f;  // max_norm / (norm + 1e-6), rounded once; the gradients scale when < 1
  bool finite() const;
  bool clips() const { return coef < 1.0f; }
};
GradClip ClipFromBlockSquares(const std::vector<double>& block_squares, float max_norm);
// The same from the parts' sum (`squared_norm`), as a rank that received it computes it.
GradClip ClipFromSquaredNorm(double squared_norm, float max_norm);
// Scales every defined gradient of `params` by `coef` (Backend::Scale, in place).
absl::Status ScaleGradients(const std::vector<Parameter*>& params, float coef);

}  // namespace baton

#endif  // BATON_COMMON_OPTIM_OPTIMIZER_H_
