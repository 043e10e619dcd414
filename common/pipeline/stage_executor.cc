#include "common/pipeline/stage_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/hf.h"
#include "common/core/cuda_context.h"
#include "common/core/status.h"
#include "common/pipeline/grad_reducer.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"

namespace baton {

// Everything one step holds, keyed by (stage, micro-batch). Tensors are dropped as soon as
// they are sent or consumed.
class StageExecutor::StepState {
 public:
  StepState(int64_t step, int num_microbatches) : step(step), M(num_microbatches) {}

  static int64_t Key(int stage, int mb) { return (static_cast<int64_t>(stage) << 32) | mb; }

  // Removes and returns the tensor under (stage, mb), or an error naming what is missing.
  absl::StatusOr<Tensor> Take(std::unordered_map<int64_t, Tensor>& map, int stage, int mb,
                              const char* what, const Action& a) {
    auto it = map.find(Key(stage, mb));
    if (it == map.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(a.ToString(), ": no ", what, " for stage ", stage, " micro-batch ", mb,
                       " (the clock runs it too early)"));
    }
    Tensor t = std::move(it->second);
    map.erase(it);
    return t;
  }

  const int64_t step;
  const int M;
  std::unordered_map<int, Batch> batches;                // by micro-batch
  std::unordered_map<int64_t, Tensor> activations_in;    // received input of (s, m)
  std::unordered_map<int64_t, Tensor> activations_out;   // output of (s, m) not yet handed on
  std::unordered_map<int64_t, Tensor> gradients_in;      // received dL/d(output) of (s, m)
  std::unordered_map<int64_t, Tensor> gradients_out;     // dL/d(input) of (s, m) not yet sent
  // RECOMPUTE_FULL: the input (and, on the last stage, the targets) of (s, m), kept from its
  // forward to its backward, which reruns the forward from them.
  struct Kept {
    Tensor input;
    Tensor targets;
  };
  std::unordered_map<int64_t, Kept> kept;
  std::unordered_map<int, std::set<int>> deferred_w;     // stage -> micro-batches waiting
  std::unordered_map<int, int> next_w;                   // stage -> next micro-batch to W
  std::vector<std::pair<Action, std::unique_ptr<SendWork>>> sends;  // in clock order
  // Last stage only: each micro-batch's loss as its module wrote it (on the device), read
  // once the step's work is issued.
  std::vector<Tensor> losses;
  std::vector<ActionTiming> reductions;  // filled when STEP has waited for them
  int64_t reduce_wait_ns = 0;
  // Data parallelism: per stage, finished gradients not yet handed to the reducer.
  struct Bucket {
    std::vector<Parameter*> params;
    int64_t bytes = 0;
  };
  std::unordered_map<int, Bucket> buckets;
  int inflight = 0;
  int peak_inflight = 0;
  bool tied = false;  // the tied embedding's gradient is summed (TIE_GRAD)
  std::optional<float> grad_norm;  // CLIP_GRAD's norm, once it ran
  float learning_rate = 0.0f;      // STEP's
  bool stepped = false;
};

StageExecutor::StageExecutor() = default;
StageExecutor::~StageExecutor() = default;

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const baton::v1::JobSpec& spec, const Schedule& schedule,
    const std::vector<BlockRange>& stage_blocks, int rank, Transport* transport,
    const StageExecutorOptions& options) {
  BATON_ASSIGN_OR_RETURN(ValidatedJobSpec valid, ValidatedJobSpec::Validate(spec));
  return Create(valid, schedule, stage_blocks, rank, transport, options);
}

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    const ValidatedJobSpec& valid, const Schedule& schedule,
    const std::vector<BlockRange>& stage_blocks, int rank, Transport* transport,
    const StageExecutorOptions& options) {
  const baton::v1::JobSpec& spec = *valid;
  if (rank < 0 || rank >= schedule.num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the schedule's ", schedule.num_ranks, " ranks"));
  }
  if (static_cast<int>(stage_blocks.size()) != schedule.num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("the schedule has ", schedule.num_stages(),
                                                   " stages but ", stage_blocks.size(),
                                                   " block ranges were given"));
  }
  if (schedule.num_microbatches != spec.pipeline().microbatches()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the schedule has ", schedule.num_microbatches, " micro-batches, the job ",
        spec.pipeline().microbatches(), " (pipeline.microbatches)"));
  }
  std::unique_ptr<StageExecutor> ex(new StageExecutor());
  ex->spec_ = spec;
  ex->precision_ = PrecisionOf(spec);
  BATON_ASSIGN_OR_RETURN(Backend * backend, BackendFor(options.device));
  backend->SetAllowTf32(UsesTf32(spec));
  ex->schedule_ = schedule;
  ex->rank_ = rank;
  ex->transport_ = transport;
  ex->options_ = options;
  {
    const bool full = spec.pipeline().recompute() == baton::v1::RECOMPUTE_FULL;
    const bool all = spec.pipeline().recompute_stages().empty();
    ex->recompute_.assign(schedule.num_stages(), full && all);
    if (full) {
      for (int32_t s : spec.pipeline().recompute_stages()) {
        if (s >= 0 && s < schedule.num_stages()) ex->recompute_[s] = true;
      }
    }
  }
  const int data_parallel = std::max(1, spec.pipeline().data_parallel());
  if (options.replica < 0 || options.replica >= data_parallel) {
    return absl::InvalidArgumentError(absl::StrCat("replica ", options.replica, " is outside the job's ",
                                                   data_parallel, " (pipeline.data_parallel)"));
  }
  if (schedule.reduces_grads()) {
    if (options.collective == nullptr) {
      return absl::InvalidArgumentError(
          "the clock reduces gradients (REDUCE_GRAD) but the rank has no data-parallel group");
    }
    if (options.collective->size() != data_parallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the data-parallel group has ", options.collective->size(), " members, the job ",
          data_parallel, " replicas (pipeline.data_parallel)"));
    }
    ex->reducer_ = std::make_unique<GradReducer>(
        options.collective, std::max<int64_t>(1, spec.pipeline().reduce_bucket_bytes()));
  } else if (data_parallel > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job has ", data_parallel,
        " data-parallel replicas but the clock has no REDUCE_GRAD actions (AddGradReductions)"));
  }
  // This rank's clock sums the tied embedding exactly when the model ties and the rank
  // holds an end (a worker's plan carries its own clock only).
  const std::optional<TokenModel> token_model = TokenModelOf(spec.model());
  const bool tied = token_model && token_model->tie_embeddings;
  ex->tied_ = tied;
  // The clock clips exactly when the optimizer does (AddJobActions), on every rank.
  if (rank >= 0 && rank < static_cast<int>(schedule.ranks.size())) {
    const std::vector<Action>& clock = schedule.ranks[rank];
    const bool clips = spec.optimizer().clip_grad_norm() > 0.0f;
    const bool has = std::find(clock.begin(), clock.end(),
                               Action{ActionKind::kClipGrad, 0, 0}) != clock.end();
    if (has != clips) {
      return absl::InvalidArgumentError(absl::StrCat(
          clips ? "the optimizer clips gradients (optimizer.clip_grad_norm) but rank "
                : "the optimizer does not clip gradients but rank ",
          rank, "'s clock ", clips ? "has no CLIP_GRAD (AddJobActions)" : "has CLIP_GRAD"));
    }
  }
  const int n = schedule.num_stages();
  if (rank >= 0 && rank < static_cast<int>(schedule.ranks.size())) {
    for (int end : {0, n - 1}) {
      if (schedule.stage_to_rank[end] != rank) continue;
      const std::vector<Action>& clock = schedule.ranks[rank];
      const bool has = std::find(clock.begin(), clock.end(),
                                 Action{ActionKind::kTieGrad, end, 0}) != clock.end();
      if (has != tied && (n > 1 || end == 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            tied ? "the model ties its embeddings but rank " : "the model does not tie its "
                                                               "embeddings but rank ",
            rank, "'s clock ", tied ? "has no " : "has ", Action{ActionKind::kTieGrad, end, 0}.ToString(),
            tied ? " (AddJobActions)" : ""));
      }
    }
  }
  ex->timer_ = options.device_timer;
  if (ex->timer_ == nullptr) {
    ex->own_timer_ = NewDeviceTimer(options.device);
    ex->timer_ = ex->own_timer_.get();
  }
  BATON_ASSIGN_OR_RETURN(ex->dataset_, MakeDataset(valid, options.data));
  for (int s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.stage_to_rank[s] != rank) continue;
    Chunk c;
    c.stage = s;
    c.blocks = stage_blocks[s];
    BATON_ASSIGN_OR_RETURN(c.model, BuildBlocks(spec.model(), spec.seed(), c.blocks.first,
                                                c.blocks.last, options.device));
    if (spec.init().has_from_hf()) {  // initial weights from a Hugging Face model
      BATON_RETURN_IF_ERROR(
          LoadHfWeights(spec, options.data.roots, c.blocks.first, c.model.get()));
    }
    c.model->CollectParameters(&ex->params_);
    ex->chunks_.push_back(std::move(c));
  }
  BATON_ASSIGN_OR_RETURN(ex->optimizer_, MakeOptimizer(spec.optimizer(), ex->params_, tied));
  return ex;
}

bool StageExecutor::Stopped() const {
  return options_.stop != nullptr && options_.stop->load(std::memory_order_relaxed);
}

absl::Status StageExecutor::StoppedError(absl::string_view where) const {
  return absl::AbortedError(absl::StrCat("stopped (", where, "): the run was told to stop"));
}

StageExecutor::Chunk* StageExecutor::ChunkFor(int stage) {
  for (Chunk& c : chunks_) {
    if (c.stage == stage) return &c;
  }
  return nullptr;
}

std::vector<Module*> StageExecutor::Blocks() {
  std::vector<Module*> out;
  for (Chunk& c : chunks_) {
    for (int i = 0; i < c.model->size(); ++i) out.push_back(&c.model->at(i));
  }
  return out;
}

absl::StatusOr<CheckpointSnapshot> StageExecutor::SnapshotCheckpoint(const std::string& step_dir,
                                                                     const std::string& job,
                                                                     int64_t step) {
  CheckpointWriteInfo info{job, rank_, step, static_cast<int>(ModelBlockCount(spec_.model())),
                           {}};
  for (const Chunk& c : chunks_) {
    for (int b = c.blocks.first; b < c.blocks.last; ++b) info.block_indices.push_back(b);
  }
  return SnapshotBlocks(step_dir, info, Blocks(), *optimizer_);
}

absl::StatusOr<std::vector<CheckpointBlockFile>> StageExecutor::SaveCheckpoint(
    const std::string& step_dir, const std::string& job, int64_t step) {
  BATON_ASSIGN_OR_RETURN(CheckpointSnapshot snap, SnapshotCheckpoint(step_dir, job, step));
  BATON_RETURN_IF_ERROR(WriteSnapshot(snap));
  return snap.files;
}

absl::StatusOr<int64_t> StageExecutor::LoadCheckpoint(const std::string& step_dir) {
  return LoadBlocks(step_dir, Blocks(), *optimizer_);
}

absl::StatusOr<RankStepResult> StageExecutor::RunStep(int64_t step) {
  StepState st(step, schedule_.num_microbatches);
  ZeroGrad(params_);
  RankStepResult result;
  result.rank = rank_;
  const auto t0 = std::chrono::steady_clock::now();
  auto ns_since_start = [&t0] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - t0)
        .count();
  };
  result.start = absl::Now();
  if (reducer_ != nullptr) reducer_->BeginStep(t0);
  absl::Status status;
  result.timeline.reserve(schedule_.ranks[rank_].size());
  // Device marks around each timed action: (timeline index, first mark, second mark).
  struct Marks {
    size_t action;
    int from, to;
  };
  std::vector<Marks> marks;
  if (timer_ != nullptr) timer_->Reset();
  for (const Action& a : schedule_.ranks[rank_]) {
    if (IsCompute(a.kind) && Stopped()) {
      status = StoppedError(absl::StrCat("rank ", rank_, " step ", step, " before ",
                                         a.ToString()));
      break;
    }
    ActionTiming t{a, ns_since_start(), 0, 0};
    const bool timed = timer_ != nullptr && (IsCompute(a.kind) || a.kind == ActionKind::kStep);
    const int from = timed ? timer_->Mark() : -1;
    status = Execute(a, st, &t.bytes);
    if (from >= 0 && status.ok()) {
      const int to = timer_->Mark();
      if (to >= 0) marks.push_back({result.timeline.size(), from, to});
    }
    if (!status.ok()) {
      status = WithMessage(status, absl::StrCat("rank ", rank_, " step ", step, " at ",
                                                        a.ToString(), ": ", status.message()));
      break;
    }
    t.end_ns = ns_since_start();
    result.timeline.push_back(t);
    if (options_.observer != nullptr) options_.observer->OnAction(t, st.inflight);
  }
  // Every send must have left before the step counts as done.
  const absl::Time deadline = absl::Now() + options_.recv_timeout;
  for (auto& [action, w] : st.sends) {
    if (!status.ok()) break;
    if (w->IsCompleted()) {
      status = w->Wait(deadline);  // returns at once: the send's own result
    } else {
      ActionTiming t{action, ns_since_start(), 0, 0};
      status = w->Wait(deadline);
      t.end_ns = ns_since_start();
      result.send_waits.push_back(t);
    }
    if (!status.ok()) {
      status = WithMessage(status, absl::StrCat("rank ", rank_, " step ", step,
                                                        " waiting for ", action.ToString(), ": ",
                                                        status.message()));
    }
  }
  result.end_ns = ns_since_start();
  if (status.ok() && !st.stepped) {
    status = absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": the clock has no STEP action"));
  }
  if (!status.ok()) {
    transport_->Abort(status);
    if (reducer_ != nullptr) {
      // The other replicas must not wait for this rank's reductions; then let the queue
      // drain so the next step starts clean.
      reducer_->Abort(status);
      std::vector<ActionTiming> ignored;
      (void)reducer_->WaitAll(absl::Now() + options_.recv_timeout, &ignored);
    }
    for (Chunk& c : chunks_) {
      for (int m = 0; m < st.M; ++m) c.model->Discard(m);
    }
    return status;
  }
  // The step's work is issued; read the device times (waits for the stream to finish it).
  for (const Marks& m : marks) {
    absl::StatusOr<int64_t> ns = timer_->ElapsedNs(m.from, m.to);
    if (ns.ok()) result.timeline[m.action].device_ns = *ns;
  }
  for (const Tensor& loss : st.losses) {
    BATON_ASSIGN_OR_RETURN(const float value, LossValue(loss));
    result.losses.push_back(value);
  }
  result.reductions = std::move(st.reductions);
  result.reduce_wait_ns = st.reduce_wait_ns;
  result.peak_inflight = st.peak_inflight;
  result.grad_norm = st.grad_norm;
  result.learning_rate = st.learning_rate;
  return result;
}

namespace {

// A received tensor must have the dtype and shape the plan implies before any block sees
// it: a peer's bug (or a forged frame that got past the transport) fails the job with this
// error instead of reading out of bounds or training on garbage. Activations and gradients
// travel as `wire` (WireDType); the tied and norm exchanges are float32.
absl::Status CheckReceived(const Tensor& t, const Shape& want, const char* what,
                           const Action& a, DType wire = DType::kFloat32) {
  if (t.dtype() == wire && t.shape() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "received ", what, " for ", a.ToString(), " is ", ShapeString(t.shape()), " of ",
      DTypeName(t.dtype()), "; the plan expects ", ShapeString(want), " of ", DTypeName(wire)));
}

// The dtype of the activations and gradients between stages.
DType WireDType(Precision p) { return p == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat32; }

// What leaves for another stage: `t` itself in fp32; in bf16 its bf16 bits (exact: block
// outputs and input gradients hold bf16 values, module.h), half the bytes.
absl::StatusOr<Tensor> ToWire(const Tensor& t, Precision p) {
  if (p != Precision::kBf16) return t;
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(t.device()));
  BATON_ASSIGN_OR_RETURN(Tensor w, Tensor::TryEmpty(t.shape(), DType::kBFloat16, t.device()));
  be->ToBf16(t.numel(), t.f32(), w.bf16());
  return w;
}

// A received tensor (already checked) as the float32 tensor on `device` the blocks take.
absl::StatusOr<Tensor> FromWire(const Tensor& t, Device device) {
  BATON_ASSIGN_OR_RETURN(Tensor on, t.On(device));
  if (on.dtype() != DType::kBFloat16) return on;
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(device));
  BATON_ASSIGN_OR_RETURN(Tensor f, Tensor::TryEmpty(on.shape(), DType::kFloat32, device));
  be->FromBf16(on.numel(), on.bf16(), f.f32());
  return f;
}

}  // namespace

absl::Status StageExecutor::Execute(const Action& a, StepState& st, int64_t* bytes) {
  const int s = a.stage;
  const int m = a.microbatch;
  const int last_stage = schedule_.num_stages() - 1;
  const int D = std::max(1, spec_.pipeline().data_parallel());
  const int64_t per_mb = spec_.data().batch_size() / (static_cast<int64_t>(D) * st.M);
  auto tag = [&](int stage, TensorKind kind) {
    return TensorTag{options_.job_id, st.step, m, stage, kind};
  };
  auto batch = [&]() -> absl::StatusOr<const Batch*> {
    auto it = st.batches.find(m);
    if (it == st.batches.end()) {
      // This replica's share: the step's micro-batch replica * M + m.
      const int64_t global_mb = static_cast<int64_t>(options_.replica) * st.M + m;
      BATON_ASSIGN_OR_RETURN(Batch b, dataset_->Get(st.step, global_mb * per_mb, per_mb));
      it = st.batches.emplace(m, std::move(b)).first;
    }
    return &it->second;
  };
  const absl::Time deadline = absl::Now() + options_.recv_timeout;

  switch (a.kind) {
    case ActionKind::kForward: {
      Chunk* c = ChunkFor(s);
      if (c == nullptr) return absl::InternalError("stage not on this rank");
      Tensor x;
      if (s == 0) {
        BATON_ASSIGN_OR_RETURN(const Batch* b, batch());
        x = b->inputs;
      } else if (schedule_.stage_to_rank[s - 1] == rank_) {
        BATON_ASSIGN_OR_RETURN(x, st.Take(st.activations_out, s - 1, m, "local activation", a));
      } else {
        BATON_ASSIGN_OR_RETURN(x, st.Take(st.activations_in, s, m, "received activation", a));
      }
      const Tensor* targets = nullptr;
      if (s == last_stage) {
        BATON_ASSIGN_OR_RETURN(const Batch* b, batch());
        targets = &b->targets;
      }
      Tensor y;
      BATON_RETURN_IF_ERROR(c->model->Forward(MicroBatch{m, targets, precision_}, x, &y));
      if (recompute_[s]) {
        // Keep only what reruns this forward; the blocks' stash goes now.
        c->model->Discard(m);
        st.kept[StepState::Key(s, m)] =
            StepState::Kept{std::move(x), targets != nullptr ? *targets : Tensor()};
      }
      if (++st.inflight > st.peak_inflight) st.peak_inflight = st.inflight;
      // The blocks stash what they need of the batch; drop it after its last use here.
      const bool last_use = (s == last_stage) || (s == 0 && ChunkFor(last_stage) == nullptr);
      if (last_use) st.batches.erase(m);
      if (s == last_stage) {
        if (static_cast<int>(st.losses.size()) <= m) st.losses.resize(m + 1);
        st.losses[m] = std::move(y);
      } else {
        st.activations_out[StepState::Key(s, m)] = std::move(y);
      }
      return absl::OkStatus();
    }
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput: {
      Chunk* c = ChunkFor(s);
      if (c == nullptr) return absl::InternalError("stage not on this rank");
      Tensor dy;
      if (s == last_stage) {
        dy = Tensor::Empty({1});
        dy.f32()[0] = 1.0f / static_cast<float>(D * st.M);
      } else if (schedule_.stage_to_rank[s + 1] == rank_) {
        BATON_ASSIGN_OR_RETURN(dy, st.Take(st.gradients_out, s + 1, m, "local gradient", a));
      } else {
        BATON_ASSIGN_OR_RETURN(dy, st.Take(st.gradients_in, s, m, "received gradient", a));
      }
      if (recompute_[s]) {
        // Rerun the forward from the kept input: the same blocks on the same bits stash
        // exactly what the first run did.
        auto it = st.kept.find(StepState::Key(s, m));
        if (it == st.kept.end()) {
          return absl::FailedPreconditionError(
              absl::StrCat(a.ToString(), ": no kept input for stage ", s, " micro-batch ", m,
                           " to recompute its forward from (the clock runs it too early)"));
        }
        StepState::Kept kept = std::move(it->second);
        st.kept.erase(it);
        Tensor y;
        BATON_RETURN_IF_ERROR(c->model->Forward(
            MicroBatch{m, kept.targets.defined() ? &kept.targets : nullptr, precision_}, kept.input,
            &y));
      }
      Tensor dx;
      const Tensor* targets = nullptr;
      BATON_RETURN_IF_ERROR(c->model->BackwardInput(MicroBatch{m, targets, precision_}, dy, &dx));
      if (s > 0) st.gradients_out[StepState::Key(s, m)] = std::move(dx);
      if (a.kind == ActionKind::kBackward) return RunWeightGradient(s, m, st);
      return absl::OkStatus();
    }
    case ActionKind::kBackwardWeight:
      return RunWeightGradient(s, m, st);
    case ActionKind::kSendF: {
      BATON_ASSIGN_OR_RETURN(Tensor out, st.Take(st.activations_out, s, m, "activation", a));
      BATON_ASSIGN_OR_RETURN(const Tensor y, ToWire(out, precision_));
      *bytes = static_cast<int64_t>(y.nbytes());
      st.sends.emplace_back(a, transport_->Send(schedule_.stage_to_rank[s + 1],
                                                tag(s, TensorKind::kActivation), y));
      return absl::OkStatus();
    }
    case ActionKind::kRecvF: {
      BATON_ASSIGN_OR_RETURN(Tensor x, transport_->Recv(schedule_.stage_to_rank[s - 1],
                                                        tag(s - 1, TensorKind::kActivation),
                                                        deadline));
      Chunk* c = ChunkFor(s);
      if (c == nullptr) return absl::InternalError("stage not on this rank");
      BATON_RETURN_IF_ERROR(CheckReceived(x, BlockInputShape(spec_.model(), c->blocks.first, per_mb),
                                          "activation", a, WireDType(precision_)));
      *bytes = static_cast<int64_t>(x.nbytes());
      BATON_ASSIGN_OR_RETURN(x, FromWire(x, options_.device));
      st.activations_in[StepState::Key(s, m)] = std::move(x);
      return absl::OkStatus();
    }
    case ActionKind::kSendB: {
      BATON_ASSIGN_OR_RETURN(Tensor out, st.Take(st.gradients_out, s, m, "gradient", a));
      BATON_ASSIGN_OR_RETURN(const Tensor dx, ToWire(out, precision_));
      *bytes = static_cast<int64_t>(dx.nbytes());
      st.sends.emplace_back(a, transport_->Send(schedule_.stage_to_rank[s - 1],
                                                tag(s, TensorKind::kGradient), dx));
      return absl::OkStatus();
    }
    case ActionKind::kRecvB: {
      BATON_ASSIGN_OR_RETURN(Tensor dy, transport_->Recv(schedule_.stage_to_rank[s + 1],
                                                         tag(s + 1, TensorKind::kGradient),
                                                         deadline));
      Chunk* c = ChunkFor(s);
      if (c == nullptr) return absl::InternalError("stage not on this rank");
      BATON_RETURN_IF_ERROR(CheckReceived(dy, BlockInputShape(spec_.model(), c->blocks.last, per_mb),
                                          "gradient", a, WireDType(precision_)));
      *bytes = static_cast<int64_t>(dy.nbytes());
      BATON_ASSIGN_OR_RETURN(dy, FromWire(dy, options_.device));
      st.gradients_in[StepState::Key(s, m)] = std::move(dy);
      return absl::OkStatus();
    }
    case ActionKind::kReduceGrad: {
      Chunk* c = ChunkFor(s);
      if (c == nullptr) return absl::InternalError("stage not on this rank");
      if (reducer_ == nullptr) {
        return absl::FailedPreconditionError("REDUCE_GRAD without a data-parallel group");
      }
      if (st.next_w[s] != st.M) {
        return absl::FailedPreconditionError(
            absl::StrCat("gradient reduction before every weight gradient of stage ", s,
                         " ran (", st.next_w[s], " of ", st.M, ")"));
      }
      // The stage's last weight gradient queued full buckets as its blocks finished; the
      // rest goes now.
      StepState::Bucket& bucket = st.buckets[s];
      if (!bucket.params.empty()) reducer_->Enqueue(a, std::move(bucket.params), deadline);
      bucket = StepState::Bucket();
      return absl::OkStatus();
    }
    case ActionKind::kTieGrad:
      return SumTiedGradient(a, st, deadline, bytes);
    case ActionKind::kClipGrad:
      return ClipGradients(a, st, deadline, bytes);
    case ActionKind::kStep: {
      for (const Chunk& c : chunks_) {
        const int done = st.next_w[c.stage];
        if (done != st.M) {
          return absl::FailedPreconditionError(
              absl::StrCat("optimizer step before every weight gradient of stage ", c.stage,
                           " ran (", done, " of ", st.M, ")"));
        }
      }
      // The update needs the group's sums: wait for this step's reductions.
      if (reducer_ != nullptr) {
        const auto wait_start = std::chrono::steady_clock::now();
        BATON_RETURN_IF_ERROR(reducer_->WaitAll(deadline, &st.reductions));
        st.reduce_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - wait_start)
                                .count();
      }
      // Divergence is a failure: a non-finite gradient would make every weight it touches
      // garbage. One sum per gradient (inf and nan survive a double sum of floats), all of
      // this rank's in one batched call (one read back on a GPU); the first non-finite one
      // in chunk and parameter order is named.
      std::vector<Parameter*> params;
      std::vector<int> stage_of;  // params[i] belongs to stage stage_of[i]
      for (const Chunk& c : chunks_) {
        for (Parameter* p : c.model->Parameters()) {
          params.push_back(p);
          stage_of.push_back(c.stage);
        }
      }
      BATON_ASSIGN_OR_RETURN(const std::vector<double> sums,
                             GradientSums(params, /*squares=*/false));
      for (size_t i = 0; i < params.size(); ++i) {
        if (!std::isfinite(sums[i])) {
          return DivergedError(absl::StrCat("training diverged: the gradient of ", params[i]->name,
                                            " (stage ", stage_of[i], ") is not finite"));
        }
      }
      // The schedule's rate for this step (a resume continues it from the checkpoint's step).
      st.learning_rate = LearningRateAt(spec_.optimizer(), st.step, spec_.steps());
      optimizer_->Step(st.learning_rate);
      st.stepped = true;
      // A device's asynchronous failures (a kernel fault, a failed launch) end the step here.
      if (options_.device != Device::kCpu) return DeviceSynchronize(options_.device);
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown action kind");
}

Parameter* StageExecutor::TiedParameter(int stage, bool output) {
  Chunk* c = ChunkFor(stage);
  if (c == nullptr) return nullptr;
  return output ? FindParameter(c->model->at(c->model->size() - 1), kTiedOutputName)
                : FindParameter(c->model->at(0), kTiedEmbeddingName);
}

absl::Status StageExecutor::SumTiedGradient(const Action& a, StepState& st, absl::Time deadline,
                                            int64_t* bytes) {
  const int s = a.stage;
  const int n = schedule_.num_stages();
  const int other = PeerStage(a, n);
  for (int end : {s, other}) {
    if (ChunkFor(end) != nullptr && st.next_w[end] != st.M) {
      return absl::FailedPreconditionError(
          absl::StrCat(a.ToString(), " before every weight gradient of stage ", end, " ran (",
                       st.next_w[end], " of ", st.M, ")"));
    }
  }
  if (st.tied) return absl::OkStatus();  // the other end is on this rank and summed both
  // The sum is over final gradients: this step's replica sums first.
  if (reducer_ != nullptr) BATON_RETURN_IF_ERROR(reducer_->WaitAll(deadline, &st.reductions));
  // Stage 0 holds the embedding, the last stage the output projection (with one stage,
  // the one stage both).
  Parameter* mine = TiedParameter(s, /*output=*/s != 0);
  if (mine == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(a.ToString(), ": stage ", s, " holds no tied embedding (",
                     s == 0 ? kTiedEmbeddingName : kTiedOutputName, ")"));
  }
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(options_.device));
  const int peer = schedule_.stage_to_rank[other];
  if (peer == rank_) {
    // Both ends here (one stage, or a V-shaped placement).
    Parameter* embedding = TiedParameter(0, /*output=*/false);
    Parameter* output = TiedParameter(n - 1, /*output=*/true);
    if (embedding == nullptr || output == nullptr) {
      return absl::InternalError("the tied embedding's other end is missing");
    }
    SumTiedGradients(*embedding, *output, *be);
    st.tied = true;
    return absl::OkStatus();
  }
  // The first stage sends, then receives; the last receives, then sends: the pair never
  // waits on each other, on any transport. The sum is written only after this rank's part
  // has left (a send's tensor must not change before its work completes).
  const TensorTag mine_tag{options_.job_id, st.step, 0, s, TensorKind::kTiedGradient};
  const TensorTag their_tag{options_.job_id, st.step, 0, other, TensorKind::kTiedGradient};
  auto send = [&]() { return transport_->Send(peer, mine_tag, mine->grad)->Wait(deadline); };
  if (s == 0) BATON_RETURN_IF_ERROR(send());
  BATON_ASSIGN_OR_RETURN(Tensor theirs, transport_->Recv(peer, their_tag, deadline));
  BATON_RETURN_IF_ERROR(CheckReceived(theirs, mine->grad.shape(), "tied embedding gradient", a));
  if (s != 0) BATON_RETURN_IF_ERROR(send());
  *bytes = 2 * theirs.numel() * static_cast<int64_t>(sizeof(float));
  BATON_ASSIGN_OR_RETURN(theirs, theirs.On(options_.device));
  // embedding's + output projection's (model.h): the same two floats on both ends.
  if (s == 0) {
    be->Add(mine->grad.numel(), mine->grad.f32(), theirs.f32(), mine->grad.f32());
  } else {
    be->Add(mine->grad.numel(), theirs.f32(), mine->grad.f32(), mine->grad.f32());
  }
  st.tied = true;
  return absl::OkStatus();
}

namespace {

// The gradient norm's messages carry doubles bit for bit, as int32 pairs.
Tensor DoublesTensor(const std::vector<double>& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(2 * v.size())}, DType::kInt32);
  if (!v.empty()) std::memcpy(t.i32(), v.data(), v.size() * sizeof(double));
  return t;
}

absl::StatusOr<std::vector<double>> DoublesOf(const Tensor& t, size_t want, const Action& a,
                                              const char* what) {
  if (t.dtype() != DType::kInt32 || t.shape() != Shape{static_cast<int64_t>(2 * want)}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "received ", what, " for ", a.ToString(), " is ", ShapeString(t.shape()), " of ",
        DTypeName(t.dtype()), "; the plan expects [", 2 * want, "] of int32"));
  }
  BATON_ASSIGN_OR_RETURN(Tensor host, t.On(Device::kCpu));
  std::vector<double> out(want);
  if (want > 0) std::memcpy(out.data(), host.i32(), want * sizeof(double));
  return out;
}

}  // namespace

absl::Status StageExecutor::ClipGradients(const Action& a, StepState& st, absl::Time deadline,
                                          int64_t* bytes) {
  for (const Chunk& c : chunks_) {
    if (st.next_w[c.stage] != st.M) {
      return absl::FailedPreconditionError(
          absl::StrCat(a.ToString(), " before every weight gradient of stage ", c.stage,
                       " ran (", st.next_w[c.stage], " of ", st.M, ")"));
    }
  }
  // The norm is of the final gradients: this step's replica sums first.
  if (reducer_ != nullptr) BATON_RETURN_IF_ERROR(reducer_->WaitAll(deadline, &st.reductions));
  const size_t num_blocks = static_cast<size_t>(ModelBlockCount(spec_.model()));
  std::vector<double> parts(num_blocks, 0.0);
  auto fill_mine = [&]() -> absl::Status {
    std::vector<Module*> mine;
    std::vector<size_t> index;  // mine[i] is block index[i] of the model
    for (Chunk& c : chunks_) {
      for (int i = 0; i < c.model->size(); ++i) {
        const size_t b = static_cast<size_t>(c.blocks.first + i);
        if (b >= num_blocks) return absl::InternalError("a block outside the model");
        mine.push_back(&c.model->at(i));
        index.push_back(b);
      }
    }
    BATON_ASSIGN_OR_RETURN(const std::vector<double> squares, BlockGradSquares(mine, tied_));
    for (size_t i = 0; i < mine.size(); ++i) parts[index[i]] = squares[i];
    return absl::OkStatus();
  };
  // The chain: rank r receives ranks 0..r-1's parts from r - 1, adds its own, hands them to
  // r + 1; the last rank sums them in block order and the total comes back down the chain.
  const int last = schedule_.num_ranks - 1;
  auto tag = [&](int from, int direction) {
    return TensorTag{options_.job_id, st.step, direction, from, TensorKind::kGradNorm};
  };
  auto send = [&](int to, int direction, const Tensor& t) -> absl::Status {
    *bytes += static_cast<int64_t>(t.nbytes());
    return transport_->Send(to, tag(rank_, direction), t)->Wait(deadline);
  };
  if (rank_ > 0) {
    BATON_ASSIGN_OR_RETURN(Tensor got, transport_->Recv(rank_ - 1, tag(rank_ - 1, 0), deadline));
    *bytes += static_cast<int64_t>(got.nbytes());
    BATON_ASSIGN_OR_RETURN(parts, DoublesOf(got, num_blocks, a, "gradient norm parts"));
  }
  BATON_RETURN_IF_ERROR(fill_mine());
  double squared = 0.0;
  if (rank_ < last) {
    BATON_RETURN_IF_ERROR(send(rank_ + 1, 0, DoublesTensor(parts)));
    BATON_ASSIGN_OR_RETURN(Tensor got, transport_->Recv(rank_ + 1, tag(rank_ + 1, 1), deadline));
    *bytes += static_cast<int64_t>(got.nbytes());
    BATON_ASSIGN_OR_RETURN(std::vector<double> total,
                           DoublesOf(got, 1, a, "gradient norm total"));
    squared = total[0];
  } else {
    for (double part : parts) squared += part;  // block order, whatever the partition
  }
  if (rank_ > 0) BATON_RETURN_IF_ERROR(send(rank_ - 1, 1, DoublesTensor({squared})));
  const GradClip clip = ClipFromSquaredNorm(squared, spec_.optimizer().clip_grad_norm());
  st.grad_norm = static_cast<float>(clip.norm);
  if (!clip.finite()) {
    return DivergedError(absl::StrCat("training diverged: the global gradient norm is ",
                                      clip.norm, " (CLIP_GRAD, step ", st.step + 1, ")"));
  }
  if (clip.clips()) BATON_RETURN_IF_ERROR(ScaleGradients(params_, clip.coef));
  return absl::OkStatus();
}

absl::Status StageExecutor::RunWeightGradient(int stage, int microbatch, StepState& st) {
  Chunk* c = ChunkFor(stage);
  if (c == nullptr) return absl::InternalError("stage not on this rank");
  std::set<int>& waiting = st.deferred_w[stage];
  waiting.insert(microbatch);
  int& next = st.next_w[stage];
  // Weight gradients accumulate in micro-batch order, whatever order the clock asks.
  while (!waiting.empty() && *waiting.begin() == next) {
    if (reducer_ != nullptr && next == st.M - 1) {
      // The stage's last weight gradient: block by block, last first; a block's gradients
      // are final once its W ran, so they go to the communication thread in buckets while
      // the earlier blocks still compute (REDUCE_GRAD sends what is left).
      const absl::Time deadline = absl::Now() + options_.recv_timeout;
      StepState::Bucket& bucket = st.buckets[stage];
      for (int i = c->model->size() - 1; i >= 0; --i) {
        Module& block = c->model->at(i);
        BATON_RETURN_IF_ERROR(block.BackwardWeight(MicroBatch{next, nullptr, precision_}));
        for (Parameter* p : block.Parameters()) {
          bucket.params.push_back(p);
          bucket.bytes += p->grad.numel() * static_cast<int64_t>(sizeof(float));
        }
        if (bucket.bytes >= spec_.pipeline().reduce_bucket_bytes()) {
          reducer_->Enqueue(Action{ActionKind::kReduceGrad, stage, 0}, std::move(bucket.params),
                            deadline);
          bucket = StepState::Bucket();
        }
      }
    } else {
      BATON_RETURN_IF_ERROR(c->model->BackwardWeight(MicroBatch{next, nullptr, precision_}));
    }
    waiting.erase(waiting.begin());
    ++next;
    --st.inflight;
  }
  return absl::OkStatus();
}

std::vector<std::pair<int, Digest>> StageExecutor::BlockDigests() {
  std::vector<std::pair<int, Digest>> out;
  for (Chunk& c : chunks_) {
    for (int i = 0; i < c.model->size(); ++i) {
      out.emplace_back(c.blocks.first + i, BlockDigest(c.model->at(i)));
    }
  }
  return out;
}

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
            BATON_ASSIGN_OR_RETURN(
                x, transport_->Recv(schedule_.stage_to_rank[s - 1],
                                    TensorTag{options_.job_id, eval_step, m, s - 1,
                                              TensorKind::kActivation},
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
    status = WithMessage(status, absl::StrCat("rank ", rank_, " evaluation ", index + 1, ": ",
                                              status.message()));
    transport_->Abort(status);
    for (Chunk& c : chunks_) {
      for (int m = 0; m < M; ++m) c.model->Discard(m);
    }
    return status;
  }
  if (ChunkFor(n - 1) == nullptr) return std::optional<float>();
  BATON_RETURN_IF_ERROR(loss.Add(losses));
  return std::optional<float>(loss.Mean());
}

}  // namespace baton
