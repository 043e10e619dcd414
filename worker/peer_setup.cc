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
#include "common/nccl/nccl_api.h"
#include "common/transport/nccl_transport.h"
#include "worker/worker_log.h"

namespace baton {

namespace {

// FAILED_PRECONDITION when the spec asks for NCCL and a link of `links` does not use it.
absl::Status RefuseGrpcIfNcclRequired(const baton::v1::JobPlan& plan,
                                      const std::vector<LinkPlan>& links) {
  if (plan.spec().transport() != baton::v1::TRANSPORT_KIND_NCCL) return absl::OkStatus();
  for (const LinkPlan& l : links) {
    if (!l.nccl) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job asks for transport NCCL, but the link between ranks ", plan.rank(),
                       " and ", l.peer, " cannot use it: ", l.reason));
    }
  }
  return absl::OkStatus();
}

// This end's NCCL bring-up towards `candidates`: the transport, and the verdict peers get
// ("ok", or why not; then the transport is null).
std::pair<std::unique_ptr<Transport>, std::string> BringUpThisEnd(
    const baton::v1::JobPlan& plan, const std::vector<int>& candidates, RendezvousBox* rendezvous,
    const std::function<std::shared_ptr<grpc::Channel>(int)>& channel_for,
    absl::Duration init_timeout) {
  absl::StatusOr<NcclApi*> api = LoadNccl();
  if (!api.ok()) return {nullptr, absl::StrCat("NCCL did not load: ", api.status().message())};
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
  if (!t.ok()) return {nullptr, absl::StrCat("bring-up failed: ", t.status().message())};
  return {*std::move(t), "ok"};
}

// Decides each candidate link of `links` from this end's verdict `mine` and the peer's
// (taken from `rendezvous` until `deadline`): NCCL only if both brought it up. Returns
// whether any link uses NCCL.
bool DecideLinks(const baton::v1::JobPlan& plan, const std::string& mine, RendezvousBox* rendezvous,
                 absl::Time deadline, absl::Duration init_timeout, std::vector<LinkPlan>* links) {
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
  return any;
}

// The group's key-value store, as text and statuses (Gloo's store throws).
class GroupStore {
 public:
  explicit GroupStore(GrpcGlooStore* store) : store_(store) {}

  absl::StatusOr<std::string> Get(const std::string& key) {
    try {
      std::vector<char> v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(e.what());
    }
  }
  absl::Status Set(const std::string& key, const std::string& value) {
    try {
      store_->set(key, std::vector<char>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(e.what());
    }
  }

 private:
  GrpcGlooStore* const store_;
};

// Every member says whether its NCCL loads; NCCL only if all do (all decide alike). Clears
// engine->nccl, with the reason, when a member's does not. Returns this member's NcclApi
// (meaningful while engine->nccl).
absl::StatusOr<NcclApi*> AgreeOnNccl(GroupStore& store, int member, int replicas,
                                     GroupEnginePlan* engine) {
  absl::StatusOr<NcclApi*> api = LoadNccl();
  const std::string mine =
      api.ok() ? "ok" : absl::StrCat("NCCL did not load: ", api.status().message());
  BATON_RETURN_IF_ERROR(store.Set(absl::StrCat("baton/verdict/", member), mine));
  for (int m = 0; m < replicas && engine->nccl; ++m) {
    BATON_ASSIGN_OR_RETURN(std::string theirs, store.Get(absl::StrCat("baton/verdict/", m)));
    if (theirs != "ok") {
      engine->nccl = false;
      engine->reason = absl::StrCat("gloo: NCCL on replica ", m, ": ", theirs);
    }
  }
  return api.ok() ? *api : nullptr;
}

// The group's NCCL communicator: member 0 makes the id and files it, the others take it.
absl::StatusOr<std::unique_ptr<Collective>> ConnectNccl(GroupStore& store, NcclApi* api, int member,
                                                        int replicas, bool fast,
                                                        absl::Duration timeout) {
  NcclCollectiveOptions o;
  o.api = api;
  o.cuda_device = CurrentCudaDevice();
  o.ordered = !fast;
  o.init_timeout = timeout;
  // The real library sums the GPU's gradients as the compute stream writes them; a fake's
  // streams are its own.
  if (api->device() == Device::kCuda) o.compute_stream = CudaComputeStream();
  if (member == 0) {
    const NcclResult r = api->GetUniqueId(&o.id);
    if (r != NcclResult::kSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", NcclResultName(r)));
    }
    BATON_RETURN_IF_ERROR(
        store.Set("baton/nccl-id", std::string(o.id.bytes.data(), o.id.bytes.size())));
  } else {
    BATON_ASSIGN_OR_RETURN(std::string id, store.Get("baton/nccl-id"));
    if (id.size() != o.id.bytes.size()) {
      return absl::DataLossError("the group's NCCL id has the wrong size");
    }
    std::copy(id.begin(), id.end(), o.id.bytes.begin());
  }
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> c,
                         NcclCollective::Connect(member, replicas, o));
  return std::unique_ptr<Collective>(std::move(c));
}

// The group's Gloo context over TCP, listening on the host of `own` ("host:port").
absl::StatusOr<std::unique_ptr<Collective>> ConnectGloo(GrpcGlooStore& store,
                                                        const std::string& own, int member,
                                                        int replicas, bool fast,
                                                        absl::Duration timeout) {
  GlooOptions go;
  go.hostname = own.substr(0, own.rfind(':'));
  if (go.hostname.size() >= 2 && go.hostname.front() == '[') {
    go.hostname = go.hostname.substr(1, go.hostname.size() - 2);  // [v6]:port
  }
  go.connect_timeout = timeout;
  go.ordered = !fast;
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> c,
                         GlooCollective::Connect(store, member, replicas, go));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> BringUpNccl(const baton::v1::JobPlan& plan,
                                                       RendezvousBox* rendezvous,
                                                       const ChannelFactory& channels,
                                                       absl::Duration init_timeout,
                                                       std::vector<LinkPlan>* links) {
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
    BATON_RETURN_IF_ERROR(RefuseGrpcIfNcclRequired(plan, *links));
    return std::unique_ptr<Transport>();
  }
  std::vector<std::string> address(plan.num_ranks());
  for (const baton::v1::Peer& p : plan.peers()) {
    if (p.rank() >= 0 && p.rank() < plan.num_ranks()) address[p.rank()] = p.address();
  }
  auto channel_for = [&channels, &address](int rank) { return channels(address[rank]); };
  const absl::Time deadline = absl::Now() + init_timeout;
  auto [nccl, mine] = BringUpThisEnd(plan, candidates, rendezvous, channel_for, init_timeout);
  // Both ends' verdicts decide each link.
  for (int peer : candidates) {
    const absl::Status sent = SendRendezvous(
        channel_for(peer), VerdictKey(plan.job_key(), 0, plan.rank(), peer), mine, deadline);
    if (!sent.ok()) WorkerLog(absl::StrCat("NCCL verdict to rank ", peer, ": ", sent.ToString()));
  }
  const bool any = DecideLinks(plan, mine, rendezvous, deadline, init_timeout, links);
  BATON_RETURN_IF_ERROR(RefuseGrpcIfNcclRequired(plan, *links));
  if (!any) nccl.reset();
  return std::move(nccl);
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
  GroupStore text(&store);

  GroupEnginePlan engine = PlanGroupEngine(plan);
  if (engine.nccl) {
    absl::StatusOr<NcclApi*> api = AgreeOnNccl(text, member, replicas, &engine);
    if (!api.ok()) return failed(api.status());
    if (engine.nccl) {
      absl::StatusOr<std::unique_ptr<Collective>> c =
          ConnectNccl(text, *api, member, replicas, fast, timeout);
      if (!c.ok()) return failed(c.status());
      report->set_engine("nccl");
      report->set_reason(absl::StrCat("nccl: ", replicas, " GPUs, communicator up"));
      return c;
    }
  }
  if (nccl_required) {
    return failed(absl::FailedPreconditionError(absl::StrCat(
        "the job asks for collective engine NCCL, but it cannot be used: ", engine.reason)));
  }
  absl::StatusOr<std::unique_ptr<Collective>> c =
      ConnectGloo(store, addresses[member], member, replicas, fast, timeout);
  if (!c.ok()) return failed(c.status());
  report->set_engine("gloo");
  report->set_reason(engine.reason);
  return c;
}

}  // namespace baton
