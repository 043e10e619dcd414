#include "worker/peer_setup.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective/gloo_collective.h"
#include "common/collective/grpc_gloo_store.h"
#include "common/collective/nccl_collective.h"
#include "common/core/cuda_context.h"
#include "common/core/status.h"
#include "common/transport/nccl_api.h"
#include "common/transport/nccl_transport.h"
#include "worker/worker_log.h"

namespace baton {

absl::StatusOr<std::unique_ptr<Transport>> BringUpNccl(const baton::v1::JobPlan& plan,
                                                       RendezvousBox* rendezvous,
                                                       const ChannelFactory& channels,
                                                       absl::Duration init_timeout,
                                                       std::vector<LinkPlan>* links) {
  const bool required = plan.spec().transport() == baton::v1::TRANSPORT_KIND_NCCL;
  auto refuse_if_required = [&]() -> absl::Status {
    if (!required) return absl::OkStatus();
    for (const LinkPlan& l : *links) {
      if (!l.nccl) {
        return absl::FailedPreconditionError(
            absl::StrCat("the job asks for transport NCCL, but the link between ranks ",
                         plan.rank(), " and ", l.peer, " cannot use it: ", l.reason));
      }
    }
    return absl::OkStatus();
  };
  std::vector<int> candidates;
  for (const LinkPlan& l : *links) {
    if (l.nccl) candidates.push_back(l.peer);
  }
  if (candidates.empty() || rendezvous == nullptr) {
    for (LinkPlan& l : *links) {
      if (l.nccl) {
        l.nccl = false;
        l.reason = "grpc: this worker takes no NCCL rendezvous";
      }
    }
    BATON_RETURN_IF_ERROR(refuse_if_required());
    return std::unique_ptr<Transport>();
  }
  std::vector<std::string> address(plan.num_ranks());
  for (const baton::v1::Peer& p : plan.peers()) {
    if (p.rank() >= 0 && p.rank() < plan.num_ranks()) address[p.rank()] = p.address();
  }
  auto channel_for = [&channels, &address](int rank) { return channels(address[rank]); };
  const absl::Time deadline = absl::Now() + init_timeout;

  // This end's bring-up.
  std::unique_ptr<Transport> nccl;
  std::string mine = "ok";
  absl::StatusOr<NcclApi*> api = LoadNccl();
  if (!api.ok()) {
    mine = absl::StrCat("NCCL did not load: ", api.status().message());
  } else {
    GrpcNcclIdExchange ids(plan.rank(), rendezvous, channel_for, init_timeout);
    NcclTransport::Options o;
    o.rank = plan.rank();
    o.num_ranks = plan.num_ranks();
    o.job_key = plan.job_key();
    o.peers = candidates;
    o.init_timeout = init_timeout;
    o.compute_stream = CudaComputeStream();
    o.cuda_device = CurrentCudaDevice();
    o.api = *api;
    o.ids = &ids;
    absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(o);
    if (t.ok()) {
      nccl = *std::move(t);
    } else {
      mine = absl::StrCat("bring-up failed: ", t.status().message());
    }
  }
  // Both ends' verdicts decide each link: NCCL only if both brought it up.
  for (int peer : candidates) {
    const absl::Status sent = SendRendezvous(
        channel_for(peer), VerdictKey(plan.job_key(), 0, plan.rank(), peer), mine, deadline);
    if (!sent.ok()) WorkerLog(absl::StrCat("NCCL verdict to rank ", peer, ": ", sent.ToString()));
  }
  bool any = false;
  for (LinkPlan& l : *links) {
    if (!l.nccl) continue;
    absl::StatusOr<std::string> theirs =
        rendezvous->Take(VerdictKey(plan.job_key(), 0, l.peer, plan.rank()), deadline);
    if (mine != "ok") {
      l.nccl = false;
      l.reason = absl::StrCat("grpc: NCCL on rank ", plan.rank(), ": ", mine);
    } else if (!theirs.ok()) {
      l.nccl = false;
      l.reason =
          absl::StrCat("grpc: no NCCL verdict from rank ", l.peer, ": ", theirs.status().message());
    } else if (*theirs != "ok") {
      l.nccl = false;
      l.reason = absl::StrCat("grpc: NCCL on rank ", l.peer, ": ", *theirs);
    } else {
      l.reason = absl::StrCat("nccl: communicators up within ", absl::FormatDuration(init_timeout));
      any = true;
    }
  }
  BATON_RETURN_IF_ERROR(refuse_if_required());
  if (!any) nccl.reset();
  return nccl;
}

absl::StatusOr<std::unique_ptr<Collective>> JoinReplicaGroup(const baton::v1::JobPlan& plan,
                                                             RendezvousBox* rendezvous,
                                                             const ChannelFactory& channels,
                                                             absl::Duration timeout,
                                                             baton::v1::GroupReport* report) {
  const int replicas = std::max(1, plan.data_parallel());
  const int member = plan.replica();
  if (member < 0 || member >= replicas || plan.replica_peers_size() != replicas ||
      rendezvous == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: replica ", member, " of ", replicas, " with ", plan.replica_peers_size(),
        " replica peers", rendezvous == nullptr ? " (and this worker takes no rendezvous)" : ""));
  }
  const bool fast = plan.spec().pipeline().reduce_mode() == baton::v1::REDUCE_MODE_FAST;
  const bool nccl_required =
      plan.spec().pipeline().collective_engine() == baton::v1::COLLECTIVE_ENGINE_NCCL;
  report->set_rank(plan.rank());
  report->set_mode(fast ? "fast" : "ordered");
  auto failed = [&](const absl::Status& s) {
    return absl::Status(
        s.code(), absl::StrCat("data-parallel group of rank ", plan.rank(), ": ", s.message()));
  };
  std::vector<std::string> addresses;
  for (const baton::v1::Peer& p : plan.replica_peers()) addresses.push_back(p.address());
  const std::string prefix = GlooGroupPrefix(plan.job_key(), plan.attempt(), plan.rank());
  GrpcGlooStore store(
      prefix, member, replicas, rendezvous,
      [&channels, &addresses](int m) { return channels(addresses[m]); }, timeout);
  struct DropKeys {  // whatever way out, this group's leftovers go
    RendezvousBox* box;
    std::string prefix;
    ~DropKeys() { box->DropPrefix(prefix); }
  } drop{rendezvous, prefix};
  auto store_get = [&](const std::string& key) -> absl::StatusOr<std::string> {
    try {
      std::vector<char> v = store.get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(e.what());
    }
  };
  auto store_set = [&](const std::string& key, const std::string& value) -> absl::Status {
    try {
      store.set(key, std::vector<char>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(e.what());
    }
  };

  GroupEnginePlan engine = PlanGroupEngine(plan);
  if (engine.nccl) {
    // Every member says whether its NCCL loads; NCCL only if all do (all decide alike).
    absl::StatusOr<NcclApi*> api = LoadNccl();
    const std::string mine =
        api.ok() ? "ok" : absl::StrCat("NCCL did not load: ", api.status().message());
    if (absl::Status s = store_set(absl::StrCat("baton/verdict/", member), mine); !s.ok()) {
      return failed(s);
    }
    for (int m = 0; m < replicas && engine.nccl; ++m) {
      absl::StatusOr<std::string> theirs = store_get(absl::StrCat("baton/verdict/", m));
      if (!theirs.ok()) return failed(theirs.status());
      if (*theirs != "ok") {
        engine.nccl = false;
        engine.reason = absl::StrCat("gloo: NCCL on replica ", m, ": ", *theirs);
      }
    }
    if (engine.nccl) {
      NcclCollectiveOptions o;
      o.api = *api;
      o.cuda_device = CurrentCudaDevice();
      o.ordered = !fast;
      o.init_timeout = timeout;
      if (member == 0) {
        const NcclResult r = (*api)->GetUniqueId(&o.id);
        if (r != NcclResult::kSuccess) {
          return failed(
              absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", NcclResultName(r))));
        }
        if (absl::Status s =
                store_set("baton/nccl-id", std::string(o.id.bytes.data(), o.id.bytes.size()));
            !s.ok()) {
          return failed(s);
        }
      } else {
        absl::StatusOr<std::string> id = store_get("baton/nccl-id");
        if (!id.ok()) return failed(id.status());
        if (id->size() != o.id.bytes.size()) {
          return failed(absl::DataLossError("the group's NCCL id has the wrong size"));
        }
        std::copy(id->begin(), id->end(), o.id.bytes.begin());
      }
      absl::StatusOr<std::unique_ptr<NcclCollective>> c =
          NcclCollective::Connect(member, replicas, o);
      if (!c.ok()) return failed(c.status());
      report->set_engine("nccl");
      report->set_reason(absl::StrCat("nccl: ", replicas, " GPUs, communicator up"));
      return std::unique_ptr<Collective>(*std::move(c));
    }
  }
  if (nccl_required) {
    return failed(absl::FailedPreconditionError(absl::StrCat(
        "the job asks for collective engine NCCL, but it cannot be used: ", engine.reason)));
  }
  GlooOptions go;
  const std::string& own = addresses[member];
  go.hostname = own.substr(0, own.rfind(':'));
  if (go.hostname.size() >= 2 && go.hostname.front() == '[') {
    go.hostname = go.hostname.substr(1, go.hostname.size() - 2);  // [v6]:port
  }
  go.connect_timeout = timeout;
  go.ordered = !fast;
  absl::StatusOr<std::unique_ptr<GlooCollective>> c =
      GlooCollective::Connect(store, member, replicas, go);
  if (!c.ok()) return failed(c.status());
  report->set_engine("gloo");
  report->set_reason(engine.reason);
  return std::unique_ptr<Collective>(*std::move(c));
}

}  // namespace baton
