// The auto-planner: which schedule, how many chunks per rank (V), how many micro-batches (M)
// and which block boundaries make a step fastest for this model on S ranks, within a memory
// budget. `batonctl plan --auto` prints its ranking; `pipeline.schedule: SCHEDULE_AUTO` makes
// the coordinator (and `batonctl train-local`) run it before placing a job.
//
// Search: every schedule in the vocabulary (vocabulary.h) x V (1; 2..4 for interleaved-1f1b,
// within the blocks; 2 for the V schedules) x M (every divisor of batch/D the schedule can
// run) x partition (the block boundaries; see Split below). Each candidate's clock is built
// and validated, then simulated (validate.h) with costs from the model:
//
//   Time. A compute action costs a rate times the work it does, work = rows * the sum of
//   its chunk's forward FLOPs per sample (+1 per block, as the partitioner counts): F =
//   k(rows) r_F work, B = k(rows) r_B work, I and W alike (recomputation adds F to B and
//   I), where k(rows) says how much slower per FLOP a micro-batch of that many rows
//   computes (small matrices run below the machine's peak). A message costs a rate times
//   its floats; the optimizer step a rate times the rank's parameters. Without a measured
//   run: k = 1, r_F = r_I = r_W = 1, r_B = 2, communication and the step free, so times
//   are in FLOP units and only their ratios mean anything. Measured runs (MeasuredRun: a
//   job's trace, measured_run.h) calibrate it in ms: each run gives its forward rate (time
//   over work, all stages) at its rows; the largest rows are the reference (k = 1), the
//   others give k at theirs, log-linear between, constant beyond (one size measured: k = 1
//   everywhere). r_B, r_I, r_W keep each run's measured ratio to its forward rate,
//   averaged (without a split-backward run, r_I = r_W = r_B / 2). Splitting the same rows
//   into more chunks costs nothing extra here: an earlier model with a per-action overhead
//   fitted from two sizes priced that far above what it measured. A send or receive costs
//   the cheapest time per float any run measured for one, times its floats.
//
//   Memory, per rank, in bytes: 4 * parameters * (2 + optimizer floats per parameter)
//   (weights, gradients, optimizer state; with a sharded optimizer the state counts
//   ceil(parameters / D) parameters, an even share: the layout owns whole parameters, so a
//   replica may hold up to one parameter's state more than that, uncounted; in bf16 it
//   also keeps the Linear weights of the others' share, BlockInfo::operand_parameters
//   (D - 1) / D, as bf16, 2 bytes less each) + the simulated peak of
//   stashed activations (a (stage, micro-batch) holds rows * the chunk's ActivationBytes from its F
//   until its B or W ends: 4 per BlockInfo.activation_floats, 2 for those a bf16 job keeps as bf16;
//   with recomputation only its input, 4 bytes a float) + a workspace of one micro-batch's largest
//   block stash in float32 (the gradients a backward allocates; with recomputation also the chunk's
//   whole stash for the micro-batch it recomputes). The activation term is exact for the layers in
//   both precisions (model_test); planner_test checks whole-step peaks against the allocator
//   (within 5%; measured: 1-3% under). On a GPU with D > 1 also the NCCL engine's gather
//   buffer (PlannerInput::reduce_bucket_floats). Not modelled: the Gloo engine's buffers,
//   transport buffers, the CUDA context.
//
//   Split. Every candidate starts from the FLOP-balanced split (PartitionBlocks), the
//   fastest under this time model up to whole blocks. One that does not fit the budget is
//   searched further: blocks move one at a time from a chunk of the rank that needs the
//   most memory to the neighbouring chunk on another rank (under 1F1B the first ranks hold
//   the most micro-batches in flight, so they give blocks to the last), each time the move
//   that lowers the largest rank's need most, until it fits or no move helps. The candidate
//   keeps the moved split (split_moved) when it needs less memory; it is then timed on it,
//   so a split that fits but runs slower ranks accordingly. The job spec carries a moved
//   split as pipeline.partition.
//
// Contract: deterministic (the same input gives the same ranking; equal predicted steps go
// to the smaller peak memory, then schedule table order, then V, then M); well under a
// second for S = 16, 48 blocks, batch 512 (bench/plan_bench.cc, BM_AutoPlan, measures it;
// bench/planner_bench.cc measures how well it chooses).
#ifndef BATON_COMMON_PLAN_PLANNER_H_
#define BATON_COMMON_PLAN_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/nn/model.h"
#include "common/plan/partition.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"

namespace baton {

// What a finished (or running) job measured, for calibrating the cost model.
struct MeasuredRun {
  Costs costs;                           // per stage, ms (CostsFromTrace)
  std::vector<BlockRange> stage_blocks;  // that run's partition, one range per stage
  int64_t rows = 0;                      // samples per micro-batch in that run
  std::string source;                    // says where it came from, for reports
};

struct PlannerInput {
  std::vector<BlockInfo> blocks;    // DescribeBlocks
  std::vector<int64_t> input_floats;  // per block: floats per sample entering it
  int stages = 1;                   // S, fixed
  int data_parallel = 1;            // D, fixed
  int64_t batch_size = 1;           // per step, all replicas
  int optimizer_floats = 0;         // per parameter: SGD 0, momentum 1, AdamW 2
  // optimizer.shard: each of the D replicas of a rank keeps the optimizer state of its
  // share of the rank's parameters only.
  bool shard_optimizer = false;
  bool recompute = false;           // RECOMPUTE_FULL on every stage
  bool bf16 = false;  // PRECISION_BF16: activations kept as bf16 (ActivationBytes), and weights
                      // as bf16 bits where a sharded optimizer does not own them
  // The data-parallel engine's gather buffer on the device, when it has one (the NCCL
  // engine's ordered all-reduce and reduce-scatter on a GPU): D copies of the largest
  // bucket, `reduce_bucket_floats` or a rank's largest parameter when that is larger (a
  // bucket of its own). 0: none (one replica, fast mode unsharded, or the CPU, whose Gloo
  // buffers are not modelled).
  int64_t reduce_bucket_floats = 0;
  // Fixed choices; unset (0) lets the planner choose.
  std::optional<ScheduleKind> schedule;
  int virtual_stages = 0;
  int microbatches = 0;
  int64_t memory_budget_bytes = 0;  // per rank; 0: no budget
  // Runs that measured costs (any partition, schedule and M of this model): none for FLOP
  // costs, one for rates, two or more with different micro-batch sizes for the per-action
  // overhead too.
  std::vector<MeasuredRun> measured;
  int keep = 8;                     // candidates kept in full (the rest only counted)
};

struct PlanCandidate {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int virtual_stages = 1;
  int microbatches = 1;
  std::vector<BlockRange> stage_blocks;  // per global stage
  double step_time = 0;   // predicted makespan (ms when measured, else FLOP units)
  double bubble = 0;      // idle rank-time / (S * makespan)
  double busiest = 0;     // the busiest rank's compute and communication time
  std::vector<int64_t> peak_bytes;  // per rank
  int64_t max_peak_bytes = 0;
  bool fits = true;       // within the memory budget
  bool split_moved = false;  // stage_blocks is not the balanced split but the searched one
  std::string lost;       // why it is not the pick ("" for the pick)

  std::string Describe() const;  // "zb-h1 V=1 M=8" (+ " split 3+2+2+1" when moved)
};

struct Plan {
  // Every candidate that fits, fastest first (equal steps: least memory first), then those
  // over the budget, smallest first;
  // at most PlannerInput::keep of them. ranked[0] is the pick.
  std::vector<PlanCandidate> ranked;
  int considered = 0;           // candidates built and simulated
  int over_budget = 0;          // of them, how many did not fit
  bool measured = false;        // times in ms (else FLOP units)
  std::string cost_source;      // "model FLOPs" or the MeasuredRun sources
  // Measured: how much slower per FLOP a micro-batch of that many rows computes than the
  // largest calibrated one, (rows, factor), ascending rows; empty without measured runs.
  std::vector<std::pair<double, double>> efficiency;
  std::string calibration;      // measured: the fitted model, in words
};

// The planner's input for a validated, defaulted spec on `stages` ranks (its pipeline's
// schedule, V and M kept fixed unless the schedule is SCHEDULE_AUTO, where unset ones are
// free).
PlannerInput PlannerInputFor(const baton::v1::JobSpec& spec, int stages);

// Ranks every runnable candidate. INVALID_ARGUMENT when nothing can run (naming why: too few
// blocks, no M the fixed choices allow), or, with a budget, when no candidate fits: the
// message gives the budget and the smallest candidate's need. Measured costs whose stage
// count differs from their partition's are INVALID_ARGUMENT too.
absl::StatusOr<Plan> PlanPipeline(const PlannerInput& in);

// For a validated spec whose pipeline.schedule is SCHEDULE_AUTO: plans for its
// pipeline.stages ranks (per rank memory_budget_bytes, 0 for none; measured costs if
// given) and writes the pick into the spec (schedule, virtual_stages, microbatches, and
// partition when the split was moved), which stays valid. Returns the plan. A spec with a concrete schedule is left alone and the plan
// is empty (considered == 0). Errors as PlanPipeline.
absl::StatusOr<Plan> ResolveAutoPipeline(baton::v1::JobSpec* spec, int64_t memory_budget_bytes,
                                         std::vector<MeasuredRun> measured = {});

// "The pick: zb-h1 V=1 M=8, predicted 84.1 ms/step, bubble 0.06, peak 1.2 GiB/rank (costs:
// ...); 23 candidates; 1f1b M=8: bubble 0.18 vs 0.06; ..." — one line for job histories.
std::string SummarizePlan(const Plan& plan, int losers = 3);

// "2 rows x1.18, 8 rows x1.00" (Plan::efficiency, for reports).
std::string DescribeEfficiency(const std::vector<std::pair<double, double>>& efficiency);

// The memory the busiest rank of a validated spec needs, by the auto-planner's model
// (parameters, gradients, optimizer state and the activations its schedule keeps in flight;
// planner.h) for the spec's schedule, V and M. 0 when the planner cannot tell, and for
// SCHEDULE_AUTO, whose planner fits the job to the chosen workers' memory itself (moving
// blocks between stages when it must) at placement.
int64_t RankNeedBytes(const baton::v1::JobSpec& spec);
// The same for every pipeline rank, in rank order (stages beside the first and last hold
// fewer activations, embeddings and heads more parameters: ranks differ). Empty when the
// planner cannot tell, and for SCHEDULE_AUTO. RankNeedBytes is their largest.
std::vector<int64_t> RankNeeds(const baton::v1::JobSpec& spec);
// The largest of RankNeeds' shares; 0 for none.
int64_t BusiestRankBytes(const std::vector<int64_t>& needs);

// Bytes as "1.25 GiB" / "312 MiB" / "12 KiB".
std::string HumanBytes(double bytes);

}  // namespace baton

#endif  // BATON_COMMON_PLAN_PLANNER_H_
