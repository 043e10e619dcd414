#include "common/train/reference_trainer.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/hf.h"
#include "common/core/status.h"
#include "common/spec/spec.h"

namespace baton {

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    baton::v1::JobSpec spec) {
  BATON_ASSIGN_OR_RETURN(ValidatedJobSpec valid, ValidatedJobSpec::Validate(std::move(spec)));
  BATON_RETURN_IF_ERROR(RequireChosenSchedule(*valid));
  std::unique_ptr<ReferenceTrainer> t(new ReferenceTrainer());
  t->spec_ = *valid;
  BATON_ASSIGN_OR_RETURN(t->dataset_, MakeDataset(valid, DataAccess()));
  BATON_ASSIGN_OR_RETURN(t->device_, LocalDeviceFor(t->spec_));
  BATON_ASSIGN_OR_RETURN(Backend * backend, BackendFor(t->device_));
  backend->SetAllowTf32(UsesTf32(t->spec_));
  backend->SetAttentionKernel(AttentionKernelOf(t->spec_));
  BATON_ASSIGN_OR_RETURN(t->model_,
                         BuildBlocks(t->spec_.model(), t->spec_.seed(), 0, -1, t->device_));
  if (t->spec_.init().has_from_hf()) {  // DataAccess(): anywhere, like the training text
    BATON_RETURN_IF_ERROR(LoadHfWeights(t->spec_, DataAccess().roots, 0, t->model_.get()));
  }
  t->params_ = t->model_->Parameters();
  for (int i = 0; i < t->model_->size(); ++i) t->blocks_.push_back(&t->model_->at(i));
  if (const std::optional<TokenModel> tm = TokenModelOf(t->spec_.model());
      tm && tm->tie_embeddings) {
    t->tied_embedding_ = FindParameter(t->model_->at(0), kTiedEmbeddingName);
    t->tied_output_ = FindParameter(t->model_->at(t->model_->size() - 1), kTiedOutputName);
    if (t->tied_embedding_ == nullptr || t->tied_output_ == nullptr) {
      return absl::InternalError("the model ties its embeddings but has no tied parameters");
    }
  }
  BATON_ASSIGN_OR_RETURN(t->optimizer_, MakeOptimizer(t->spec_.optimizer(), t->params_,
                                                      t->tied_embedding_ != nullptr));
  return t;
}

absl::StatusOr<CheckpointSnapshot> ReferenceTrainer::SnapshotCheckpoint(
    const std::string& job_dir, const std::string& job) {
  CheckpointWriteInfo info{job, 0, steps_done_, static_cast<int>(blocks_.size()), {}};
  for (int i = 0; i < static_cast<int>(blocks_.size()); ++i) info.block_indices.push_back(i);
  return SnapshotBlocks(CheckpointStepDir(job_dir, steps_done_), info, blocks_, *optimizer_);
}

absl::StatusOr<std::vector<CheckpointBlockFile>> ReferenceTrainer::SaveCheckpoint(
    const std::string& job_dir, const std::string& job) {
  BATON_ASSIGN_OR_RETURN(CheckpointSnapshot snap, SnapshotCheckpoint(job_dir, job));
  BATON_RETURN_IF_ERROR(WriteSnapshot(snap));
  return snap.files;
}

absl::Status ReferenceTrainer::LoadCheckpoint(const std::string& step_dir) {
  BATON_ASSIGN_OR_RETURN(const int64_t step, LoadBlocks(step_dir, blocks_, *optimizer_));
  steps_done_ = step;
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ReferenceTrainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t batch = spec_.data().batch_size();
  const int M = spec_.pipeline().microbatches();
  const int D = std::max(1, spec_.pipeline().data_parallel());
  const int64_t per_mb = batch / (static_cast<int64_t>(D) * M);
  const int64_t step = steps_done_;  // 0-based: the dataset's step index

  Tensor scale = Tensor::Empty({1});
  scale.f32()[0] = 1.0f / static_cast<float>(D * M);
  StepLoss step_loss;
  std::vector<Tensor> losses;  // read once the step's work is issued
  int64_t tokens = 0;
  // With data parallelism, each replica's gradients, summed in replica order.
  std::vector<Tensor> total;
  for (int d = 0; d < D; ++d) {
    ZeroGrad(params_);
    for (int m = 0; m < M; ++m) {
      BATON_ASSIGN_OR_RETURN(Batch b,
                             dataset_->Get(step, (static_cast<int64_t>(d) * M + m) * per_mb, per_mb));
      MicroBatch mb{m, &b.targets, PrecisionOf(spec_)};
      Tensor loss;
      BATON_RETURN_IF_ERROR(model_->Forward(mb, b.inputs, &loss));
      losses.push_back(std::move(loss));
      tokens += b.inputs.dtype() == DType::kInt32 ? b.inputs.numel() : b.inputs.dim(0);
      // Block by block, input gradient then weight gradient, last block first.
      Tensor grad = scale;
      for (int i = model_->size() - 1; i >= 0; --i) {
        Tensor next;
        BATON_RETURN_IF_ERROR(model_->at(i).BackwardInput(mb, grad, &next));
        BATON_RETURN_IF_ERROR(model_->at(i).BackwardWeight(mb));
        grad = std::move(next);
      }
    }
    if (D == 1) break;
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& g = params_[i]->grad;
      if (d == 0) {
        total.push_back(g.Clone());
        continue;
      }
      BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(g.device()));
      be->Add(g.numel(), total[i].f32(), g.f32(), total[i].f32());
    }
  }
  for (size_t i = 0; i < total.size(); ++i) {
    Tensor& g = params_[i]->grad;
    BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(g.device()));
    be->Copy(g.numel(), total[i].f32(), g.f32());
  }
  if (tied_embedding_ != nullptr) {
    // What the pipeline's TIE_GRAD does, after the replica sums (model.h).
    BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(device_));
    SumTiedGradients(*tied_embedding_, *tied_output_, *be);
  }
  std::optional<float> grad_norm;
  if (const float max_norm = spec_.optimizer().clip_grad_norm(); max_norm > 0.0f) {
    // What the pipeline's CLIP_GRAD does: per block, then the parts in block order.
    BATON_ASSIGN_OR_RETURN(const std::vector<double> parts,
                           BlockGradSquares(blocks_, tied_embedding_ != nullptr));
    const GradClip clip = ClipFromBlockSquares(parts, max_norm);
    grad_norm = static_cast<float>(clip.norm);
    if (!clip.finite()) {
      return DivergedError(absl::StrCat("training diverged: the global gradient norm is ",
                                        clip.norm, " (step ", step + 1, ")"));
    }
    if (clip.clips()) BATON_RETURN_IF_ERROR(ScaleGradients(params_, clip.coef));
  }
  const float lr = LearningRateAt(spec_.optimizer(), step, spec_.steps());
  optimizer_->Step(lr);
  // Kernels run asynchronously on a device: a fault or a failed launch shows here, as
  // this step's error, rather than in a later step or not at all.
  if (device_ != Device::kCpu) BATON_RETURN_IF_ERROR(DeviceSynchronize(device_));
  BATON_RETURN_IF_ERROR(AddLosses(losses, &step_loss));  // the device is done: read them now
  ++steps_done_;

  StepStats s;
  s.step = steps_done_;
  s.loss = step_loss.Mean();
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.samples = batch;
  s.tokens = tokens;
  s.learning_rate = lr;
  s.grad_norm = grad_norm;
  const int every = spec_.has_eval() ? spec_.eval().every() : 0;
  if (every > 0 && (steps_done_ % every == 0 || steps_done_ == spec_.steps())) {
    BATON_ASSIGN_OR_RETURN(s.val_loss, Evaluate());
  }
  return s;
}

absl::StatusOr<float> ReferenceTrainer::Evaluate() {
  const int M = std::max(1, spec_.pipeline().microbatches());
  const int batches = std::max(1, spec_.eval().batches());
  const int64_t per_mb = spec_.data().batch_size() / M;
  StepLoss loss;
  std::vector<Tensor> losses;  // read once every batch is issued
  for (int b = 0; b < batches; ++b) {
    for (int m = 0; m < M; ++m) {
      BATON_ASSIGN_OR_RETURN(Batch batch, dataset_->GetValidation(b, m * per_mb, per_mb));
      Tensor y;
      const absl::Status f = model_->Forward(MicroBatch{m, &batch.targets, PrecisionOf(spec_)}, batch.inputs, &y);
      model_->Discard(m);  // forward only
      BATON_RETURN_IF_ERROR(f);
      losses.push_back(std::move(y));
    }
  }
  BATON_RETURN_IF_ERROR(AddLosses(losses, &loss));
  return loss.Mean();
}

}  // namespace baton
