#include "coordinator/placement.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plan/clock_proto.h"
#include "common/core/status.h"
#include "common/nn/model.h"
#include "common/spec/schedule_spec.h"
#include "common/plan/planner.h"
#include "common/rpc/rpc.h"
#include "common/schedule/generators.h"
#include "common/schedule/validate.h"
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

std::optional<WorkerChoice> ChooseWorkers(const baton::v1::JobSpec& spec,
                                          const std::vector<baton::v1::WorkerInfo>& idle,
                                          const std::vector<bool>& taken, std::string* waiting,
                                          int64_t rank_bytes, int64_t largest_registered_bytes) {
  const size_t replicas = static_cast<size_t>(std::max(1, spec.pipeline().data_parallel()));
  const size_t need = static_cast<size_t>(spec.pipeline().stages()) * replicas;
  const double need_bytes = static_cast<double>(rank_bytes);
  auto gib = [](double b) { return absl::StrFormat("%.3g GiB", b / (1 << 30)); };
  if (largest_registered_bytes > 0 && static_cast<double>(largest_registered_bytes) < need_bytes) {
    *waiting = absl::StrCat("waiting: no registered worker can hold a rank of this job (it "
                            "needs about ", gib(need_bytes), " per rank; the largest worker has ",
                            gib(static_cast<double>(largest_registered_bytes)),
                            "; use more stages or larger workers)");
    return std::nullopt;
  }
  std::vector<size_t> gpu, cpu;  // free idle workers with and without a GPU, in order
  size_t too_small = 0;
  for (size_t i = 0; i < idle.size(); ++i) {
    if (i < taken.size() && taken[i]) continue;
    const int64_t has = idle[i].device().memory_bytes();
    if (has > 0 && static_cast<double>(has) < need_bytes) {
      ++too_small;
      continue;
    }
    (idle[i].device().kind() == "cuda" ? gpu : cpu).push_back(i);
  }
  auto plural = [&](size_t n, const char* what) {
    std::string out = absl::StrCat(n, " idle ", what, n == 1 ? "" : "s");
    if (too_small > 0) absl::StrAppend(&out, " with at least ", gib(need_bytes), " each");
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
  WorkerChoice out;
  // Transport NCCL needs GPUs: with device auto it makes the job a cuda job.
  const bool nccl = spec.device() == baton::v1::DEVICE_KIND_UNSPECIFIED &&
                    spec.transport() == baton::v1::TRANSPORT_KIND_NCCL;
  const bool wants_cuda = WantsCuda(spec);
  if (wants_cuda || (spec.device() == baton::v1::DEVICE_KIND_UNSPECIFIED && gpu.size() >= need)) {
    const char* asks = nccl ? "transport nccl" : "device cuda";
    if (gpu.size() < need) {
      *waiting = absl::StrCat("waiting for ", plural(need, "GPU worker"), " (", gpu.size(),
                              " idle", too_small_note(), "; the job asks for ", asks, ")");
      return std::nullopt;
    }
    out.indices.assign(gpu.begin(), gpu.begin() + static_cast<std::ptrdiff_t>(need));
    out.device = Device::kCuda;
    out.why = !wants_cuda ? "cuda: every worker has a GPU"
              : nccl      ? "cuda: the job asks for transport nccl"
                          : "cuda: asked for";
    return out;
  }
  std::vector<size_t> any = cpu;  // CPU-only workers first
  any.insert(any.end(), gpu.begin(), gpu.end());
  if (any.size() < need) {
    *waiting = absl::StrCat("waiting for ", plural(need, "worker"), " (", any.size(), " idle",
                            too_small_note(), ")");
    return std::nullopt;
  }
  out.indices.assign(any.begin(), any.begin() + static_cast<std::ptrdiff_t>(need));
  out.device = Device::kCpu;
  out.why = spec.device() == baton::v1::DEVICE_KIND_CPU
                ? "cpu: asked for"
                : absl::StrCat("cpu: fewer than ", need, " idle workers have a GPU");
  return out;
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
  *common.mutable_recv_timeout() = ToProtoDuration(recv_timeout);
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
