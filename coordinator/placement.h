// Placement: turning a validated job spec and a list of workers into one plan per rank.
//
// Pure functions, no I/O. The pipeline is the spec's: BuildSchedule(kind from
// pipeline.schedule, S = pipeline.stages, V = pipeline.virtual_stages, M =
// pipeline.microbatches, num_blocks = ModelBlockCount) gives every rank's clock, already
// lowered and validated; stage s runs on rank s % S.
//
// Cost model: the model's blocks (DescribeBlocks, canonical order) are split into S*V
// contiguous chunks by PartitionBlocks, which minimises the largest chunk's estimated
// FORWARD FLOPs PER SAMPLE (each block counts its forward FLOPs + 1, so blocks without
// FLOPs still weigh something). Backward costs about twice the forward for every block,
// so balancing forward FLOPs balances the whole step. Parameter counts are not used: the
// GPT embedding has many parameters but almost no FLOPs.
//
// Rank r runs on workers[r]; every plan lists all ranks' addresses as peers.
#ifndef BATON_COORDINATOR_PLACEMENT_H_
#define BATON_COORDINATOR_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.pb.h"
#include "baton/v1/job.pb.h"
#include "baton/v1/training.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/core/tensor.h"
#include "common/plan/partition.h"
#include "common/schedule/schedule.h"

namespace baton {

// The schedule and block split of a job, independent of where it runs.
struct PipelineLayout {
  Schedule schedule;
  std::vector<BlockRange> stage_blocks;  // per global stage
  std::vector<BlockInfo> blocks;         // DescribeBlocks, canonical order
  // Blocks owned by each rank, ascending.
  std::vector<std::vector<int>> rank_blocks;
  int last_rank = 0;  // the rank running the last stage (it reports the loss)
};

// Builds and validates the layout for a spec that passed ValidateAndDefaultJobSpec.
// INVALID_ARGUMENT, its message starting with "pipeline: " and naming the offending
// field, when the spec's pipeline cannot be built (V != 1 outside interleaved-1f1b, M not
// a multiple of S for interleaved-1f1b, more chunks than blocks, ...).
absl::StatusOr<PipelineLayout> BuildPipelineLayout(const baton::v1::JobSpec& spec);

// A worker chosen for a rank.
struct PlacedWorker {
  std::string worker_id;
  std::string address;  // host:port of its WorkerService and TensorService
  // As it registered them; every plan lists them for every rank (links.h decides from
  // them which links can use NCCL).
  baton::v1::DeviceInfo device;
  std::vector<std::string> capabilities;
  // Its certificate's common name ("" without mutual TLS): peers check tensor streams
  // against it (Peer.identity).
  std::string identity;
  // Its session secret, sent on the coordinator's WorkerService calls (not in any plan).
  std::string session;
};

// The idle workers a job takes, and the device it computes on.
struct WorkerChoice {
  std::vector<size_t> indices;  // into the idle list, one per rank in rank order
  Device device = Device::kCpu;
  std::string why;  // e.g. "cuda: every worker has a GPU"
};

// Chooses pipeline.stages workers among idle[i] with !taken[i], by the spec's device:
//   DEVICE_KIND_CUDA (or auto with transport NCCL): workers with a GPU (device.kind
//   "cuda") only;
//   DEVICE_KIND_CPU: any, workers without a GPU first (GPUs stay free for GPU jobs);
//   auto: GPU workers if enough are idle (then cuda), else any, CPU-only first (then
//   cpu: a pipeline never mixes devices).
// Workers keep their order in `idle` within each preference. Only workers whose registered
// memory (device.memory_bytes: what their memory limits allow, or the GPU's) holds
// `rank_bytes` (RankNeedBytes; 0: no check) are candidates (an unknown 0 is taken as
// enough). With `rank_needs` (RankNeeds: one per pipeline rank) each rank gets a worker that
// holds its own share instead: the largest ranks first, each on the fastest idle worker
// left that holds it (device.peak_flops; then the least memory that holds it). Mixed
// workers thus carry the stages each can hold, the fastest adequate ones first; the
// device rule below still keeps one kind of device per pipeline. A rank no idle worker
// holds waits naming the rank, its stages and its bytes. When too few are idle, returns nullopt and says in *waiting why ("waiting for 2
// idle GPU workers (1 idle)", "... with at least 12.3 GiB ..."), and, when not even
// `largest_registered_bytes` (the most any registered worker has, idle or busy; 0: unknown)
// holds a rank, that no registered worker can.
// Whether a job must run on GPUs: device cuda, or device auto with transport nccl.
bool WantsCuda(const baton::v1::JobSpec& spec);
// Whether `worker` could run a rank of `spec` that needs `rank_bytes` (0: no check):
// ChooseWorkers' filter (memory registered, an unknown 0 taken as enough; a GPU when the
// job wants CUDA).
bool WorkerCanRunRank(const baton::v1::JobSpec& spec, int64_t rank_bytes,
                      const baton::v1::WorkerInfo& worker);

std::optional<WorkerChoice> ChooseWorkers(const baton::v1::JobSpec& spec,
                                          const std::vector<baton::v1::WorkerInfo>& idle,
                                          const std::vector<bool>& taken, std::string* waiting,
                                          int64_t rank_bytes = 0,
                                          int64_t largest_registered_bytes = 0,
                                          const std::vector<int64_t>& rank_needs = {});

// How long the job's workers wait for a tensor from a peer (JobPlan.recv_timeout: every
// receive, send delivery and data-parallel reduction) before they end the job: `floor`
// (the coordinator's --recv_timeout), raised to kReceiveHeadroom times the job's planned
// step where that is longer. The planned step is every FLOP of one replica's step
// (TrainingFlops over all blocks, a third more with recomputation) as if one device ran
// them all in turn, at the peak of the slowest of `workers` (DeviceInfo.peak_flops, or
// peak_flops_bf16 in a bf16 job), plus, with data_parallel > 1, the gradients sent out and
// back at kPlannedReplicaBytesPerSecond. A wait is never longer than a step (a peer's tensor
// is made within the step that needs it), so the headroom covers steps that run at a
// sixteenth of the devices' peak: a large model on a CPU, whose single actions can last
// minutes, is not ended by a deadline sized for small ones, and a small or GPU job keeps
// `floor`. A worker with an unknown peak (0) leaves `floor`. `blocks`: DescribeBlocks of the
// spec's model.
inline constexpr double kReceiveHeadroom = 16;
inline constexpr double kPlannedReplicaBytesPerSecond = 100e6;  // one 1 Gb/s link, roughly
absl::Duration PlannedReceiveTimeout(const baton::v1::JobSpec& spec,
                                     const std::vector<BlockInfo>& blocks,
                                     const std::vector<PlacedWorker>& workers,
                                     absl::Duration floor);

struct Placement {
  PipelineLayout layout;
  std::vector<baton::v1::JobPlan> plans;  // by rank
  // schedule, stages, virtual_stages, microbatches and stage_blocks ("first-last",
  // inclusive), as `batonctl train-local --pipeline --output json` reports them; and on the
  // CPU the workers' matrix kernel sets, each once, in rank order.
  baton::v1::PipelineReport report;
};

// One plan per rank for `spec` (validated, defaulted) with rank r on workers[r], every rank
// computing on `device` (the plans' spec says DEVICE_KIND_CPU or DEVICE_KIND_CUDA, never
// auto), waiting for its peers PlannedReceiveTimeout(spec, ..., recv_timeout) (the report
// says it too). INVALID_ARGUMENT when workers.size() != pipeline.stages, or as
// BuildPipelineLayout.
absl::StatusOr<Placement> PlaceJob(const baton::v1::JobSpec& spec, const std::string& job_id,
                                   uint64_t job_key, const std::vector<PlacedWorker>& workers,
                                   absl::Duration recv_timeout, Device device = Device::kCpu);

}  // namespace baton

#endif  // BATON_COORDINATOR_PLACEMENT_H_
