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
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/job.pb.h"
#include "baton/v1/training.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/pipeline/partition.h"
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
};

struct Placement {
  PipelineLayout layout;
  std::vector<baton::v1::JobPlan> plans;  // by rank
  // schedule, stages, virtual_stages, microbatches and stage_blocks ("first-last",
  // inclusive), as `batonctl train-local --pipeline --output json` reports them.
  baton::v1::PipelineReport report;
};

// One plan per rank for `spec` (validated, defaulted) with rank r on workers[r].
// INVALID_ARGUMENT when workers.size() != pipeline.stages, or as BuildPipelineLayout.
absl::StatusOr<Placement> PlaceJob(const baton::v1::JobSpec& spec, const std::string& job_id,
                                   uint64_t job_key, const std::vector<PlacedWorker>& workers,
                                   absl::Duration recv_timeout);

}  // namespace baton

#endif  // BATON_COORDINATOR_PLACEMENT_H_
