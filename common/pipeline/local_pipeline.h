// A whole pipeline in one process: S stage executors on S threads, connected by the
// in-process transport; with pipeline.data_parallel D, D such pipelines whose stage r
// ranks form a data-parallel group (the in-process collective engine). This is `batonctl train-local --pipeline`, and the harness the
// bit-exactness tests drive; the cluster runs the same StageExecutor in worker processes.
#ifndef BATON_COMMON_PIPELINE_LOCAL_PIPELINE_H_
#define BATON_COMMON_PIPELINE_LOCAL_PIPELINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/comm/inproc_collective.h"
#include "common/core/digest.h"
#include "common/comm/inproc_transport.h"
#include "common/plan/partition.h"
#include "common/pipeline/stage_executor.h"
#include "common/schedule/schedule.h"
#include "gloo/rendezvous/store.h"
#include "common/train/reference_trainer.h"

namespace baton {

struct LocalPipelineOptions {
  absl::Duration recv_timeout = absl::Seconds(60);
  // The collective engine of the data-parallel groups (pipeline.data_parallel > 1): the
  // in-process one, Gloo over TCP on loopback (what CPU workers use between processes; in
  // fast mode when spec.pipeline.reduce_mode says so), or the members make_group makes
  // (e.g. the NCCL engine over the fake NCCL, in tests).
  enum class Engine { kInProcess, kGloo, kCustom };
  Engine engine = Engine::kInProcess;
  // Engine::kCustom: the `size` members of data-parallel group `group` (member d is replica
  // d's), all joined.
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Collective>>>(int group, int size)>
      make_group;
  // A custom clock (e.g. imported from CSV) instead of the spec's schedule. Its ranks,
  // micro-batches and stage count must fit the spec.
  std::optional<Schedule> schedule;
};

struct PipelineStepStats : StepStats {
  // Per rank, replica-major (rank r of replica d at d * S + r).
  std::vector<int> peak_inflight;
  std::vector<RankStepResult> ranks;  // timeline, losses
};

class LocalPipelineTrainer {
 public:
  // Validates `spec` (filling defaults), builds and validates the schedule named by
  // spec.pipeline (or options.schedule), partitions the blocks over its stages, and builds
  // one executor per rank, all on the spec's device (LocalDeviceFor).
  static absl::StatusOr<std::unique_ptr<LocalPipelineTrainer>> Create(
      baton::v1::JobSpec spec, LocalPipelineOptions options = {});

  // Runs one step on all ranks at once. On error every rank has stopped, and the error of
  // the rank that failed first (not the ABORTED echoes) is returned.
  absl::StatusOr<PipelineStepStats> Step();

  // The validation loss of the weights as they are (eval.only, or between steps): every rank
  // runs spec.eval.batches batches forward (StageExecutor::Evaluate), as a job evaluates;
  // the loss is the last stage's. Changes no weight. Errors as Step's.
  absl::StatusOr<float> Evaluate();

  const baton::v1::JobSpec& spec() const { return spec_; }
  const Schedule& schedule() const { return schedule_; }
  const std::vector<BlockRange>& stage_blocks() const { return stage_blocks_; }
  int64_t steps_done() const { return steps_done_; }
  Device device() const { return device_; }  // where every rank computes
  // pipeline.data_parallel: replicas of the pipeline, each with its own hub.
  int replicas() const { return static_cast<int>(hubs_.size()); }
  InProcessHub& hub(int replica = 0) { return *hubs_[replica]; }
  // Rank r of replica d is executor(d * S + r).
  const StageExecutor& executor(int index) const { return *executors_[index]; }
  StageExecutor& executor(int index) { return *executors_[index]; }

  // Every rank writes its blocks into checkpoint step steps_done() under `job_dir`, as
  // job `job` (common/checkpoint/checkpoint.h).
  absl::Status SaveCheckpoint(const std::string& job_dir, const std::string& job);
  // Every rank loads its blocks from a complete checkpoint's step directory, written by any
  // partition; steps_done() becomes its step. On an error the trainer is unusable.
  absl::Status LoadCheckpoint(const std::string& step_dir);

  // Block digests in canonical block order, gathered from replica `replica`'s ranks (every
  // replica holds the same weights; the tests check it). With a sharded optimizer in bf16
  // the replica group takes part (StageExecutor::BlockDigests), and fails with it.
  absl::StatusOr<std::vector<Digest>> TryBlockDigests(int replica = 0);
  // The same, for callers whose pipeline has not failed (the in-process group then cannot):
  // a failure is fatal.
  std::vector<Digest> BlockDigests(int replica = 0);
  Digest WeightsDigest(int replica = 0) { return CombineBlockDigests(BlockDigests(replica)); }

 private:
  LocalPipelineTrainer() = default;

  baton::v1::JobSpec spec_;
  Schedule schedule_;
  std::vector<BlockRange> stage_blocks_;
  Device device_ = Device::kCpu;
  std::vector<std::unique_ptr<InProcessHub>> hubs_;        // by replica
  std::vector<std::unique_ptr<InProcessGroup>> groups_;    // by rank, when replicas > 1
  std::vector<std::unique_ptr<gloo::rendezvous::Store>> stores_;  // by rank, engine kGloo
  std::vector<std::unique_ptr<Collective>> members_;       // the executors' group handles
  // Replica-major: executors_[d * S + r] is rank r of replica d. Declared after what it
  // points into, so it is destroyed first.
  std::vector<std::unique_ptr<StageExecutor>> executors_;
  int64_t steps_done_ = 0;
  bool failed_ = false;
};

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_LOCAL_PIPELINE_H_
