#include "common/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/status.h"
#include "common/schedule/generators.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"

namespace baton {
namespace {

// The cost model (planner.h, "Time"): a compute action costs Factor(rows) * rate * work, a
// message rate * floats, the optimizer step rate * the rank's parameters.
struct Rates {
  double f = 1, b = 2, i = 1, w = 1;   // per FLOP-sample, at the reference micro-batch size
  // How much slower per FLOP-sample a micro-batch of `rows` samples computes than the
  // reference one: (rows, factor) points, ascending rows, the reference's factor 1;
  // log-linear between them, constant beyond. Empty: 1 everywhere.
  std::vector<std::pair<double, double>> efficiency;
  double send = 0, recv = 0;           // per float-sample of a message
  double step = 0;                     // per parameter on the rank

  double Factor(double rows) const {
    if (efficiency.empty()) return 1;
    if (rows <= efficiency.front().first) return efficiency.front().second;
    if (rows >= efficiency.back().first) return efficiency.back().second;
    for (size_t k = 1; k < efficiency.size(); ++k) {
      const auto& [x1, y1] = efficiency[k];
      if (rows > x1) continue;
      const auto& [x0, y0] = efficiency[k - 1];
      const double t = std::log(rows / x0) / std::log(x1 / x0);
      return y0 + t * (y1 - y0);
    }
    return efficiency.back().second;
  }
};

// FLOPs per sample of blocks [r.first, r.last), each block +1 as the partitioner counts.
double RangeFlops(const std::vector<BlockInfo>& blocks, const BlockRange& r) {
  double sum = 0;
  for (int b = r.first; b < r.last; ++b) sum += static_cast<double>(blocks[b].forward_flops) + 1;
  return sum;
}

double RangeParams(const std::vector<BlockInfo>& blocks, const BlockRange& r) {
  double sum = 0;
  for (int b = r.first; b < r.last; ++b) sum += static_cast<double>(blocks[b].parameters);
  return sum;
}

// The floats per sample of the messages a stage sends and receives: the activation entering
// it (from the previous stage) and the one leaving it (to the next), averaged over those it
// has; 0 for a lone stage.
double MessageFloats(const PlannerInput& in, const std::vector<BlockRange>& stages, int s) {
  double sum = 0;
  int n = 0;
  if (s > 0) {
    sum += static_cast<double>(in.input_floats[stages[s].first]);
    ++n;
  }
  if (s + 1 < static_cast<int>(stages.size())) {
    sum += static_cast<double>(in.input_floats[stages[s].last]);
    ++n;
  }
  return n == 0 ? 0 : sum / n;
}

// Per measured run: its compute rates (time over work, all stages) at its micro-batch size,
// and its message times per float (planner.h, "Time").
absl::StatusOr<Rates> Calibrate(const PlannerInput& in, const std::vector<MeasuredRun>& runs) {
  // Per run: its rows and its rates (time / work) per kind; I and W only from split runs.
  struct RunRates {
    double rows, f, b, i, w;
    bool split;
  };
  std::vector<RunRates> per_run;
  std::vector<std::pair<double, double>> send, recv;
  double step = 0, step_params = 0;
  for (const MeasuredRun& m : runs) {
    const int stages = static_cast<int>(m.stage_blocks.size());
    if (static_cast<int>(m.costs.per_stage.size()) != stages || stages == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "measured costs (", m.source, ") give ", m.costs.per_stage.size(),
          " stages but the run's partition has ", stages));
    }
    if (m.rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("measured run (", m.source, "): rows per micro-batch unknown"));
    }
    double work = 0, tf = 0, tb = 0, ti = 0, tw = 0, ts = 0, tr = 0, floats = 0, params = 0;
    int messaging = 0;
    bool split = false;
    for (int s = 0; s < stages; ++s) {
      const BlockRange& r = m.stage_blocks[s];
      if (r.first < 0 || r.last > static_cast<int>(in.blocks.size()) || r.size() < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "measured run (", m.source, "): stage ", s, " holds blocks ", r.first, "-",
            r.last - 1, ", not within this model's ", in.blocks.size()));
      }
      const Costs& c = m.costs.per_stage[s];
      work += RangeFlops(in.blocks, r) * static_cast<double>(m.rows);
      tf += c.f;
      tb += c.backward();
      // CostsFromTrace gives a run without split backward I = W = B / 2 and b >= 0.
      split = split || c.b < 0;
      ti += c.i;
      tw += c.w;
      const double mf = MessageFloats(in, m.stage_blocks, s) * static_cast<double>(m.rows);
      if (mf > 0) {
        ts += c.send;
        tr += c.recv;
        floats += mf;
        ++messaging;
      }
      params += RangeParams(in.blocks, r);
    }
    if (work > 0) {
      per_run.push_back(RunRates{static_cast<double>(m.rows), tf / work, tb / work, ti / work,
                                 tw / work, split});
    }
    if (messaging > 0) {
      send.push_back({floats / messaging, ts / messaging});
      recv.push_back({floats / messaging, tr / messaging});
    }
    // The step runs on every rank at once; the slowest holds about params / stages.
    step += m.costs.step;
    step_params += params / stages;
  }
  Rates out;
  if (!per_run.empty()) {
    // The forward's rate per micro-batch size (runs of one size averaged); the largest size
    // is the reference. The other kinds keep their measured ratio to the forward's rate at
    // their run's size, averaged over the runs that have them.
    std::map<double, std::pair<double, int>> by_rows;
    for (const RunRates& r : per_run) {
      by_rows[r.rows].first += r.f;
      ++by_rows[r.rows].second;
    }
    const double ref = by_rows.rbegin()->second.first / by_rows.rbegin()->second.second;
    for (const auto& [rows, sum] : by_rows) {
      out.efficiency.push_back({rows, ref > 0 ? sum.first / sum.second / ref : 1});
    }
    out.f = ref;
    double b = 0, i = 0, w = 0;
    int nb = 0, nsplit = 0;
    for (const RunRates& r : per_run) {
      if (r.f <= 0) continue;
      b += r.b / r.f;
      ++nb;
      if (r.split) {
        i += r.i / r.f;
        w += r.w / r.f;
        ++nsplit;
      }
    }
    out.b = nb > 0 ? ref * b / nb : 2 * ref;
    if (nsplit > 0) {
      out.i = ref * i / nsplit;
      out.w = ref * w / nsplit;
    } else {
      out.i = out.w = out.b / 2;  // a split backward: the same work in two actions
    }
  }
  // Messages: the cheapest per float any run saw. A receive's measured cost is already the
  // shortest on its stage (the nearest to a transfer without waiting), and what is left of
  // waiting in it is noise a line fit would turn into a rate; the simulator adds the waits.
  auto cheapest = [](const std::vector<std::pair<double, double>>& pts) {
    double r = pts.empty() ? 0 : std::numeric_limits<double>::infinity();
    for (const auto& [x, y] : pts) r = std::min(r, x > 0 ? y / x : 0.0);
    return r;
  };
  out.send = cheapest(send);
  out.recv = cheapest(recv);
  if (step_params > 0) out.step = step / step_params;
  return out;
}

struct Evaluated {
  PlanCandidate c;
  int order = 0;  // the schedule's place in the table, for ties
};

// What each chunk of a split costs in memory, bytes for `rows` samples per micro-batch.
struct ChunkBytes {
  std::vector<double> held;       // per (chunk, micro-batch) from F until its B or W
  std::vector<double> workspace;  // while the chunk runs a backward
  std::vector<double> params;     // parameters (a count, not bytes)
  std::vector<double> operands;   // of those, BlockInfo::operand_parameters
  std::vector<double> largest;    // BlockInfo::largest_parameter, the chunk's largest
};

ChunkBytes ChunkBytesFor(const PlannerInput& in, const std::vector<BlockRange>& part,
                         double rows) {
  ChunkBytes out;
  for (const BlockRange& r : part) {
    double bytes = 0, biggest = 0, operands = 0, largest = 0;
    for (int b = r.first; b < r.last; ++b) {
      const BlockInfo& block = in.blocks[b];
      bytes += static_cast<double>(ActivationBytes(block, in.bf16));
      biggest = std::max(biggest, static_cast<double>(block.activation_floats));
      operands += static_cast<double>(block.operand_parameters);
      largest = std::max(largest, static_cast<double>(block.largest_parameter));
    }
    const double stash = rows * bytes;
    // With recomputation a chunk keeps only its input, and rebuilds its whole stash for the
    // micro-batch whose backward runs.
    out.held.push_back(in.recompute && r.size() > 0
                           ? 4 * rows * static_cast<double>(in.input_floats[r.first])
                           : stash);
    out.workspace.push_back(4 * rows * biggest + (in.recompute ? stash : 0));
    out.params.push_back(RangeParams(in.blocks, r));
    out.operands.push_back(operands);
    out.largest.push_back(largest);
  }
  return out;
}

// How many micro-batches each of a rank's chunks holds, at every point of its clock where
// that could peak (after a forward), distinct combinations only. It depends on the clock's
// order alone (a rank's count changes only at its own actions), not on costs or split, so
// the split search re-weighs it instead of re-simulating.
struct HeldProfile {
  std::vector<std::vector<int>> stages;                  // per rank: its stages
  std::vector<std::vector<std::vector<int>>> combos;     // per rank: counts per its stage
};

HeldProfile HeldProfileOf(const Schedule& sched) {
  const int S = sched.num_ranks;
  HeldProfile out;
  out.stages.resize(S);
  out.combos.resize(S);
  for (int s = 0; s < sched.num_stages(); ++s) out.stages[sched.stage_to_rank[s]].push_back(s);
  for (int r = 0; r < S; ++r) {
    const std::vector<int>& mine = out.stages[r];
    std::vector<int> count(mine.size(), 0);
    std::set<std::vector<int>> seen;
    for (const Action& a : sched.ranks[r]) {
      const auto it = std::find(mine.begin(), mine.end(), a.stage);
      if (it == mine.end()) continue;
      const size_t k = static_cast<size_t>(it - mine.begin());
      if (a.kind == ActionKind::kForward) {
        ++count[k];
        seen.insert(count);
      } else if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) {
        --count[k];
      }
    }
    out.combos[r].assign(seen.begin(), seen.end());
  }
  return out;
}

// The memory model (planner.h, "Memory"): bytes rank `rank` needs on the split `cb`
// describes (a chunk still empty counts nothing).
double RankBytes(const PlannerInput& in, const HeldProfile& prof, const ChunkBytes& cb,
                 int rank) {
  double params = 0, operands = 0, workspace = 0, peak = 0, largest = 0;
  const std::vector<int>& mine = prof.stages[rank];
  for (int s : mine) {
    params += cb.params[s];
    operands += cb.operands[s];
    workspace = std::max(workspace, cb.workspace[s]);
    largest = std::max(largest, cb.largest[s]);
  }
  for (const std::vector<int>& combo : prof.combos[rank]) {
    double held = 0;
    for (size_t k = 0; k < combo.size(); ++k) held += combo[k] * cb.held[mine[k]];
    peak = std::max(peak, held);
  }
  // Sharded, a replica keeps optimizer state for its share of the parameters only.
  const int D = std::max(1, in.data_parallel);
  const double state_params = in.shard_optimizer ? std::ceil(params / D) : params;
  // In bf16 it keeps the Linear weights it does not own, (D - 1) / D of them, as bf16.
  const double bits = in.shard_optimizer && in.bf16 ? operands * (D - 1) / D : 0;
  // The engine's gather buffer: D copies of the largest bucket (none on a rank without
  // parameters: it reduces nothing).
  const double gather =
      in.reduce_bucket_floats > 0 && D > 1 && params > 0
          ? 4.0 * D * std::max(static_cast<double>(in.reduce_bucket_floats), largest)
          : 0;
  return 4.0 * params * 2 - 2.0 * bits + 4.0 * state_params * in.optimizer_floats + peak +
         workspace + gather;
}

// A split whose chunks each do at most `max_work` (RangeFlops) and whose ranks each need at
// most `budget` bytes, filling the chunks in stage order, each with as many blocks as both
// bounds allow (leaving one block for every later chunk); nullopt when the blocks run out
// of room. A rank's need only grows with its chunks' blocks, so for one chunk per rank this
// finds such a split whenever one exists; with several chunks per rank an early chunk can
// take room a later one of its rank needed (a heuristic there).
std::optional<std::vector<BlockRange>> FillSplit(const PlannerInput& in, const Schedule& sched,
                                                 const HeldProfile& prof, double rows,
                                                 double max_work, double budget) {
  const int n = static_cast<int>(in.blocks.size());
  const int chunks = sched.num_stages();
  std::vector<BlockRange> part(chunks);
  int next = 0;
  for (int c = 0; c < chunks; ++c) {
    part[c] = BlockRange{next, next};
    const int rank = sched.stage_to_rank[c];
    while (next < n && n - next > chunks - c - 1) {
      const BlockRange before = part[c];
      part[c].last = next + 1;
      const bool ok = RangeFlops(in.blocks, part[c]) <= max_work &&
                      RankBytes(in, prof, ChunkBytesFor(in, part, rows), rank) <= budget;
      if (!ok) {
        part[c] = before;
        break;
      }
      ++next;
    }
    if (part[c].size() == 0) return std::nullopt;
  }
  if (next < n) return std::nullopt;
  return part;
}

// The split search (planner.h, "Split"): the split with the least work on its busiest
// chunk among those FillSplit finds within `budget` (a bisection on that bound); nullopt
// when none fits.
std::optional<std::vector<BlockRange>> SplitForMemory(const PlannerInput& in,
                                                      const Schedule& sched,
                                                      const HeldProfile& prof, double rows,
                                                      double budget) {
  const BlockRange all{0, static_cast<int>(in.blocks.size())};
  double hi = RangeFlops(in.blocks, all);
  std::optional<std::vector<BlockRange>> best = FillSplit(in, sched, prof, rows, hi, budget);
  if (!best.has_value()) return std::nullopt;
  double lo = 0;  // infeasible (every chunk does some work)
  // Works are sums of whole numbers: bisect to a gap of 1/2.
  while (hi - lo > 0.5) {
    const double mid = std::floor((lo + hi) / 2);
    if (mid <= lo) break;
    std::optional<std::vector<BlockRange>> p = FillSplit(in, sched, prof, rows, mid, budget);
    if (p.has_value()) {
      hi = mid;
      best = std::move(p);
    } else {
      lo = mid;
    }
  }
  return best;
}

// The clock of one candidate; nullopt when the schedule refuses the combination
// (BuildSchedule checks the options).
std::optional<Schedule> CandidateClock(const PlannerInput& in, const ScheduleEntry& e, int V,
                                       int M) {
  ScheduleOptions o;
  o.kind = e.kind;
  o.num_ranks = in.stages;
  o.virtual_stages = V;
  o.num_microbatches = M;
  o.num_blocks = static_cast<int64_t>(in.blocks.size());
  absl::StatusOr<Schedule> sched = BuildSchedule(o);
  if (!sched.ok()) return std::nullopt;
  return *std::move(sched);
}

// Simulates one candidate, clock `sched`, on `part` (the split of its S*V chunks).
std::optional<Evaluated> Evaluate(const PlannerInput& in, const Rates& rates,
                                  const ScheduleEntry& e, int order, const Schedule& sched,
                                  const HeldProfile& prof, const std::vector<BlockRange>& part) {
  const int S = in.stages;
  const int chunks = sched.num_stages();
  const int M = sched.num_microbatches;
  const double rows = static_cast<double>(in.batch_size) / (static_cast<double>(in.data_parallel) * M);

  Costs costs;
  costs.per_stage.resize(chunks);
  const double k = rates.Factor(rows);
  for (int s = 0; s < chunks; ++s) {
    const BlockRange& r = part[s];
    const double work = RangeFlops(in.blocks, r) * rows;
    Costs& c = costs.per_stage[s];
    c.f = k * rates.f * work;
    const double again = in.recompute ? c.f : 0;  // the forward rerun before the backward
    c.i = k * rates.i * work + again;
    c.w = k * rates.w * work;
    c.b = k * rates.b * work + again;
    const double msg = MessageFloats(in, part, s) * rows;
    c.send = rates.send * msg;
    c.recv = rates.recv * msg;
  }
  const ChunkBytes cb = ChunkBytesFor(in, part, rows);
  std::vector<double> rank_params(S, 0);
  for (int s = 0; s < chunks; ++s) rank_params[sched.stage_to_rank[s]] += cb.params[s];
  costs.step = rates.step * *std::max_element(rank_params.begin(), rank_params.end());
  absl::StatusOr<SimResult> sim = Simulate(sched, costs);
  if (!sim.ok()) return std::nullopt;  // cannot happen: BuildSchedule validated it

  Evaluated out;
  out.order = order;
  PlanCandidate& c = out.c;
  c.kind = e.kind;
  c.virtual_stages = sched.virtual_stages;
  c.microbatches = M;
  c.stage_blocks = part;
  c.step_time = sim->makespan;
  c.bubble = sim->bubble_ratio;
  c.busiest = *std::max_element(sim->busy.begin(), sim->busy.end());
  for (int r = 0; r < S; ++r) {
    c.peak_bytes.push_back(static_cast<int64_t>(RankBytes(in, prof, cb, r)));
  }
  c.max_peak_bytes = *std::max_element(c.peak_bytes.begin(), c.peak_bytes.end());
  c.fits = in.memory_budget_bytes <= 0 || c.max_peak_bytes <= in.memory_budget_bytes;
  return out;
}

std::string Time(double t, bool measured) {
  return measured ? absl::StrFormat("%.1f ms", t) : absl::StrFormat("%.4g", t);
}

}  // namespace

std::string DescribeEfficiency(const std::vector<std::pair<double, double>>& efficiency) {
  if (efficiency.empty()) return "every micro-batch size";
  std::vector<std::string> parts;
  for (const auto& [rows, factor] : efficiency) {
    parts.push_back(absl::StrFormat("%g rows x%.2f", rows, factor));
  }
  return absl::StrCat(parts.size() == 1 ? "" : "per micro-batch size ",
                      absl::StrJoin(parts, ", "));
}

std::string HumanBytes(double bytes) {
  if (bytes >= double{1 << 30}) return absl::StrFormat("%.2f GiB", bytes / double{1 << 30});
  if (bytes >= double{1 << 20}) return absl::StrFormat("%.1f MiB", bytes / double{1 << 20});
  return absl::StrFormat("%.0f KiB", bytes / 1024);
}

std::string PlanCandidate::Describe() const {
  std::string out =
      absl::StrCat(ScheduleKindName(kind), " V=", virtual_stages, " M=", microbatches);
  if (split_moved) absl::StrAppend(&out, " split ", absl::StrJoin(PartitionSizes(stage_blocks), "+"));
  return out;
}

PlannerInput PlannerInputFor(const baton::v1::JobSpec& spec, int stages) {
  PlannerInput in;
  // The attention kernels the spec names; unspecified (a worker's BATON_FUSED_ATTENTION
  // decides) counts the materialised probabilities, the most any of them keeps.
  BlockCostOptions costs;
  costs.bf16 = spec.precision() == baton::v1::PRECISION_BF16;
  if (spec.attention() != baton::v1::ATTENTION_KERNEL_UNSPECIFIED) {
    costs.attention = AttentionKernelOf(spec);
  }
  in.blocks = DescribeBlocks(spec.model(), costs);
  for (int b = 0; b < static_cast<int>(in.blocks.size()); ++b) {
    if (b > 0) {
      in.input_floats.push_back(NumElements(BlockInputShape(spec.model(), b, 1)));
    } else {
      const std::optional<TokenModel> t = TokenModelOf(spec.model());
      in.input_floats.push_back(t ? t->context : spec.model().mlp().input_dim());
    }
  }
  // Past the last block: the loss, nothing to send.
  in.input_floats.push_back(0);
  const baton::v1::PipelineSpec& p = spec.pipeline();
  in.stages = stages;
  in.data_parallel = std::max(1, p.data_parallel());
  in.batch_size = spec.data().batch_size();
  const auto& opt = spec.optimizer();
  in.optimizer_floats = opt.has_adamw() ? 2 : (opt.has_sgd() && opt.sgd().momentum() != 0 ? 1 : 0);
  in.shard_optimizer = opt.shard() && in.data_parallel > 1;
  in.recompute = p.recompute() == baton::v1::RECOMPUTE_FULL;
  in.bf16 = spec.precision() == baton::v1::PRECISION_BF16;
  // On a GPU the NCCL engine gathers the members' copies of a bucket into one buffer
  // (ordered all-reduce, and reduce-scatter in either mode); fast mode's all-reduce sums in
  // place.
  if (in.data_parallel > 1 && spec.device() == baton::v1::DEVICE_KIND_CUDA &&
      (p.reduce_mode() != baton::v1::REDUCE_MODE_FAST || in.shard_optimizer)) {
    in.reduce_bucket_floats = std::max<int64_t>(1, p.reduce_bucket_bytes() / 4);
  }
  if (p.schedule() != baton::v1::SCHEDULE_AUTO) {
    absl::StatusOr<const ScheduleEntry*> e =
        ScheduleEntryForSpecValue(static_cast<int>(p.schedule()));
    if (e.ok()) in.schedule = (*e)->kind;
  }
  in.virtual_stages = p.virtual_stages();
  in.microbatches = p.microbatches();
  return in;
}

absl::StatusOr<Plan> PlanPipeline(const PlannerInput& in) {
  const int n = static_cast<int>(in.blocks.size());
  if (n == 0) return absl::InvalidArgumentError("the model has no blocks");
  if (static_cast<int>(in.input_floats.size()) < n) {
    return absl::InvalidArgumentError("PlannerInput: input_floats must have one entry per block");
  }
  if (in.stages < 1 || in.stages > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.stages: ", in.stages, " stages for a model of ", n,
        " blocks; every stage needs at least one block"));
  }
  if (in.data_parallel < 1 || in.batch_size < in.data_parallel ||
      in.batch_size % in.data_parallel != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.batch_size: ", in.batch_size, " does not split into ",
                     in.data_parallel, " data-parallel replicas"));
  }
  Rates rates;
  Plan plan;
  if (!in.measured.empty()) {
    BATON_ASSIGN_OR_RETURN(rates, Calibrate(in, in.measured));
    plan.measured = true;
    std::vector<std::string> sources;
    for (const MeasuredRun& m : in.measured) sources.push_back(m.source);
    plan.cost_source = absl::StrJoin(sources, " + ");
    plan.efficiency = rates.efficiency;
    plan.calibration = absl::StrFormat(
        "per GFLOP-sample F %.3g, B %.3g, I %.3g, W %.3g ms at %s; messages send %.3g, "
        "receive %.3g ms per MB; step %.3g ms per M parameters",
        rates.f * 1e9, rates.b * 1e9, rates.i * 1e9, rates.w * 1e9,
        DescribeEfficiency(plan.efficiency), rates.send * 1e6 / 4, rates.recv * 1e6 / 4,
        rates.step * 1e6);
  } else {
    plan.cost_source = "model FLOPs (no measured run: times in FLOP units)";
  }

  const int64_t per_replica = in.batch_size / in.data_parallel;
  std::vector<int> ms;
  for (int64_t m = 1; m <= per_replica && m <= (int64_t{1} << 20); ++m) {
    if (per_replica % m != 0) continue;
    if (in.microbatches > 0 && m != in.microbatches) continue;
    // The spec's bound on a clock's size.
    if (4.0 * in.stages * in.stages * 4.0 * static_cast<double>(m) > kMaxScheduleActions) break;
    ms.push_back(static_cast<int>(m));
  }
  if (ms.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.microbatches: ", in.microbatches, " does not divide the ", per_replica,
        " samples each replica trains per step"));
  }

  std::vector<Evaluated> all;
  std::map<int, std::vector<BlockRange>> splits;  // by chunk count
  const std::vector<ScheduleEntry>& table = ScheduleTable();
  for (int order = 0; order < static_cast<int>(table.size()); ++order) {
    const ScheduleEntry& e = table[order];
    if (e.generate == nullptr) continue;  // custom
    if (in.schedule.has_value() && *in.schedule != e.kind) continue;
    // A fixed V holds for every schedule (a V schedule reads 1 as its 2).
    std::vector<int> vs;
    switch (e.placement) {
      case ChunkPlacement::kOne: vs = {1}; break;
      case ChunkPlacement::kV: vs = {2}; break;
      case ChunkPlacement::kLooped:
        if (in.virtual_stages > 1) {
          vs = {in.virtual_stages};
        } else {
          for (int v = 2; v <= 4 && in.stages * v <= n; ++v) vs.push_back(v);
        }
        break;
    }
    const int fixed_v = in.virtual_stages == 1 && e.placement == ChunkPlacement::kV
                            ? 2
                            : in.virtual_stages;
    for (int v : vs) {
      if (fixed_v > 0 && v != fixed_v) continue;
      if (in.stages * v > n) continue;
      // The split depends on the chunk count only: one per V, for every M.
      auto split = splits.find(in.stages * v);
      if (split == splits.end()) {
        absl::StatusOr<std::vector<BlockRange>> part = PartitionBlocks(in.blocks, in.stages * v);
        if (!part.ok()) continue;
        split = splits.emplace(in.stages * v, *std::move(part)).first;
      }
      for (int m : ms) {
        const std::optional<Schedule> sched = CandidateClock(in, e, v, m);
        if (!sched.has_value()) continue;
        const HeldProfile prof = HeldProfileOf(*sched);
        std::optional<Evaluated> ev = Evaluate(in, rates, e, order, *sched, prof, split->second);
        if (!ev.has_value()) continue;
        if (!ev->c.fits) {
          // Over the budget on the balanced split: the least-imbalanced split that fits.
          const double rows = static_cast<double>(per_replica) / m;
          const std::optional<std::vector<BlockRange>> moved = SplitForMemory(
              in, *sched, prof, rows, static_cast<double>(in.memory_budget_bytes));
          if (moved.has_value() && PartitionSizes(*moved) != PartitionSizes(split->second)) {
            std::optional<Evaluated> other = Evaluate(in, rates, e, order, *sched, prof, *moved);
            if (other.has_value() && other->c.max_peak_bytes < ev->c.max_peak_bytes) {
              other->c.split_moved = true;
              ev = std::move(other);
            }
          }
        }
        all.push_back(*std::move(ev));
      }
    }
  }
  plan.considered = static_cast<int>(all.size());
  if (all.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: no schedule runs ", in.stages, " stages",
        in.microbatches > 0 ? absl::StrCat(" with ", in.microbatches, " micro-batches") : "",
        " on a model of ", n, " blocks",
        in.schedule.has_value() ? absl::StrCat(" as ", ScheduleKindName(*in.schedule)) : ""));
  }
  // Fitting candidates by predicted step, those equal to 9 digits by memory (the same speed
  // for less memory); the rest by memory. Then table order, V, M.
  double fastest = 0;
  for (const Evaluated& e : all) {
    if (e.c.step_time > 0) fastest = fastest == 0 ? e.c.step_time : std::min(fastest, e.c.step_time);
  }
  auto key = [&](const Evaluated& e) {
    const double step = fastest > 0 ? std::round(e.c.step_time / fastest * 1e9) : 0;
    return std::make_tuple(!e.c.fits, e.c.fits ? step : 0.0, e.c.max_peak_bytes, e.order,
                           e.c.virtual_stages, e.c.microbatches);
  };
  std::stable_sort(all.begin(), all.end(),
                   [&](const Evaluated& a, const Evaluated& b) { return key(a) < key(b); });
  for (const Evaluated& e : all) plan.over_budget += e.c.fits ? 0 : 1;
  if (!all[0].c.fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory budget: no candidate fits ", HumanBytes(in.memory_budget_bytes),
        " per rank; the smallest, ", all[0].c.Describe(), ", needs ",
        HumanBytes(all[0].c.max_peak_bytes), " (", plan.considered, " candidates considered)"));
  }
  const PlanCandidate& pick = all[0].c;
  for (size_t k = 0; k < all.size() && static_cast<int>(plan.ranked.size()) < in.keep; ++k) {
    PlanCandidate c = all[k].c;
    if (k > 0) {
      if (!c.fits) {
        c.lost = absl::StrCat("memory: needs ", HumanBytes(c.max_peak_bytes), ", over ",
                              HumanBytes(in.memory_budget_bytes));
      } else if (std::abs(c.step_time - pick.step_time) <= 1e-9 * pick.step_time) {
        c.lost = absl::StrCat("tie: the same predicted step, more memory (",
                              HumanBytes(c.max_peak_bytes), " vs ",
                              HumanBytes(pick.max_peak_bytes), ")");
      } else if (c.busiest - pick.busiest >= 0.5 * (c.step_time - pick.step_time) &&
                 c.busiest > pick.busiest) {
        c.lost = absl::StrCat("work: busiest rank ", Time(c.busiest, plan.measured), " vs ",
                              Time(pick.busiest, plan.measured));
      } else {
        c.lost = absl::StrFormat("bubble: %.3f vs %.3f", c.bubble, pick.bubble);
      }
    }
    plan.ranked.push_back(std::move(c));
  }
  return plan;
}

absl::StatusOr<Plan> ResolveAutoPipeline(baton::v1::JobSpec* spec, int64_t memory_budget_bytes,
                                         std::vector<MeasuredRun> measured) {
  baton::v1::PipelineSpec* p = spec->mutable_pipeline();
  if (p->schedule() != baton::v1::SCHEDULE_AUTO) return Plan{};
  PlannerInput in = PlannerInputFor(*spec, std::max(1, p->stages()));
  in.memory_budget_bytes = memory_budget_bytes;
  in.measured = std::move(measured);
  BATON_ASSIGN_OR_RETURN(Plan plan, PlanPipeline(in));
  const PlanCandidate& pick = plan.ranked.front();
  p->set_schedule(static_cast<baton::v1::Schedule>(ScheduleEntryOf(pick.kind).spec_value));
  p->set_virtual_stages(pick.virtual_stages);
  p->set_microbatches(pick.microbatches);
  p->clear_partition();
  if (pick.split_moved) {
    for (int n : PartitionSizes(pick.stage_blocks)) p->add_partition(n);
  }
  BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(spec));
  return plan;
}

std::string SummarizePlan(const Plan& plan, int losers) {
  const PlanCandidate& p = plan.ranked.front();
  std::string out = absl::StrFormat(
      "auto-planner chose %s (predicted %s/step, bubble %.3f, peak %s/rank; costs: %s; %d "
      "candidates",
      p.Describe(), Time(p.step_time, plan.measured), p.bubble, HumanBytes(p.max_peak_bytes),
      plan.cost_source, plan.considered);
  if (plan.over_budget > 0) absl::StrAppend(&out, ", ", plan.over_budget, " over the memory budget");
  absl::StrAppend(&out, ")");
  for (int k = 1; k <= losers && k < static_cast<int>(plan.ranked.size()); ++k) {
    const PlanCandidate& c = plan.ranked[k];
    absl::StrAppend(&out, k == 1 ? "; next: " : ", ", c.Describe(), " ",
                    Time(c.step_time, plan.measured), " (", c.lost, ")");
  }
  return out;
}

std::vector<int64_t> RankNeeds(const baton::v1::JobSpec& spec) {
  if (spec.pipeline().schedule() == baton::v1::SCHEDULE_AUTO) return {};
  PlannerInput in = PlannerInputFor(spec, spec.pipeline().stages());
  in.keep = 1;
  absl::StatusOr<Plan> plan = PlanPipeline(in);
  if (!plan.ok() || plan->ranked.empty()) return {};
  // Each block also costs its objects, whatever its size (a 10^6-block MLP of width 1
  // takes 2.3 GB to build): a bound on each rank's share.
  // (A rank holds V stages, each at most the largest.)
  constexpr int64_t kBytesPerBlock = 4096;
  const PlanCandidate& pick = plan->ranked[0];
  int64_t largest_stage = 0;
  for (const BlockRange& b : pick.stage_blocks) {
    largest_stage = std::max<int64_t>(largest_stage, b.last - b.first);
  }
  std::vector<int64_t> needs;
  for (int64_t peak : pick.peak_bytes) {
    needs.push_back(peak + largest_stage * pick.virtual_stages * kBytesPerBlock);
  }
  return needs;
}

int64_t BusiestRankBytes(const std::vector<int64_t>& needs) {
  return needs.empty() ? 0 : *std::max_element(needs.begin(), needs.end());
}

int64_t RankNeedBytes(const baton::v1::JobSpec& spec) { return BusiestRankBytes(RankNeeds(spec)); }

}  // namespace baton
