#include "worker/links.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

const baton::v1::Peer* PeerOf(const baton::v1::JobPlan& plan, int rank) {
  for (const baton::v1::Peer& p : plan.peers()) {
    if (p.rank() == rank) return &p;
  }
  return nullptr;
}

bool HasNccl(const baton::v1::Peer& p) {
  return std::find(p.capabilities().begin(), p.capabilities().end(), kNcclCapability) !=
         p.capabilities().end();
}

}  // namespace

std::set<int> Neighbours(const Schedule& schedule, int rank) {
  std::set<int> out;
  if (rank < 0 || rank >= static_cast<int>(schedule.ranks.size())) return out;
  for (const Action& a : schedule.ranks[rank]) {
    if (a.kind == ActionKind::kClipGrad) {
      // The norm's chain: the ranks before and after this one (which hold adjacent stages
      // under every placement baton uses, so these links exist anyway).
      if (rank > 0) out.insert(rank - 1);
      if (rank + 1 < schedule.num_ranks) out.insert(rank + 1);
      continue;
    }
    const int peer_stage = PeerStage(a, schedule.num_stages());
    const int peer = peer_stage >= 0 && peer_stage < schedule.num_stages()
                         ? schedule.stage_to_rank[peer_stage]
                         : -1;
    if (peer >= 0 && peer != rank) out.insert(peer);
  }
  return out;
}

std::vector<LinkPlan> PlanLinks(const baton::v1::JobPlan& plan, const std::set<int>& neighbours) {
  std::vector<LinkPlan> out;
  const baton::v1::Peer* self = PeerOf(plan, plan.rank());
  for (int peer : neighbours) {
    LinkPlan link;
    link.peer = peer;
    const baton::v1::Peer* other = PeerOf(plan, peer);
    if (plan.spec().transport() == baton::v1::TRANSPORT_KIND_GRPC) {
      link.reason = "grpc: asked for";
    } else if (plan.spec().device() != baton::v1::DEVICE_KIND_CUDA) {
      link.reason = "grpc: the job computes on the CPU";
    } else if (self == nullptr || other == nullptr) {
      link.reason = "grpc: the plan does not describe both workers";
    } else if (!HasNccl(*self) || !HasNccl(*other)) {
      const baton::v1::Peer& without = HasNccl(*self) ? *other : *self;
      link.reason = absl::StrCat("grpc: worker ", without.worker_id(), " (rank ", without.rank(),
                                 ") cannot run NCCL");
    } else if (!self->device().uuid().empty() && self->device().uuid() == other->device().uuid()) {
      link.reason = absl::StrCat("grpc: ranks ", std::min(plan.rank(), peer), " and ",
                                 std::max(plan.rank(), peer), " share GPU ", self->device().uuid(),
                                 " (NCCL cannot connect two ranks on one device)");
    } else {
      link.nccl = true;
      link.reason = "nccl";
    }
    out.push_back(link);
  }
  return out;
}

GroupEnginePlan PlanGroupEngine(const baton::v1::JobPlan& plan) {
  GroupEnginePlan out;
  if (plan.spec().pipeline().collective_engine() == baton::v1::COLLECTIVE_ENGINE_GLOO) {
    out.reason = "gloo: asked for";
    return out;
  }
  if (plan.spec().device() != baton::v1::DEVICE_KIND_CUDA) {
    out.reason = "gloo: the job computes on the CPU";
    return out;
  }
  std::map<std::string, int> by_gpu;  // GPU UUID -> the first replica on it
  for (const baton::v1::Peer& p : plan.replica_peers()) {
    if (!HasNccl(p)) {
      out.reason = absl::StrCat("gloo: worker ", p.worker_id(), " (replica ", p.rank(),
                                ") cannot run NCCL");
      return out;
    }
    if (p.device().uuid().empty()) continue;
    auto [it, fresh] = by_gpu.emplace(p.device().uuid(), p.rank());
    if (!fresh) {
      out.reason = absl::StrCat("gloo: replicas ", it->second, " and ", p.rank(), " share GPU ",
                                p.device().uuid(), " (NCCL cannot connect two ranks on one device)");
      return out;
    }
  }
  out.nccl = true;
  out.reason = "nccl";
  return out;
}

InboxPlan PlanInbox(const baton::v1::JobPlan& plan, const Schedule& schedule,
                    int64_t capacity_bytes) {
  InboxPlan out;
  out.job_key = plan.job_key();
  out.capacity_bytes = capacity_bytes;
  out.num_ranks = plan.num_ranks();
  out.identities.resize(std::max(plan.num_ranks(), 0));
  for (const baton::v1::Peer& p : plan.peers()) {
    if (p.rank() >= 0 && p.rank() < plan.num_ranks()) out.identities[p.rank()] = p.identity();
  }
  const int rank = plan.rank();
  if (rank < 0 || rank >= static_cast<int>(schedule.ranks.size())) return out;
  for (const Action& a : schedule.ranks[rank]) {
    if (a.kind == ActionKind::kClipGrad) {
      // The norm's chain (TensorKind::kGradNorm, tagged with the sending rank): the squared
      // norms from rank - 1, the total back from rank + 1.
      for (int from : {rank - 1, rank + 1}) {
        if (from < 0 || from >= schedule.num_ranks) continue;
        const InboxSource source{from, from, TensorKind::kGradNorm};
        if (std::find(out.sources.begin(), out.sources.end(), source) == out.sources.end()) {
          out.sources.push_back(source);
        }
      }
      continue;
    }
    if (a.kind != ActionKind::kRecvF && a.kind != ActionKind::kRecvB &&
        a.kind != ActionKind::kTieGrad) {
      continue;
    }
    const int from_stage = PeerStage(a, schedule.num_stages());
    if (from_stage < 0 || from_stage >= schedule.num_stages()) continue;
    if (schedule.stage_to_rank[from_stage] == rank) continue;  // a local tie
    const TensorKind kind = a.kind == ActionKind::kRecvF   ? TensorKind::kActivation
                            : a.kind == ActionKind::kRecvB ? TensorKind::kGradient
                                                           : TensorKind::kTiedGradient;
    const InboxSource source{schedule.stage_to_rank[from_stage], from_stage, kind};
    if (std::find(out.sources.begin(), out.sources.end(), source) == out.sources.end()) {
      out.sources.push_back(source);
    }
  }
  return out;
}

std::vector<std::string> RendezvousMembers(const baton::v1::JobPlan& plan) {
  std::vector<std::string> out;
  for (const auto* peers : {&plan.peers(), &plan.replica_peers()}) {
    for (const baton::v1::Peer& p : *peers) {
      if (p.identity().empty()) return {};
      out.push_back(p.identity());
    }
  }
  return out;
}

std::string JobRendezvousPrefix(uint64_t job_key) {
  return absl::StrCat("baton/nccl/job/", job_key, "/");
}

std::string VerdictKey(uint64_t job_key, int64_t attempt, int from, int to) {
  return absl::StrCat(JobRendezvousPrefix(job_key), "attempt/", attempt, "/verdict/", from, "->",
                      to);
}

}  // namespace baton
