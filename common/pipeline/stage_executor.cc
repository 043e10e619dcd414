#include "common/pipeline/stage_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/hf.h"
#include "common/core/status.h"
#include "common/optim/optimizer_shards.h"
#include "common/pipeline/grad_reducer.h"
#include "common/pipeline/gradient_exchange.h"
#include "common/pipeline/step_state.h"
#include "common/pipeline/wire.h"
#include "common/spec/spec.h"

namespace baton {

namespace {

// Swaps each parameter's value with the tensor given for it, and back when it goes out of
// scope: the checkpoint and the digests read the float32 weights of a parameter kept as
// bf16 bits from the copy its owner handed over.
class ValuesSwapped {
 public:
  explicit ValuesSwapped(const std::map<Parameter*, Tensor*>& with) : with_(with) { Swap(); }
  ~ValuesSwapped() { Swap(); }
  ValuesSwapped(const ValuesSwapped&) = delete;
  ValuesSwapped& operator=(const ValuesSwapped&) = delete;

 private:
  void Swap() {
    for (const auto& [p, t] : with_) std::swap(p->value, *t);
  }
  const std::map<Parameter*, Tensor*>& with_;
};

}  // namespace

StageExecutor::StageExecutor() = default;
StageExecutor::~StageExecutor() = default;

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
  backend->SetAttentionKernel(AttentionKernelOf(spec));
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
  ex->replicas_ = data_parallel;
  ex->per_mb_ =
      spec.data().batch_size() / (static_cast<int64_t>(data_parallel) * schedule.num_microbatches);
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
  const std::optional<TokenModel> token_model = TokenModelOf(spec.model());
  const bool tied = token_model && token_model->tie_embeddings;
  ex->tied_ = tied;
  BATON_RETURN_IF_ERROR(
      CheckExchangeActions(schedule, rank, spec.optimizer().clip_grad_norm() > 0.0f, tied));
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
  for (size_t i = 0; i < ex->params_.size(); ++i)
    ex->index_of_[ex->params_[i]] = static_cast<int>(i);
  std::vector<Parameter*> updated = ex->params_;  // what this rank's optimizer updates
  if (ex->reducer_ != nullptr) {
    BATON_ASSIGN_OR_RETURN(updated, ex->PlanBuckets(spec.optimizer().shard()));
  }
  BATON_ASSIGN_OR_RETURN(ex->optimizer_, MakeOptimizer(spec.optimizer(), std::move(updated), tied));
  for (const Optimizer::Slot& s : ex->optimizer_->Slots()) {
    ex->optimizer_state_bytes_ += static_cast<int64_t>(s.state->nbytes());
  }
  if (ex->sharded_ && ex->precision_ == Precision::kBf16) {
    // A weight that is only ever rounded to bf16 for its products, and that another replica
    // updates, is kept here as those bits: half the bytes. Its owner keeps the float32
    // master, and the weights' all-gather rounds it into them after every step.
    const std::vector<int>& owned = ex->owned_by_[options.collective->rank()];
    const std::set<int> mine(owned.begin(), owned.end());
    for (size_t i = 0; i < ex->params_.size(); ++i) {
      Parameter* p = ex->params_[i];
      if (!p->bf16_operand || mine.contains(static_cast<int>(i))) continue;
      BATON_ASSIGN_OR_RETURN(
          Tensor bits, Tensor::TryEmpty(p->value.shape(), DType::kBFloat16, p->value.device()));
      backend->ToBf16(p->value.numel(), p->value.f32(), bits.bf16());
      p->value = std::move(bits);
      ex->packed_.push_back(p);
    }
  }
  return ex;
}

absl::StatusOr<std::vector<Parameter*>> StageExecutor::PlanBuckets(bool shard) {
  // Reduce order: each chunk's blocks last first (the order their gradients finish), each
  // block's parameters in order. The tied embedding's two ends are member 0's, so that
  // TIE_GRAD pairs the owners of both.
  std::vector<std::vector<int64_t>> groups;
  std::vector<Parameter*> flat;
  std::vector<int> block_of;
  std::vector<bool> pinned;
  for (Chunk& c : chunks_) {
    groups.emplace_back();
    for (int i = c.model->size() - 1; i >= 0; --i) {
      for (Parameter* p : c.model->at(i).Parameters()) {
        groups.back().push_back(p->value.numel());
        flat.push_back(p);
        block_of.push_back(i);
        pinned.push_back(tied_ && (p->name == kTiedEmbeddingName || p->name == kTiedOutputName));
      }
    }
  }
  BATON_ASSIGN_OR_RETURN(
      const ReduceLayout layout,
      PlanReduceLayout(groups, std::max<int64_t>(1, spec_.pipeline().reduce_bucket_bytes()),
                       replicas_, shard, pinned));
  sharded_ = layout.sharded;
  buckets_.assign(chunks_.size(), {});
  for (const GradBucket& b : layout.buckets) {
    ChunkBucket cb;
    cb.counts = b.counts;
    cb.after_block = block_of[b.params.front()];
    for (int i : b.params) {
      cb.params.push_back(flat[i]);
      cb.after_block = std::min(cb.after_block, block_of[i]);
    }
    buckets_[b.group].push_back(std::move(cb));
  }
  if (!sharded_) return params_;
  owned_by_.assign(replicas_, {});
  for (size_t i = 0; i < flat.size(); ++i)
    owned_by_[layout.owner[i]].push_back(index_of_.at(flat[i]));
  std::vector<Parameter*> mine;
  for (int i : owned_by_[options_.collective->rank()]) mine.push_back(params_[i]);
  return mine;
}

void StageExecutor::EnqueueBuckets(size_t chunk, int block, const Action& action, StepState& st,
                                   absl::Time deadline) {
  size_t& next = st.buckets_queued[chunk];
  const std::vector<ChunkBucket>& buckets = buckets_[chunk];
  for (; next < buckets.size() && buckets[next].after_block >= block; ++next) {
    const ChunkBucket& b = buckets[next];
    if (sharded_) {
      reducer_->EnqueueReduceScatter(action, b.params, b.counts, deadline);
    } else {
      reducer_->Enqueue(action, b.params, deadline);
    }
  }
}

absl::StatusOr<std::vector<double>> StageExecutor::GatherOwnedSums(bool squares,
                                                                   absl::Time deadline) {
  Collective& group = *options_.collective;
  const std::vector<int>& mine = owned_by_[group.rank()];
  std::vector<Parameter*> ps;
  for (int i : mine) ps.push_back(params_[i]);
  BATON_ASSIGN_OR_RETURN(const std::vector<double> own, GradientSums(ps, squares));
  // Each double travels as its bits, two floats: an all-gather copies and never adds.
  constexpr int64_t kFloats = sizeof(double) / sizeof(float);
  std::vector<int64_t> counts;
  for (const std::vector<int>& m : owned_by_)
    counts.push_back(kFloats * static_cast<int64_t>(m.size()));
  BATON_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                         ShardOffsets(counts, group.size(), "all-gather"));
  std::vector<float> host(static_cast<size_t>(offsets.back()));
  if (!own.empty()) {
    std::memcpy(host.data() + offsets[group.rank()], own.data(), own.size() * sizeof(double));
  }
  if (group.device() == Device::kCuda) {  // the engine works on GPU memory
    BATON_ASSIGN_OR_RETURN(Tensor staged,
                           Tensor::TryEmpty({offsets.back()}, DType::kFloat32, Device::kCuda));
    BATON_RETURN_IF_ERROR(staged.CopyFromHost(host.data()));
    BATON_RETURN_IF_ERROR(group.AllGather(staged.f32(), counts, deadline));
    BATON_RETURN_IF_ERROR(staged.CopyToHost(host.data()));
  } else {
    BATON_RETURN_IF_ERROR(group.AllGather(host.data(), counts, deadline));
  }
  std::vector<double> out(params_.size(), 0.0);
  for (size_t m = 0; m < owned_by_.size(); ++m) {
    for (size_t k = 0; k < owned_by_[m].size(); ++k) {
      std::memcpy(&out[owned_by_[m][k]], host.data() + offsets[m] + kFloats * k, sizeof(double));
    }
  }
  return out;
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
  if (!sharded_) return SnapshotBlocks(step_dir, info, Blocks(), *optimizer_);
  // Sharded, the replicas share the writing: member m writes the rank's blocks m, m + D,
  // m + 2D, ... (in the rank's block order) as part m, with the state the owners hand it.
  const int me = options_.collective->rank();
  const std::vector<Module*> all = Blocks();
  std::vector<Module*> mine;
  std::vector<int> indices;
  std::set<const Parameter*> keep;
  for (size_t i = 0; i < all.size(); ++i) {
    if (static_cast<int>(i % replicas_) != me) continue;
    mine.push_back(all[i]);
    indices.push_back(info.block_indices[i]);
    for (Parameter* p : all[i]->Parameters()) keep.insert(p);
  }
  info.block_indices = std::move(indices);
  info.part = me;
  std::deque<Tensor> copies;
  BATON_ASSIGN_OR_RETURN(const std::vector<Optimizer::Slot> slots,
                         GatherOptimizerState(keep, &copies));
  BATON_ASSIGN_OR_RETURN(ParamTensors masters, GatherMasters(keep, &copies));
  const ValuesSwapped swapped(masters);  // the blocks' float32 weights
  return SnapshotBlocks(step_dir, info, mine, slots, optimizer_->steps_taken());
}

absl::StatusOr<std::vector<CheckpointBlockFile>> StageExecutor::SaveCheckpoint(
    const std::string& step_dir, const std::string& job, int64_t step) {
  BATON_ASSIGN_OR_RETURN(CheckpointSnapshot snap, SnapshotCheckpoint(step_dir, job, step));
  BATON_RETURN_IF_ERROR(WriteSnapshot(snap));
  return snap.files;
}

absl::StatusOr<int64_t> StageExecutor::LoadCheckpoint(const std::string& step_dir) {
  if (!sharded_) return LoadBlocks(step_dir, Blocks(), *optimizer_);
  // The checkpoint holds every parameter's state: this replica loads its own into its
  // optimizer and reads the rest into host memory it then drops (LoadBlocks wants the
  // blocks' state whole, which also checks that it is all there).
  const SlotMap own = OwnSlots();
  std::deque<Tensor> others;
  std::vector<Optimizer::Slot> slots;
  for (Parameter* p : params_) {
    for (const std::string& name : OptimizerSlotNames(spec_.optimizer())) {
      const auto it = own.find({p, name});
      Tensor* state =
          it != own.end() ? it->second : &others.emplace_back(Tensor::Empty(p->value.shape()));
      slots.push_back(Optimizer::Slot{p, name, state});
    }
  }
  // The weights kept as bf16 bits load their float32 values into host memory first.
  ParamTensors masters;
  for (Parameter* p : packed_) masters[p] = &others.emplace_back(Tensor::Empty(p->value.shape()));
  int64_t steps_taken = -1;
  absl::StatusOr<int64_t> step;
  {
    const ValuesSwapped swapped(masters);
    step = LoadBlocks(step_dir, Blocks(), slots, &steps_taken);
  }
  if (!step.ok()) return step.status();
  for (Parameter* p : packed_) {
    BATON_RETURN_IF_ERROR(CopyFromHostAsBf16(masters.at(p)->f32(), p->value));
  }
  if (steps_taken >= 0) optimizer_->set_steps_taken(steps_taken);
  return *step;
}

StageExecutor::SlotMap StageExecutor::OwnSlots() {
  SlotMap own;
  for (const Optimizer::Slot& s : optimizer_->Slots()) own[{s.param, s.name}] = s.state;
  return own;
}

absl::StatusOr<std::vector<Optimizer::Slot>> StageExecutor::GatherOptimizerState(
    const std::set<const Parameter*>& keep, std::deque<Tensor>* copies) {
  const std::vector<std::string> names = OptimizerSlotNames(spec_.optimizer());
  const SlotMap own = OwnSlots();
  std::map<std::string, ParamTensors> gathered;  // by slot name: the other owners' state
  for (const std::string& name : names) {
    ParamTensors mine;
    std::set<const Parameter*> want;
    for (Parameter* p : params_) {
      const auto it = own.find({p, name});
      if (it != own.end()) {
        mine[p] = it->second;
      } else if (keep.contains(p)) {
        want.insert(p);
      }
    }
    BATON_ASSIGN_OR_RETURN(gathered[name], GatherFromOwners(mine, want, copies));
  }
  std::vector<Optimizer::Slot> out;  // Slots' order: parameter by parameter
  for (Parameter* p : params_) {
    if (!keep.contains(p)) continue;
    for (const std::string& name : names) {
      const auto it = own.find({p, name});
      out.push_back(Optimizer::Slot{p, name, it != own.end() ? it->second : gathered[name].at(p)});
    }
  }
  return out;
}

absl::StatusOr<StageExecutor::ParamTensors> StageExecutor::GatherMasters(
    const std::set<const Parameter*>& keep, std::deque<Tensor>* copies) {
  if (!sharded_ || precision_ != Precision::kBf16) return ParamTensors{};
  // Every member takes part (another may keep weights as bf16 bits where this one does
  // not).
  ParamTensors mine;
  for (int i : owned_by_[options_.collective->rank()]) mine[params_[i]] = &params_[i]->value;
  std::set<const Parameter*> want;
  for (Parameter* p : packed_) {
    if (keep.contains(p)) want.insert(p);
  }
  return GatherFromOwners(mine, want, copies);
}

absl::StatusOr<StageExecutor::ParamTensors> StageExecutor::GatherFromOwners(
    const ParamTensors& mine, const std::set<const Parameter*>& want, std::deque<Tensor>* copies) {
  ParamTensors out;
  const absl::Time deadline = absl::Now() + options_.recv_timeout;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (const ChunkBucket& b : buckets_[c]) {
      // The other owners' tensors of this bucket land on the device, one bucket at a time.
      std::vector<Tensor> scratch;
      scratch.reserve(b.params.size());  // tensors points into it
      std::vector<Tensor*> tensors;
      std::vector<Parameter*> landed;  // scratch's parameters, in order
      for (Parameter* p : b.params) {
        const auto it = mine.find(p);
        if (it != mine.end()) {
          tensors.push_back(it->second);
          continue;
        }
        BATON_ASSIGN_OR_RETURN(
            Tensor t, Tensor::TryEmpty(p->value.shape(), DType::kFloat32, p->value.device()));
        scratch.push_back(std::move(t));
        tensors.push_back(&scratch.back());
        landed.push_back(p);
      }
      reducer_->EnqueueAllGather(Action{ActionKind::kStep, chunks_[c].stage, 0}, std::move(tensors),
                                 b.counts, deadline);
      std::vector<ActionTiming> ignored;
      BATON_RETURN_IF_ERROR(reducer_->WaitAll(deadline, &ignored));
      for (size_t k = 0; k < landed.size(); ++k) {
        if (!want.contains(landed[k])) continue;
        Tensor& host = copies->emplace_back(Tensor::Empty(landed[k]->value.shape()));
        BATON_RETURN_IF_ERROR(scratch[k].CopyToHost(host.f32()));
        out[landed[k]] = &host;
      }
    }
  }
  return out;
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
  result.optimizer_state_bytes = optimizer_state_bytes_;
  result.grad_norm = st.grad_norm;
  result.learning_rate = st.learning_rate;
  return result;
}

absl::Status StageExecutor::Execute(const Action& a, StepState& st, int64_t* bytes) {
  const absl::Time deadline = absl::Now() + options_.recv_timeout;
  switch (a.kind) {
    case ActionKind::kForward:
      return RunForward(a, st);
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      return RunBackward(a, st);
    case ActionKind::kBackwardWeight:
      return RunWeightGradient(a.stage, a.microbatch, st);
    case ActionKind::kSendF:
    case ActionKind::kSendB:
      return RunSend(a, st, bytes);
    case ActionKind::kRecvF:
    case ActionKind::kRecvB:
      return RunRecv(a, st, deadline, bytes);
    case ActionKind::kReduceGrad:
      return RunReduceGrad(a, st, deadline);
    case ActionKind::kTieGrad:
      return RunTieGrad(a, st, deadline, bytes);
    case ActionKind::kClipGrad:
      return RunClipGrad(a, st, deadline, bytes);
    case ActionKind::kStep:
      return RunOptimizerStep(st, deadline);
  }
  return absl::InternalError("unknown action kind");
}

absl::StatusOr<const Batch*> StageExecutor::BatchFor(int m, StepState& st) {
  auto it = st.batches.find(m);
  if (it == st.batches.end()) {
    // This replica's share: the step's micro-batch replica * M + m.
    const int64_t global_mb = static_cast<int64_t>(options_.replica) * st.M + m;
    BATON_ASSIGN_OR_RETURN(Batch b, dataset_->Get(st.step, global_mb * per_mb_, per_mb_));
    it = st.batches.emplace(m, std::move(b)).first;
  }
  return &it->second;
}

absl::Status StageExecutor::WaitForReductions(StepState& st, absl::Time deadline) {
  if (reducer_ == nullptr) return absl::OkStatus();
  const auto wait_start = std::chrono::steady_clock::now();
  const absl::Status s = reducer_->WaitAll(deadline, &st.reductions);
  st.reduce_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - wait_start)
                           .count();
  return s;
}

absl::Status StageExecutor::RunForward(const Action& a, StepState& st) {
  const int s = a.stage;
  const int m = a.microbatch;
  const int last_stage = schedule_.num_stages() - 1;
  Chunk* c = ChunkFor(s);
  if (c == nullptr) return absl::InternalError("stage not on this rank");
  Tensor x;
  if (s == 0) {
    BATON_ASSIGN_OR_RETURN(const Batch* b, BatchFor(m, st));
    x = b->inputs;
  } else if (schedule_.stage_to_rank[s - 1] == rank_) {
    BATON_ASSIGN_OR_RETURN(x, st.Take(st.activations_out, s - 1, m, "local activation", a));
  } else {
    BATON_ASSIGN_OR_RETURN(x, st.Take(st.activations_in, s, m, "received activation", a));
  }
  const Tensor* targets = nullptr;
  if (s == last_stage) {
    BATON_ASSIGN_OR_RETURN(const Batch* b, BatchFor(m, st));
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

absl::Status StageExecutor::RunBackward(const Action& a, StepState& st) {
  const int s = a.stage;
  const int m = a.microbatch;
  Chunk* c = ChunkFor(s);
  if (c == nullptr) return absl::InternalError("stage not on this rank");
  Tensor dy;
  if (s == schedule_.num_stages() - 1) {
    dy = Tensor::Empty({1});
    dy.f32()[0] = 1.0f / static_cast<float>(replicas_ * st.M);
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
  BATON_RETURN_IF_ERROR(c->model->BackwardInput(MicroBatch{m, nullptr, precision_}, dy, &dx));
  if (s > 0) st.gradients_out[StepState::Key(s, m)] = std::move(dx);
  if (a.kind == ActionKind::kBackward) return RunWeightGradient(s, m, st);
  return absl::OkStatus();
}

absl::Status StageExecutor::RunSend(const Action& a, StepState& st, int64_t* bytes) {
  const bool activation = CarriesActivation(a.kind);
  BATON_ASSIGN_OR_RETURN(
      Tensor out, st.Take(activation ? st.activations_out : st.gradients_out, a.stage, a.microbatch,
                          activation ? "activation" : "gradient", a));
  BATON_ASSIGN_OR_RETURN(const Tensor wire, ToWire(out, precision_));
  *bytes = static_cast<int64_t>(wire.nbytes());
  const TensorTag tag{options_.job_id, st.step, a.microbatch, a.stage,
                      activation ? TensorKind::kActivation : TensorKind::kGradient};
  st.sends.emplace_back(a, transport_->Send(schedule_.stage_to_rank[PeerStage(a)], tag, wire));
  return absl::OkStatus();
}

absl::Status StageExecutor::RunRecv(const Action& a, StepState& st, absl::Time deadline,
                                    int64_t* bytes) {
  // An activation comes from the stage before, an input gradient from the stage after.
  const bool activation = CarriesActivation(a.kind);
  const int from = PeerStage(a);
  const TensorTag tag{options_.job_id, st.step, a.microbatch, from,
                      activation ? TensorKind::kActivation : TensorKind::kGradient};
  BATON_ASSIGN_OR_RETURN(Tensor t, transport_->Recv(schedule_.stage_to_rank[from], tag, deadline));
  Chunk* c = ChunkFor(a.stage);
  if (c == nullptr) return absl::InternalError("stage not on this rank");
  const int boundary = activation ? c->blocks.first : c->blocks.last;
  BATON_RETURN_IF_ERROR(CheckReceived(t, BlockInputShape(spec_.model(), boundary, per_mb_),
                                      activation ? "activation" : "gradient", a,
                                      WireDType(precision_)));
  *bytes = static_cast<int64_t>(t.nbytes());
  BATON_ASSIGN_OR_RETURN(t, FromWire(t, options_.device));
  (activation ? st.activations_in : st.gradients_in)[StepState::Key(a.stage, a.microbatch)] =
      std::move(t);
  return absl::OkStatus();
}

absl::Status StageExecutor::RunReduceGrad(const Action& a, StepState& st, absl::Time deadline) {
  const int s = a.stage;
  if (ChunkFor(s) == nullptr) return absl::InternalError("stage not on this rank");
  if (reducer_ == nullptr) {
    return absl::FailedPreconditionError("REDUCE_GRAD without a data-parallel group");
  }
  BATON_RETURN_IF_ERROR(st.WeightGradientsRan(s, "gradient reduction"));
  // The stage's last weight gradient queued each bucket as its blocks finished; any left
  // goes now.
  EnqueueBuckets(static_cast<size_t>(ChunkFor(s) - chunks_.data()), 0, a, st, deadline);
  return absl::OkStatus();
}

absl::Status StageExecutor::RunOptimizerStep(StepState& st, absl::Time deadline) {
  for (const Chunk& c : chunks_) {
    BATON_RETURN_IF_ERROR(st.WeightGradientsRan(c.stage, "optimizer step"));
  }
  // The update needs the group's sums: wait for this step's reductions.
  BATON_RETURN_IF_ERROR(WaitForReductions(st, deadline));
  // Divergence is a failure: a non-finite gradient would make every weight it touches
  // garbage. One sum per gradient (inf and nan survive a double sum of floats), all of
  // this rank's in one batched call (one read back on a GPU); the first non-finite one
  // in chunk and parameter order is named.
  // Sharded, each owner sums its own gradients and every member sees every sum, so the
  // group names the same parameter.
  std::vector<Parameter*> params;
  std::vector<int> stage_of;  // params[i] belongs to stage stage_of[i]
  for (const Chunk& c : chunks_) {
    for (Parameter* p : c.model->Parameters()) {
      params.push_back(p);
      stage_of.push_back(c.stage);
    }
  }
  std::vector<double> sums;
  if (sharded_ && st.grad_norm.has_value()) {
    // CLIP_GRAD's norm was finite: its squares, each of one whole gradient summed in
    // double (no float squares overflow it), were finite, so every gradient is (the tied
    // output projection's is the embedding's). No second exchange.
    sums.assign(params.size(), 0.0);
  } else if (sharded_) {
    BATON_ASSIGN_OR_RETURN(const std::vector<double> by_index,
                           GatherOwnedSums(/*squares=*/false, deadline));
    for (const Parameter* p : params) sums.push_back(by_index[index_of_.at(p)]);
  } else {
    BATON_ASSIGN_OR_RETURN(sums, GradientSums(params, /*squares=*/false));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!std::isfinite(sums[i])) {
      return DivergedError(absl::StrCat("training diverged: the gradient of ", params[i]->name,
                                        " (stage ", stage_of[i], ") is not finite"));
    }
  }
  // The schedule's rate for this step (a resume continues it from the checkpoint's step).
  st.learning_rate = LearningRateAt(spec_.optimizer(), st.step, spec_.steps());
  optimizer_->Step(st.learning_rate);
  if (sharded_) {
    // Every owner hands its updated weights to the group, bucket by bucket (timed as STEP's).
    for (size_t c = 0; c < chunks_.size(); ++c) {
      for (const ChunkBucket& b : buckets_[c]) {
        reducer_->EnqueueAllGather(Action{ActionKind::kStep, chunks_[c].stage, 0}, b.params,
                                   b.counts, deadline);
      }
    }
    BATON_RETURN_IF_ERROR(WaitForReductions(st, deadline));
  }
  st.stepped = true;
  // A device's asynchronous failures (a kernel fault, a failed launch) end the step here.
  if (options_.device != Device::kCpu) return DeviceSynchronize(options_.device);
  return absl::OkStatus();
}

Parameter* StageExecutor::TiedParameter(int stage, bool output) {
  Chunk* c = ChunkFor(stage);
  if (c == nullptr) return nullptr;
  return output ? FindParameter(c->model->at(c->model->size() - 1), kTiedOutputName)
                : FindParameter(c->model->at(0), kTiedEmbeddingName);
}

absl::Status StageExecutor::RunTieGrad(const Action& a, StepState& st, absl::Time deadline,
                                       int64_t* bytes) {
  const int s = a.stage;
  const int n = schedule_.num_stages();
  const int other = PeerStage(a, n);
  for (int end : {s, other}) {
    if (ChunkFor(end) != nullptr) BATON_RETURN_IF_ERROR(st.WeightGradientsRan(end, a.ToString()));
  }
  if (st.tied) return absl::OkStatus();  // the other end is on this rank and summed both
  // The sum is over final gradients: this step's replica sums first.
  BATON_RETURN_IF_ERROR(WaitForReductions(st, deadline));
  if (sharded_ && options_.collective->rank() != 0) {
    // Member 0 owns both ends (PlanBuckets): it sums them, and the all-gather after STEP
    // brings the updated embedding here.
    st.tied = true;
    return absl::OkStatus();
  }
  // Stage 0 holds the embedding, the last stage the output projection (with one stage,
  // the one stage both).
  Parameter* mine = TiedParameter(s, /*output=*/s != 0);
  if (mine == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(a.ToString(), ": stage ", s, " holds no tied embedding (",
                     s == 0 ? kTiedEmbeddingName : kTiedOutputName, ")"));
  }
  const int peer = schedule_.stage_to_rank[other];
  if (peer == rank_) {
    // Both ends here (one stage, or a V-shaped placement).
    Parameter* embedding = TiedParameter(0, /*output=*/false);
    Parameter* output = TiedParameter(n - 1, /*output=*/true);
    if (embedding == nullptr || output == nullptr) {
      return absl::InternalError("the tied embedding's other end is missing");
    }
    BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(options_.device));
    SumTiedGradients(*embedding, *output, *be);
  } else {
    const ExchangeLink link{transport_, options_.job_id, st.step, deadline};
    BATON_RETURN_IF_ERROR(
        SumTiedGradientWithPeer(a, other, peer, *mine, options_.device, link, bytes));
  }
  st.tied = true;
  return absl::OkStatus();
}

absl::Status StageExecutor::RunClipGrad(const Action& a, StepState& st, absl::Time deadline,
                                        int64_t* bytes) {
  for (const Chunk& c : chunks_) {
    BATON_RETURN_IF_ERROR(st.WeightGradientsRan(c.stage, a.ToString()));
  }
  // The norm is of the final gradients: this step's replica sums first.
  BATON_RETURN_IF_ERROR(WaitForReductions(st, deadline));
  ClipInputs in;
  in.rank = rank_;
  in.num_ranks = schedule_.num_ranks;
  in.num_blocks = static_cast<size_t>(ModelBlockCount(spec_.model()));
  for (Chunk& c : chunks_) {
    for (int i = 0; i < c.model->size(); ++i) {
      in.blocks.push_back({static_cast<size_t>(c.blocks.first + i), &c.model->at(i)});
    }
  }
  in.tied = tied_;
  in.max_norm = spec_.optimizer().clip_grad_norm();
  in.params = params_;
  if (sharded_) {
    // Each parameter's square from its owner; the blocks' parts add them as
    // BlockGradSquares does, so the norm has the unsharded bits.
    BATON_ASSIGN_OR_RETURN(const std::vector<double> squares,
                           GatherOwnedSums(/*squares=*/true, deadline));
    std::vector<Module*> blocks;
    for (const IndexedBlock& b : in.blocks) blocks.push_back(b.block);
    std::vector<double> parts;
    for (const std::vector<Parameter*>& counted : NormParameters(blocks, tied_)) {
      double part = 0.0;
      for (const Parameter* p : counted) part += squares[index_of_.at(p)];
      parts.push_back(part);
    }
    in.block_squares = std::move(parts);
    in.params.clear();  // only the owned gradients are final, and only they are scaled
    for (int i : owned_by_[options_.collective->rank()]) in.params.push_back(params_[i]);
  }
  const ExchangeLink link{transport_, options_.job_id, st.step, deadline};
  BATON_ASSIGN_OR_RETURN(const float norm, ClipGradients(a, in, link, bytes));
  st.grad_norm = norm;
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
      const size_t chunk = static_cast<size_t>(c - chunks_.data());
      for (int i = c->model->size() - 1; i >= 0; --i) {
        BATON_RETURN_IF_ERROR(
            c->model->at(i).BackwardWeight(MicroBatch{next, nullptr, precision_}));
        EnqueueBuckets(chunk, i, Action{ActionKind::kReduceGrad, stage, 0}, st, deadline);
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

absl::StatusOr<std::vector<std::pair<int, Digest>>> StageExecutor::BlockDigests() {
  std::deque<Tensor> copies;
  BATON_ASSIGN_OR_RETURN(
      ParamTensors masters,
      GatherMasters(std::set<const Parameter*>(params_.begin(), params_.end()), &copies));
  const ValuesSwapped swapped(masters);  // the float32 weights, not their bf16 bits
  std::vector<std::pair<int, Digest>> out;
  for (Chunk& c : chunks_) {
    for (int i = 0; i < c.model->size(); ++i) {
      out.emplace_back(c.blocks.first + i, BlockDigest(c.model->at(i)));
    }
  }
  return out;
}

}  // namespace baton
