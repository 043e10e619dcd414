// The stage executor: runs one rank's clock, step after step.
//
// A rank owns one or more pipeline stages (chunks of contiguous blocks; several under
// interleaved schedules). Each step it walks its clock (common/schedule) action by action:
// forward and backward halves on its chunks, tagged sends and receives through a Transport,
// and the optimizer update. The first stage regenerates its micro-batch inputs and the
// last stage its targets from the dataset's seed, so no data moves between ranks.
//
// Bit-exactness with the reference trainer (common/train/reference_trainer.h) rests on:
//  - each micro-batch is computed by the same block code in the same order;
//  - each stage's weight gradients accumulate in micro-batch order. The executor enforces
//    this whatever the clock says: a W (or the W half of a B) that arrives before an
//    earlier micro-batch's W of the same stage waits, stashed, until that one has run;
//  - the last stage's step loss is the double sum of micro-batch losses in order, over M.
//
// In-flight accounting: a (stage, micro-batch) is in flight from its forward until its
// weight gradient has run; the executor records the peak over the step.
//
// Data parallelism (spec.pipeline.data_parallel D > 1, clocks with REDUCE_GRAD): replica d
// trains on its share of the batch (micro-batch m of this rank is the step's micro-batch
// d*M + m, of batch/(D*M) samples, with loss scale 1/(D*M)). A stage's last weight
// gradient runs block by block, last block first, and hands each full bucket
// (spec.pipeline.reduce_bucket_bytes) of final gradients to a communication thread, which
// sums it over the group (options.collective) while the earlier blocks still compute;
// REDUCE_GRAD(s) hands over the rest, and STEP waits for every reduction of the step.
// Reductions run in clock order, the same on every replica, so the group's collectives
// line up.
//
// Recomputation (spec.pipeline.recompute RECOMPUTE_FULL): after a forward the executor
// drops the blocks' stash for that micro-batch and keeps only the chunk's input (and the
// last stage's targets); a B or I action first reruns the forward from them. Forward is
// deterministic, so the weights are the same bits as without; an I/W split still holds the
// W half's stash from I to W.
//
// Tied embeddings (clocks with TIE_GRAD, model.h): the first and the last stage each hold the
// token embedding; TIE_GRAD, after every other action of their ranks, sums the two copies'
// gradients (their replica sums, when there are replicas) so both take the same update.
//
// Gradient clipping (clocks with CLIP_GRAD, optimizer.clip_grad_norm > 0; docs/training.md):
// on every rank right before STEP, once the gradients are final (replica sums, TIE_GRAD).
// Each rank computes its blocks' squared gradient norms (BlockGradSquares: one double per
// model block, the tied output projection not counted); the vector of every block's part
// travels along the ranks 0 -> 1 -> ... -> S-1, each filling its blocks' entries; the last
// sums them in block order, and that total travels back S-1 -> ... -> 0
// (TensorKind::kGradNorm, the doubles' bits in an int32 tensor). The sum's order is the
// blocks', not the ranks', so the norm and the coefficient do not depend on the partition
// and equal the reference trainer's. A non-finite norm fails
// the step as divergence. Replicas need no exchange: their gradients are already summed.
//
// The learning rate of step s is LearningRateAt(spec.optimizer, s, spec.steps): a resumed
// run continues the schedule from its checkpoint's step.
//
// Errors: any failure (a deadline, a bad tensor, an aborted peer) aborts the transport so
// the other ranks stop too, drops everything stashed for the step, and is returned. Weights
// are unchanged unless the failure came after the STEP action (only the final send waits
// follow it). Not thread-safe: one thread runs a rank.
#ifndef BATON_COMMON_PIPELINE_STAGE_EXECUTOR_H_
#define BATON_COMMON_PIPELINE_STAGE_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "baton/v1/job.pb.h"
#include "common/checkpoint/checkpoint.h"
#include "common/comm/collective.h"
#include "common/comm/transport.h"
#include "common/core/device_timer.h"
#include "common/core/digest.h"
#include "common/data/dataset.h"
#include "common/nn/model.h"
#include "common/optim/optimizer.h"
#include "common/pipeline/action_timing.h"
#include "common/plan/partition.h"
#include "common/schedule/schedule.h"
#include "common/spec/spec.h"

namespace baton {

// Sees each action as it ends (metrics that must be live, such as the in-flight count).
// Called on the executor's thread, between actions: keep it short and do not block.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // `inflight`: the (stage, micro-batch) pairs in flight after the action.
  virtual void OnAction(const ActionTiming& timing, int inflight) = 0;
};

struct StageExecutorOptions {
  uint64_t job_id = 0;                              // goes into every tensor tag
  // Where this rank's blocks live and compute. Received tensors are moved here; what it
  // sends leaves from here (a transport stages it as it needs).
  Device device = Device::kCpu;
  absl::Duration recv_timeout = absl::Seconds(60);  // deadline of every receive and send wait
  StepObserver* observer = nullptr;                 // not owned; may be null
  // Measures ActionTiming::device_ns; not owned. When null the executor makes its own for
  // `device` (NewDeviceTimer: none on the CPU).
  DeviceTimer* device_timer = nullptr;
  // Where the job's text file may be read from (a worker's --data_root); default: anywhere.
  DataAccess data;
  // Data parallelism (spec.pipeline.data_parallel D > 1): which replica of the pipeline
  // this rank belongs to (its share of every step's batch), and its handle on the group of
  // the D ranks that hold the same stages, which REDUCE_GRAD actions sum gradients over.
  // Not owned; required when the clock has REDUCE_GRAD actions.
  int replica = 0;
  Collective* collective = nullptr;
  // Polled before every compute action of a step and every micro-batch of an evaluation:
  // once it reads true, the step or evaluation ends with ABORTED, as a failure does. It lets
  // a cancel reach a rank that has nothing to receive (a single-stage job, an evaluation's
  // first stage), whose transport's abort would never wake it. Not owned; may be null.
  const std::atomic<bool>* stop = nullptr;
};

struct RankStepResult {
  int rank = 0;
  // Per micro-batch losses, in micro-batch order; only on the rank owning the last stage.
  std::vector<float> losses;
  int peak_inflight = 0;
  // The clock's actions as they ran, in clock order.
  std::vector<ActionTiming> timeline;
  // After the clock, the waits for sends still in flight, each naming its send action;
  // only waits that blocked are listed.
  std::vector<ActionTiming> send_waits;
  // Each REDUCE_GRAD's reduction as it ran on the communication thread (its start and end,
  // the gradient bytes it summed), in clock order; empty without data parallelism.
  std::vector<ActionTiming> reductions;
  // How long the rank's thread waited for them (at TIE_GRAD, CLIP_GRAD and STEP, and for a
  // sharded optimizer's weights all-gather after the update): the part of the reductions
  // not hidden under the clock.
  int64_t reduce_wait_ns = 0;
  // The optimizer state this rank holds, in bytes: its replica's share with a sharded
  // optimizer (spec.optimizer.shard), else all of its parameters'.
  int64_t optimizer_state_bytes = 0;
  absl::Time start;    // wall clock when the step started on this rank
  int64_t end_ns = 0;  // when the step ended (every send gone), since start
  // The learning rate the step used (LearningRateAt), and the global gradient norm before
  // clipping (CLIP_GRAD; set when the job clips: optimizer.clip_grad_norm); the same on
  // every rank.
  float learning_rate = 0;
  std::optional<float> grad_norm;
  // The validation loss, on steps that evaluated (JobSpec.eval), on the rank owning the
  // last stage.
  std::optional<float> val_loss;
};

class GradReducer;  // grad_reducer.h
class StepState;    // step_state.h

class StageExecutor {
 public:
  ~StageExecutor();
  // `spec` must be validated (common/spec); `schedule` lowered and validated; `stage_blocks`
  // gives the block range of every global stage (size schedule.num_stages()). Builds this
  // rank's chunks, its optimizer, and the dataset. `transport` is not owned.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const ValidatedJobSpec& spec, const Schedule& schedule,
      const std::vector<BlockRange>& stage_blocks, int rank, Transport* transport,
      const StageExecutorOptions& options);

  // Runs the clock once for training step `step` (0-based).
  absl::StatusOr<RankStepResult> RunStep(int64_t step);

  // Validation (JobSpec.eval), between steps: the evaluation after step `index` (0-based;
  // its tensors' tags use negative steps, never a training step's) runs eval.batches
  // validation batches forward through this rank's chunks, every micro-batch in order,
  // stage by stage: the first stage reads the inputs (Dataset::GetValidation), the last
  // the targets, and activations travel between ranks as in training; nothing is stashed
  // and no weight changes. Each replica evaluates the whole batch (the same loss on each).
  // Returns the mean loss over the batches' micro-batches (StepLoss) on the rank owning
  // the last stage, nullopt elsewhere. Every rank of the job must call it with the same
  // index. Errors abort the transport, like a step's.
  absl::StatusOr<std::optional<float>> Evaluate(int64_t index);
  // Whether step `step` (0-based, just trained) is followed by an evaluation: every
  // eval.every steps and after the last; false without JobSpec.eval.
  bool EvaluatesAfter(int64_t step) const;

  int rank() const { return rank_; }
  // Digests of the blocks this rank owns, by global block index: of their float32 weights.
  // Between steps only. In a sharded bf16 job the owners hand their float32 weights over
  // to the replicas that keep bf16 bits (KeepsBf16Weights), so every replica of the rank
  // calls it at the same point.
  absl::StatusOr<std::vector<std::pair<int, Digest>>> BlockDigests();
  // Whether this rank keeps weights it does not update as bf16 bits (a sharded optimizer
  // in a bf16 job: Parameter::bf16_operand ones another replica owns).
  bool KeepsBf16Weights() const { return !packed_.empty(); }
  // Parameters of this rank's chunks, in stage then block order.
  const std::vector<Parameter*>& parameters() const { return params_; }
  // The optimizer over the parameters this rank updates: all of them, or with a sharded
  // optimizer (spec.optimizer.shard) the ones its replica owns.
  Optimizer& optimizer() { return *optimizer_; }

  // Writes this rank's blocks and their optimizer state into checkpoint directory
  // `step_dir` with the rank's manifest (common/checkpoint/checkpoint.h), as the state of
  // job `job` after step `step`. Between steps only. With a sharded optimizer every
  // replica of the rank calls it (or SnapshotCheckpoint) at the same point, and each
  // writes a part of the rank's blocks (member m the blocks m, m + D, ... in the rank's
  // block order, under manifest part m; a member with none writes an empty manifest): the
  // owners hand each writer the state of its blocks (and, where it keeps weights as bf16
  // bits, KeepsBf16Weights, their float32 weights) through the group. The files are those
  // of an unsharded job, so the checkpoint loads on any D and any partition.
  absl::StatusOr<std::vector<CheckpointBlockFile>> SaveCheckpoint(const std::string& step_dir,
                                                                  const std::string& job,
                                                                  int64_t step);
  // The same checkpoint encoded in memory (common/checkpoint/checkpoint.h), to be written
  // with WriteSnapshot while later steps run. Between steps only. Sharded, each replica's
  // part (SaveCheckpoint).
  absl::StatusOr<CheckpointSnapshot> SnapshotCheckpoint(const std::string& step_dir,
                                                        const std::string& job, int64_t step);
  // Loads this rank's blocks and optimizer state from a complete checkpoint written by any
  // partition; returns its step (the next RunStep's step). Before the first step only.
  absl::StatusOr<int64_t> LoadCheckpoint(const std::string& step_dir);

 private:
  struct Chunk {
    int stage = 0;
    BlockRange blocks;
    std::unique_ptr<Sequential> model;
  };

  StageExecutor();
  // Runs one action of the clock: a dispatch to the handlers below, each of which checks
  // the order the clock gave (FAILED_PRECONDITION when it runs an action too early).
  // `bytes` receives the payload size of a send or receive.
  absl::Status Execute(const Action& a, StepState& st, int64_t* bytes);
  absl::Status RunForward(const Action& a, StepState& st);
  // B (then its W half) or I: the input gradient, after rerunning the forward when the
  // stage recomputes.
  absl::Status RunBackward(const Action& a, StepState& st);
  // W of (stage, microbatch), or of the micro-batches stashed before it in order.
  absl::Status RunWeightGradient(int stage, int microbatch, StepState& st);
  absl::Status RunSend(const Action& a, StepState& st, int64_t* bytes);  // SEND_F, SEND_B
  absl::Status RunRecv(const Action& a, StepState& st, absl::Time deadline,
                       int64_t* bytes);  // RECV_F, RECV_B
  // REDUCE_GRAD: hands the stage's remaining gradients to the reducer.
  absl::Status RunReduceGrad(const Action& a, StepState& st, absl::Time deadline);
  // TIE_GRAD (action.h): sums the tied embedding's gradient with the other end's.
  absl::Status RunTieGrad(const Action& a, StepState& st, absl::Time deadline, int64_t* bytes);
  // CLIP_GRAD (action.h): the global gradient norm's exchange, then the scaling.
  absl::Status RunClipGrad(const Action& a, StepState& st, absl::Time deadline, int64_t* bytes);
  // STEP: waits for the replica sums, checks every gradient is finite, updates.
  absl::Status RunOptimizerStep(StepState& st, absl::Time deadline);
  // Micro-batch `m` of this replica's share of the step's batch, read once.
  absl::StatusOr<const Batch*> BatchFor(int m, StepState& st);
  // With data parallelism, waits for the step's reductions so far (GradReducer::WaitAll),
  // adding the wait to StepState::reduce_wait_ns.
  absl::Status WaitForReductions(StepState& st, absl::Time deadline);
  // Builds buckets_ and the ownership from the layout of this rank's parameters; returns
  // the parameters this member updates.
  absl::StatusOr<std::vector<Parameter*>> PlanBuckets(bool shard);
  // Queues chunk `chunk`'s complete buckets not yet queued, once the W of local block
  // `block` ran (every one with `block` = 0).
  void EnqueueBuckets(size_t chunk, int block, const Action& action, StepState& st,
                      absl::Time deadline);
  // Sharded: every parameter's gradient sum (Backend::Sum, or SumSquares with `squares`),
  // indexed as params_, each computed by its owner and all-gathered over the group. After
  // WaitForReductions only (the caller's thread then has the group to itself).
  absl::StatusOr<std::vector<double>> GatherOwnedSums(bool squares, absl::Time deadline);
  // Sharded, between steps: the optimizer state of the parameters in `keep` as slots in
  // Slots' order, this replica's own tensors for what it owns and host copies (kept in
  // `copies`) of the owners' for the rest, all-gathered bucket by bucket (the device holds
  // one bucket of other replicas' state at a time). Every replica of the rank calls it at
  // the same point, each with the parameters it keeps.
  absl::StatusOr<std::vector<Optimizer::Slot>> GatherOptimizerState(
      const std::set<const Parameter*>& keep, std::deque<Tensor>* copies);
  // Sharded, between steps, every member at the same point: for each bucket, all-gathers
  // the float32 tensors `mine` gives for the parameters this member owns; the others' land
  // on the device one bucket at a time, and host copies (kept in `copies`) of those of
  // the parameters in `want` are returned.
  using ParamTensors = std::map<Parameter*, Tensor*>;
  absl::StatusOr<ParamTensors> GatherFromOwners(const ParamTensors& mine,
                                                const std::set<const Parameter*>& want,
                                                std::deque<Tensor>* copies);
  // Sharded bf16 (every member takes part; nothing otherwise): host copies of the owners'
  // float32 weights of the parameters in `keep` that this member keeps as bf16 bits.
  absl::StatusOr<ParamTensors> GatherMasters(const std::set<const Parameter*>& keep,
                                             std::deque<Tensor>* copies);
  // This rank's optimizer state tensors by (parameter, slot name).
  using SlotMap = std::map<std::pair<const Parameter*, std::string>, Tensor*>;
  SlotMap OwnSlots();
  // The token embedding (first block of `stage`) or the output projection (its last block,
  // when `output`); null if not here.
  Parameter* TiedParameter(int stage, bool output);
  Chunk* ChunkFor(int stage);
  // Whether options_.stop says to stop, and the error a step or evaluation then ends with.
  bool Stopped() const;
  absl::Status StoppedError(absl::string_view where) const;
  std::vector<Module*> Blocks();  // every chunk's blocks, in stage then block order

  baton::v1::JobSpec spec_;
  Precision precision_ = Precision::kFp32;  // PrecisionOf(spec_)
  Schedule schedule_;
  int rank_ = 0;
  Transport* transport_ = nullptr;
  StageExecutorOptions options_;
  std::unique_ptr<Dataset> dataset_;
  std::vector<Chunk> chunks_;  // ascending stage order
  std::vector<Parameter*> params_;
  std::unique_ptr<Optimizer> optimizer_;
  bool tied_ = false;  // the model ties its embeddings (TokenModel::tie_embeddings)
  // By global stage: whether it recomputes (spec.pipeline.recompute is RECOMPUTE_FULL and
  // the stage is in recompute_stages, or that list is empty).
  std::vector<bool> recompute_;
  int replicas_ = 1;                      // spec.pipeline.data_parallel, at least 1
  int64_t per_mb_ = 0;                    // samples in one of this replica's micro-batches
  std::unique_ptr<GradReducer> reducer_;  // with data parallelism: the communication thread
  // With data parallelism: each chunk's buckets (optimizer_shards.h), in reduce order. A
  // bucket is complete once the W of block `after_block` (local) ran, its lowest.
  struct ChunkBucket {
    std::vector<Parameter*> params;
    std::vector<int64_t> counts;  // sharded: the members' runs
    int after_block = 0;
  };
  std::vector<std::vector<ChunkBucket>> buckets_;  // by chunk, as chunks_
  // The sharded optimizer (spec.optimizer.shard): which of params_ each member of the
  // group owns, member by member (the layout of GatherOwnedSums), and whether this is one.
  bool sharded_ = false;
  std::vector<std::vector<int>> owned_by_;              // by member: indices into params_, in order
  std::unordered_map<const Parameter*, int> index_of_;  // params_[index_of_[p]] == p
  int64_t optimizer_state_bytes_ = 0;                   // its slots' bytes, fixed once built
  // Sharded bf16: the parameters this member keeps as bf16 bits (their value is
  // DType::kBFloat16): the bf16_operand ones another member owns, in params_ order. The
  // weights' all-gather rounds their owners' float32 values into them.
  std::vector<Parameter*> packed_;
  std::unique_ptr<DeviceTimer> own_timer_;
  DeviceTimer* timer_ = nullptr;  // options_.device_timer or own_timer_; may be null
};

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_STAGE_EXECUTOR_H_
