#include "coordinator/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/status.h"
#include "common/nn/model.h"
#include "common/plan/clock_proto.h"
#include "common/plan/planner.h"
#include "common/rpc/rpc.h"
#include "common/schedule/generators.h"
#include "common/schedule/validate.h"
#include "common/spec/schedule_spec.h"
#include "common/spec/spec.h"

namespace baton {
namespace {

absl::Status PipelineError(const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("pipeline: ", s.message()));
}

}  // namespace

absl::StatusOr<PipelineLayout> BuildPipelineLayout(const baton::v1::JobSpec& spec) {
  if (absl::Status chosen = RequireChosenSchedule(spec); !chosen.ok()) return chosen;
  const baton::v1::PipelineSpec& p = spec.pipeline();
  ScheduleOptions o;
  absl::StatusOr<ScheduleKind> kind = ScheduleKindFromSpec(p);
  if (!kind.ok()) return kind.status();  // already names pipeline.schedule
  o.kind = *kind;
  o.num_ranks = p.stages();
  o.virtual_stages = p.virtual_stages();
  o.num_microbatches = p.microbatches();
  o.num_blocks = ModelBlockCount(spec.model());
  PipelineLayout layout;
  absl::StatusOr<Schedule> schedule = BuildSchedule(o);
  if (!schedule.ok()) return PipelineError(schedule.status());
  layout.schedule = *std::move(schedule);
  // Every replica runs the same clock, with each stage's gradient reduction and the tied
  // embedding's sum in it.
  absl::StatusOr<Schedule> job_clock = AddJobActions(layout.schedule, spec);
  if (!job_clock.ok()) return PipelineError(job_clock.status());
  layout.schedule = *std::move(job_clock);
  layout.blocks = DescribeBlocks(spec.model());
  absl::StatusOr<std::vector<BlockRange>> ranges =
      StageBlocks(layout.blocks, layout.schedule.num_stages(),
                  {p.partition().begin(), p.partition().end()});
  if (!ranges.ok()) return PipelineError(ranges.status());
  layout.stage_blocks = *std::move(ranges);
  layout.rank_blocks.assign(layout.schedule.num_ranks, {});
  for (int s = 0; s < layout.schedule.num_stages(); ++s) {
    const int r = layout.schedule.stage_to_rank[s];
    for (int b = layout.stage_blocks[s].first; b < layout.stage_blocks[s].last; ++b) {
      layout.rank_blocks[r].push_back(b);
    }
  }
  for (auto& v : layout.rank_blocks) std::sort(v.begin(), v.end());
  layout.last_rank = layout.schedule.stage_to_rank.back();
  return layout;
}

bool WantsCuda(const baton::v1::JobSpec& spec) {
  return spec.device() == baton::v1::DEVICE_KIND_CUDA ||
         (spec.device() == baton::v1::DEVICE_KIND_UNSPECIFIED &&
          spec.transport() == baton::v1::TRANSPORT_KIND_NCCL);
}

bool WorkerCanRunRank(const baton::v1::JobSpec& spec, int64_t rank_bytes,
                      const baton::v1::WorkerInfo& worker) {
  const int64_t has = worker.device().memory_bytes();
  if (has > 0 && has < rank_bytes) return false;
  return !WantsCuda(spec) || worker.device().kind() == "cuda";
}

namespace {

// "rank 2 (stage 2)", "rank 0 (stages 0 and 7)": which stages a rank of `spec` runs.
std::string RankName(const baton::v1::JobSpec& spec, int rank) {
  std::string out = absl::StrCat("rank ", rank);
  absl::StatusOr<PipelineLayout> layout = BuildPipelineLayout(spec);
  if (!layout.ok()) return out;
  std::vector<std::string> stages;
  for (int s = 0; s < layout->schedule.num_stages(); ++s) {
    if (layout->schedule.stage_to_rank[s] == rank) stages.push_back(absl::StrCat(s));
  }
  if (stages.empty()) return out;
  absl::StrAppend(&out, " (stage", stages.size() == 1 ? " " : "s ", absl::StrJoin(stages, " and "),
                  ")");
  return out;
}

}  // namespace

std::optional<WorkerChoice> ChooseWorkers(const baton::v1::JobSpec& spec,
                                          const std::vector<baton::v1::WorkerInfo>& idle,
                                          const std::vector<bool>& taken, std::string* waiting,
                                          int64_t rank_bytes, int64_t largest_registered_bytes,
                                          const std::vector<int64_t>& rank_needs) {
  const size_t replicas = static_cast<size_t>(std::max(1, spec.pipeline().data_parallel()));
  const size_t stages = static_cast<size_t>(spec.pipeline().stages());
  const size_t need = stages * replicas;
  // What each worker of the choice must hold, replica-major like the choice: per rank when
  // the planner told, else every rank the busiest one's.
  const bool per_rank = rank_needs.size() == stages;
  std::vector<int64_t> needs(need, rank_bytes);
  if (per_rank) {
    for (size_t i = 0; i < need; ++i) needs[i] = rank_needs[i % stages];
  }
  const int64_t most = need == 0 ? 0 : *std::max_element(needs.begin(), needs.end());
  const int64_t least = need == 0 ? 0 : *std::min_element(needs.begin(), needs.end());
  auto gib = [](double b) { return absl::StrFormat("%.3g GiB", b / (1 << 30)); };
  if (largest_registered_bytes > 0 && largest_registered_bytes < most) {
    const size_t busiest =
        static_cast<size_t>(std::max_element(needs.begin(), needs.end()) - needs.begin());
    *waiting = absl::StrCat(
        "waiting: no registered worker can hold ",
        per_rank ? RankName(spec, static_cast<int>(busiest % stages)) : std::string("a rank"),
        " of this job (it needs about ", gib(static_cast<double>(most)),
        per_rank ? "" : " per rank", "; the largest worker has ",
        gib(static_cast<double>(largest_registered_bytes)),
        "; use more stages or larger workers)");
    return std::nullopt;
  }
  // Whether worker `w` (an index into `idle`) holds `bytes`; an unknown memory is enough.
  auto holds = [&](size_t w, int64_t bytes) {
    const int64_t has = idle[w].device().memory_bytes();
    return has <= 0 || has >= bytes;
  };
  std::vector<size_t> gpu, cpu;  // free idle workers with and without a GPU, in order
  size_t too_small = 0;
  for (size_t i = 0; i < idle.size(); ++i) {
    if (i < taken.size() && taken[i]) continue;
    if (!holds(i, least)) {
      ++too_small;
      continue;
    }
    (idle[i].device().kind() == "cuda" ? gpu : cpu).push_back(i);
  }
  auto plural = [&](size_t n, const char* what) {
    std::string out = absl::StrCat(n, " idle ", what, n == 1 ? "" : "s");
    if (too_small > 0) absl::StrAppend(&out, " with at least ", gib(static_cast<double>(least)), " each");
    if (replicas > 1) {
      absl::StrAppend(&out, " (", replicas, " replicas of ", spec.pipeline().stages(),
                      " stages)");
    }
    return out;
  };
  auto too_small_note = [&] {
    return too_small == 0 ? std::string()
                          : absl::StrCat("; ", too_small, " more too small for a rank");
  };
  // Gives each rank a worker of `pool` (in preference order) that holds it: the ranks
  // needing most first, each the fastest worker left that holds it (then the one with the
  // least memory that does, keeping larger ones for larger ranks, then the earliest in
  // `pool`). Any worker holding a rank also holds every smaller one, so this finds an
  // assignment whenever one exists. Workers come back in rank order.
  auto assign = [&](const std::vector<size_t>& pool) -> std::optional<std::vector<size_t>> {
    // Alike ranks on workers of one speed: the first that hold them, in order (the common
    // case, and the cheap one: a round may place a hundred jobs among a thousand workers).
    const bool one_speed = std::all_of(pool.begin(), pool.end(), [&](size_t w) {
      return idle[w].device().peak_flops() == idle[pool[0]].device().peak_flops();
    });
    if (one_speed && least == most) {
      std::vector<size_t> out;
      for (size_t w : pool) {
        if (out.size() == need) break;
        if (holds(w, most)) out.push_back(w);
      }
      if (out.size() == need) return out;
    }
    std::vector<size_t> order(need);
    for (size_t i = 0; i < need; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return needs[a] > needs[b]; });
    std::vector<bool> used(pool.size(), false);
    std::vector<size_t> out(need);
    auto memory = [&](size_t w) {
      const int64_t m = idle[w].device().memory_bytes();
      return m > 0 ? m : std::numeric_limits<int64_t>::max();  // unknown: last
    };
    for (size_t r : order) {
      std::optional<size_t> best;
      for (size_t k = 0; k < pool.size(); ++k) {
        if (used[k] || !holds(pool[k], needs[r])) continue;
        if (!best.has_value()) {
          best = k;
          continue;
        }
        const baton::v1::DeviceInfo& a = idle[pool[k]].device();
        const baton::v1::DeviceInfo& b = idle[pool[*best]].device();
        // Only within a kind of device: a CPU job takes CPU-only workers before GPU ones.
        if ((a.kind() == "cuda") != (b.kind() == "cuda")) continue;
        if (a.peak_flops() != b.peak_flops()) {
          if (a.peak_flops() > b.peak_flops()) best = k;
          continue;
        }
        if (memory(pool[k]) < memory(pool[*best])) best = k;
      }
      if (!best.has_value()) {
        size_t fit = 0;
        for (size_t w : pool) fit += holds(w, needs[r]) ? 1 : 0;
        size_t ranks_as_big = 0;
        for (int64_t n : needs) ranks_as_big += n >= needs[r] ? 1 : 0;
        *waiting = absl::StrCat(
            "waiting for idle workers that hold each rank: ",
            per_rank ? RankName(spec, static_cast<int>(r % stages)) : std::string("a rank"),
            " needs about ", gib(static_cast<double>(needs[r])), " and ", ranks_as_big,
            ranks_as_big == 1 ? " rank needs" : " ranks need", " that much (", fit, " idle ",
            fit == 1 ? "worker has" : "workers have", " it)");
        return std::nullopt;
      }
      used[*best] = true;
      out[r] = pool[*best];
    }
    // The workers are chosen; now which rank goes where. Rank by rank, each takes the
    // earliest of them (in `pool` order) that holds it and leaves a way to place the rest,
    // so that alike workers go out in order (rank r on the r-th) as they always have.
    std::vector<size_t> chosen;  // in `pool` order
    for (size_t k = 0; k < pool.size(); ++k) {
      if (used[k]) chosen.push_back(pool[k]);
    }
    // Whether ranks [from, need) can go on the workers of `chosen` not yet taken: the
    // largest need on the largest worker, and so on (memory is all that matters).
    std::vector<bool> gone(chosen.size(), false);
    auto rest_fits = [&](size_t from) {
      std::vector<int64_t> rest_needs(needs.begin() + static_cast<std::ptrdiff_t>(from), needs.end());
      std::vector<int64_t> rest_memory;
      for (size_t k = 0; k < chosen.size(); ++k) {
        if (!gone[k]) rest_memory.push_back(memory(chosen[k]));
      }
      std::sort(rest_needs.rbegin(), rest_needs.rend());
      std::sort(rest_memory.rbegin(), rest_memory.rend());
      for (size_t i = 0; i < rest_needs.size(); ++i) {
        if (rest_memory[i] < rest_needs[i]) return false;
      }
      return true;
    };
    for (size_t r = 0; r < need; ++r) {
      for (size_t k = 0; k < chosen.size(); ++k) {
        if (gone[k] || !holds(chosen[k], needs[r])) continue;
        gone[k] = true;
        if (rest_fits(r + 1)) {
          out[r] = chosen[k];
          break;
        }
        gone[k] = false;
      }
    }
    return out;
  };
  WorkerChoice out;
  // Transport NCCL needs GPUs: with device auto it makes the job a cuda job.
  const bool nccl = spec.device() == baton::v1::DEVICE_KIND_UNSPECIFIED &&
                    spec.transport() == baton::v1::TRANSPORT_KIND_NCCL;
  const bool wants_cuda = WantsCuda(spec);
  if (wants_cuda || (spec.device() == baton::v1::DEVICE_KIND_UNSPECIFIED && gpu.size() >= need)) {
    const char* asks = nccl ? "transport nccl" : "device cuda";
    std::optional<std::vector<size_t>> chosen;
    if (gpu.size() >= need) chosen = assign(gpu);
    if (!chosen.has_value() && gpu.size() >= need && !wants_cuda) {
      // Device auto: enough GPUs but they cannot hold every rank; try the CPU below.
    } else if (!chosen.has_value()) {
      if (gpu.size() < need) {
        *waiting = absl::StrCat("waiting for ", plural(need, "GPU worker"), " (", gpu.size(),
                                " idle", too_small_note(), "; the job asks for ", asks, ")");
      }
      return std::nullopt;
    } else {
      out.indices = *std::move(chosen);
      out.device = Device::kCuda;
      out.why = !wants_cuda ? "cuda: every worker has a GPU"
                : nccl      ? "cuda: the job asks for transport nccl"
                            : "cuda: asked for";
      return out;
    }
  }
  std::vector<size_t> any = cpu;  // CPU-only workers first
  any.insert(any.end(), gpu.begin(), gpu.end());
  if (any.size() < need) {
    *waiting = absl::StrCat("waiting for ", plural(need, "worker"), " (", any.size(), " idle",
                            too_small_note(), ")");
    return std::nullopt;
  }
  std::optional<std::vector<size_t>> chosen = assign(any);
  if (!chosen.has_value()) return std::nullopt;
  out.indices = *std::move(chosen);
  out.device = Device::kCpu;
  out.why = spec.device() == baton::v1::DEVICE_KIND_CPU
                ? "cpu: asked for"
                : absl::StrCat("cpu: fewer than ", need, " idle workers have a GPU");
  return out;
}

absl::Duration PlannedReceiveTimeout(const baton::v1::JobSpec& spec,
                                     const std::vector<BlockInfo>& blocks,
                                     const std::vector<PlacedWorker>& workers,
                                     absl::Duration floor) {
  const bool bf16 = spec.precision() == baton::v1::PRECISION_BF16;
  double slowest = 0;
  for (const PlacedWorker& w : workers) {
    const double peak = bf16 ? w.device.peak_flops_bf16() : w.device.peak_flops();
    if (!(peak > 0)) return floor;  // unknown: nothing to plan with
    slowest = slowest == 0 ? peak : std::min(slowest, peak);
  }
  if (slowest == 0) return floor;
  const int D = std::max(1, spec.pipeline().data_parallel());
  const double samples = static_cast<double>(spec.data().batch_size()) / D;
  double flops = TrainingFlops(blocks, 0, static_cast<int>(blocks.size()), samples);
  if (spec.pipeline().recompute() == baton::v1::RECOMPUTE_FULL) flops *= 4.0 / 3.0;
  double seconds = flops / slowest;
  if (D > 1) {
    double parameters = 0;
    for (const BlockInfo& b : blocks) parameters += static_cast<double>(b.parameters);
    seconds += 2 * 4 * parameters / kPlannedReplicaBytesPerSecond;
  }
  const double planned = kReceiveHeadroom * seconds;
  // Whole seconds, capped at a day: a deadline that reads well and cannot overflow.
  if (!(planned < 86400)) return std::max(floor, absl::Hours(24));
  return std::max(floor, absl::Seconds(std::ceil(planned)));
}

absl::StatusOr<Placement> PlaceJob(const baton::v1::JobSpec& spec, const std::string& job_id,
                                   uint64_t job_key, const std::vector<PlacedWorker>& workers,
                                   absl::Duration recv_timeout, Device device) {
  Placement out;
  BATON_ASSIGN_OR_RETURN(out.layout, BuildPipelineLayout(spec));
  const Schedule& sc = out.layout.schedule;
  const int D = std::max(1, spec.pipeline().data_parallel());
  const int S = sc.num_ranks;
  if (static_cast<int>(workers.size()) != S * D) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.stages: the job needs ", S * D,
                                                   " workers, ", workers.size(), " given"));
  }
  out.report.set_data_parallel(D);
  out.report.set_schedule(ScheduleKindName(sc.kind));
  out.report.set_stages(sc.num_ranks);
  out.report.set_virtual_stages(sc.virtual_stages);
  out.report.set_microbatches(sc.num_microbatches);
  out.report.set_device(DeviceName(device));
  for (const PlacedWorker& w : workers) {  // rank order: replica-major, as below
    const std::string& k = w.device.kernels();
    if (k.empty() || device != Device::kCpu) continue;
    if (std::find(out.report.kernels().begin(), out.report.kernels().end(), k) ==
        out.report.kernels().end()) {
      out.report.add_kernels(k);
    }
  }
  for (const BlockRange& b : out.layout.stage_blocks) {
    out.report.add_stage_blocks(absl::StrFormat("%d-%d", b.first, b.last - 1));
  }

  baton::v1::JobPlan common;
  common.set_job_id(job_id);
  common.set_job_key(job_key);
  *common.mutable_spec() = spec;
  common.mutable_spec()->set_device(device == Device::kCuda ? baton::v1::DEVICE_KIND_CUDA
                                                            : baton::v1::DEVICE_KIND_CPU);
  common.set_num_ranks(sc.num_ranks);
  common.set_schedule_kind(ScheduleKindToProto(sc.kind));
  common.set_virtual_stages(sc.virtual_stages);
  common.set_microbatches(sc.num_microbatches);
  for (int r : sc.stage_to_rank) common.add_stage_to_rank(r);
  for (int s = 0; s < sc.num_stages(); ++s) {
    baton::v1::StagePlan* sp = common.add_stages();
    sp->set_stage(s);
    sp->set_first_block(out.layout.stage_blocks[s].first);
    sp->set_last_block(out.layout.stage_blocks[s].last);
  }
  const absl::Duration waits =
      PlannedReceiveTimeout(spec, out.layout.blocks, workers, recv_timeout);
  *common.mutable_recv_timeout() = ToProtoDuration(waits);
  *out.report.mutable_recv_timeout() = ToProtoDuration(waits);
  common.set_data_parallel(D);
  auto fill_peer = [&](baton::v1::Peer* peer, int rank, const PlacedWorker& w) {
    peer->set_rank(rank);
    peer->set_worker_id(w.worker_id);
    peer->set_address(w.address);
    *peer->mutable_device() = w.device;
    for (const std::string& c : w.capabilities) peer->add_capabilities(c);
    peer->set_identity(w.identity);
  };

  // Replica-major: worker d * S + r runs rank r of replica d.
  out.plans.reserve(workers.size());
  for (int d = 0; d < D; ++d) {
    for (int r = 0; r < S; ++r) {
      baton::v1::JobPlan plan = common;
      plan.set_rank(r);
      plan.set_replica(d);
      for (int q = 0; q < S; ++q) fill_peer(plan.add_peers(), q, workers[d * S + q]);
      if (D > 1) {
        for (int e = 0; e < D; ++e) fill_peer(plan.add_replica_peers(), e, workers[e * S + r]);
      }
      for (const Action& a : sc.ranks[r]) *plan.add_clock() = ActionToProto(a);
      out.plans.push_back(std::move(plan));
    }
  }
  return out;
}

}  // namespace baton
