// StageExecutor's evaluation (Evaluate, stage_executor.h): forward only, between steps,
// with no step state.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/status.h"
#include "common/pipeline/stage_executor.h"
#include "common/pipeline/wire.h"
#include "common/train/reference_trainer.h"

namespace baton {

bool StageExecutor::EvaluatesAfter(int64_t step) const {
  if (!spec_.has_eval() || spec_.eval().every() < 1) return false;
  return (step + 1) % spec_.eval().every() == 0 || step + 1 == spec_.steps();
}

absl::StatusOr<std::optional<float>> StageExecutor::Evaluate(int64_t index) {
  const int M = schedule_.num_microbatches;
  const int n = schedule_.num_stages();
  const int batches = std::max(1, spec_.eval().batches());
  const int64_t per_mb = spec_.data().batch_size() / M;
  StepLoss loss;
  std::vector<Tensor> losses;  // the last stage's, read once every batch is issued
  std::vector<std::unique_ptr<SendWork>> sends;
  absl::Status status;
  auto run = [&]() -> absl::Status {
    for (int b = 0; b < batches; ++b) {
      const int64_t eval_step = -(index * batches + b) - 1;  // never a training step
      for (int m = 0; m < M; ++m) {
        if (Stopped()) return StoppedError(absl::StrCat("batch ", b, " microbatch ", m));
        const absl::Time deadline = absl::Now() + options_.recv_timeout;
        std::optional<Batch> batch;
        auto data = [&]() -> absl::StatusOr<const Batch*> {
          if (!batch.has_value()) {
            BATON_ASSIGN_OR_RETURN(batch, dataset_->GetValidation(b, m * per_mb, per_mb));
          }
          return &*batch;
        };
        Tensor carried;  // a chunk's output handed to the next chunk on this rank
        for (Chunk& c : chunks_) {
          const int s = c.stage;
          Tensor x;
          if (s == 0) {
            BATON_ASSIGN_OR_RETURN(const Batch* d, data());
            x = d->inputs;
          } else if (schedule_.stage_to_rank[s - 1] == rank_) {
            x = std::move(carried);
          } else {
            BATON_ASSIGN_OR_RETURN(x, transport_->Recv(schedule_.stage_to_rank[s - 1],
                                                       TensorTag{options_.job_id, eval_step, m,
                                                                 s - 1, TensorKind::kActivation},
                                                       deadline));
            BATON_RETURN_IF_ERROR(CheckReceived(
                x, BlockInputShape(spec_.model(), c.blocks.first, per_mb), "activation",
                Action{ActionKind::kRecvF, s, m}, WireDType(precision_)));
            BATON_ASSIGN_OR_RETURN(x, FromWire(x, options_.device));
          }
          const Tensor* targets = nullptr;
          if (s == n - 1) {
            BATON_ASSIGN_OR_RETURN(const Batch* d, data());
            targets = &d->targets;
          }
          Tensor y;
          absl::Status f = c.model->Forward(MicroBatch{m, targets, precision_}, x, &y);
          c.model->Discard(m);  // forward only: nothing is kept for a backward
          BATON_RETURN_IF_ERROR(f);
          if (s == n - 1) {
            losses.push_back(std::move(y));
          } else if (schedule_.stage_to_rank[s + 1] == rank_) {
            carried = std::move(y);
          } else {
            BATON_ASSIGN_OR_RETURN(const Tensor wire, ToWire(y, precision_));
            sends.push_back(transport_->Send(
                schedule_.stage_to_rank[s + 1],
                TensorTag{options_.job_id, eval_step, m, s, TensorKind::kActivation}, wire));
          }
        }
      }
    }
    for (auto& w : sends) {
      BATON_RETURN_IF_ERROR(w->Wait(absl::Now() + options_.recv_timeout));
    }
    return absl::OkStatus();
  };
  status = run();
  if (!status.ok()) {
    status = WithMessage(
        status, absl::StrCat("rank ", rank_, " evaluation ", index + 1, ": ", status.message()));
    transport_->Abort(status);
    for (Chunk& c : chunks_) {
      for (int m = 0; m < M; ++m) c.model->Discard(m);
    }
    return status;
  }
  if (ChunkFor(n - 1) == nullptr) return std::optional<float>();
  BATON_RETURN_IF_ERROR(AddLosses(losses, &loss));
  return std::optional<float>(loss.Mean());
}

}  // namespace baton
