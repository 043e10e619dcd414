// The single-process reference trainer: the yardstick every pipeline run must match.
//
// One step of a job with global batch B split into M micro-batches of B/M samples:
//   zero all gradients;
//   for m = 0 .. M-1 (in order):
//     forward micro-batch m through every block, in block order;
//     backward with loss scale 1/M through every block in reverse order, each block's
//     input gradient then its weight gradient (so gradients accumulate in m order);
//   step loss = (sum over m of loss_m, accumulated in double in m order) / M, as float;
//   one optimizer update of every parameter.
// A pipeline schedule reproduces these bits if every stage accumulates weight gradients
// in micro-batch order and computes each micro-batch exactly as here.
//
// With D data-parallel replicas (pipeline.data_parallel), the batch is D shares of M
// micro-batches of B/(D*M) samples, replica d's micro-batch m being samples
// [(d*M + m) * B/(D*M), ...) of the step; the loss scale is 1/(D*M); each replica's
// gradients accumulate on their own as above, and the replicas' gradients are then summed
// in replica order, ((g_0 + g_1) + g_2) + ..., in float, before the update; the step loss
// is the double sum over (d, m) in that order, over D*M. For D = 1 this is the step above.
//
// With tied embeddings (a gpt by default, a llama when asked), after the replica sums the
// token embedding's and the output projection's gradients are summed and given to both
// (SumTiedGradients, model.h), before the update: the rule a pipeline's TIE_GRAD follows.
//
// With clipping (optimizer.clip_grad_norm > 0), after those sums: each block's squared
// gradient norm (BlockGradSquares, optimizer.h), their sum in block order, and every
// gradient scaled by the coefficient when it is below 1: what a pipeline's CLIP_GRAD
// computes from the same parts, whatever its partition. The update then uses step s's
// learning rate, LearningRateAt(spec.optimizer, s, spec.steps).
#ifndef BATON_COMMON_TRAIN_REFERENCE_TRAINER_H_
#define BATON_COMMON_TRAIN_REFERENCE_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/checkpoint/checkpoint.h"
#include "common/core/digest.h"
#include "common/core/step_loss.h"
#include "common/data/dataset.h"
#include "common/nn/model.h"
#include "common/optim/optimizer.h"

namespace baton {

struct StepStats {
  int64_t step = 0;         // 1-based index of the step just taken
  float loss = 0.0f;        // mean loss over the step's micro-batches
  double seconds = 0.0;     // wall time of the step
  int64_t samples = 0;      // samples in the step (the global batch)
  int64_t tokens = 0;       // tokens in the step (gpt), or samples (mlp)
  float learning_rate = 0.0f;      // the rate the update used (LearningRateAt)
  std::optional<float> grad_norm;  // the global gradient norm before clipping, when clipping
  std::optional<float> val_loss;   // the validation loss, when the step evaluated (JobSpec.eval)
};

class ReferenceTrainer {
 public:
  // Validates `spec` (filling defaults) and builds the dataset, the whole model and the
  // optimizer on the spec's device (LocalDeviceFor: "auto" is CUDA when a GPU is visible).
  // Errors name the offending spec field; FAILED_PRECONDITION when the spec asks for a
  // device this process does not have.
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(baton::v1::JobSpec spec);

  // Trains one step, and evaluates after it when JobSpec.eval says so (every eval.every
  // steps and after the last: StepStats::val_loss). Errors leave the trainer unusable (the
  // step is not rolled back).
  absl::StatusOr<StepStats> Step();
  // The validation loss now: eval.batches validation batches (Dataset::GetValidation), each
  // in pipeline.microbatches micro-batches of batch / M samples forward through the whole
  // model, the losses averaged as a step's (StepLoss, in batch then micro-batch order).
  // No weight changes. What a pipeline's StageExecutor::Evaluate computes, bit for bit.
  absl::StatusOr<float> Evaluate();

  int64_t steps_done() const { return steps_done_; }
  Device device() const { return device_; }
  const baton::v1::JobSpec& spec() const { return spec_; }  // with defaults filled in
  const Dataset& dataset() const { return *dataset_; }
  Sequential& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }

  // Writes the state after steps_done() (every block, with its optimizer state) as
  // checkpoint step steps_done() under `job_dir` (common/checkpoint/checkpoint.h), as rank 0
  // of job `job`.
  absl::StatusOr<std::vector<CheckpointBlockFile>> SaveCheckpoint(const std::string& job_dir,
                                                                  const std::string& job);
  // The same, encoded in memory and not written (WriteSnapshot writes it).
  absl::StatusOr<CheckpointSnapshot> SnapshotCheckpoint(const std::string& job_dir,
                                                        const std::string& job);
  // Loads a complete checkpoint's step directory (written by any partition of the same
  // model and optimizer): weights, optimizer state, and steps_done() becomes its step, so
  // the next Step() trains the step after it. On an error the trainer is unusable.
  absl::Status LoadCheckpoint(const std::string& step_dir);

  std::vector<Digest> BlockDigests() { return baton::BlockDigests(*model_); }
  Digest WeightsDigest() { return CombineBlockDigests(BlockDigests()); }

 private:
  ReferenceTrainer() = default;

  baton::v1::JobSpec spec_;
  Device device_ = Device::kCpu;
  std::unique_ptr<Dataset> dataset_;
  std::unique_ptr<Sequential> model_;
  std::vector<Parameter*> params_;
  std::vector<Module*> blocks_;  // model_'s blocks, in order
  // With tied embeddings: the token embedding and the output projection (model.h).
  Parameter* tied_embedding_ = nullptr;
  Parameter* tied_output_ = nullptr;
  std::unique_ptr<Optimizer> optimizer_;
  int64_t steps_done_ = 0;
};

}  // namespace baton

#endif  // BATON_COMMON_TRAIN_REFERENCE_TRAINER_H_
