// Which transport each link of a rank uses: the decision a worker makes when a cluster job
// starts, from facts every rank of the job shares (the plan: the spec, the device placement
// chose, each peer's device and capabilities), so both ends of a link decide alike.
#ifndef BATON_WORKER_LINKS_H_
#define BATON_WORKER_LINKS_H_

#include <set>
#include <string>
#include <vector>

#include "baton/v1/worker.pb.h"
#include "common/schedule/schedule.h"
#include "common/transport/tensor_inbox.h"

namespace baton {

// The capability a worker registers when it can run the NCCL transport (a GPU and a
// loadable libnccl.so.2).
inline constexpr char kNcclCapability[] = "transport/nccl";

struct LinkPlan {
  int peer = 0;
  bool nccl = false;   // a candidate for NCCL (its communicator still has to come up)
  std::string reason;  // why gRPC, or "nccl" details
};

// The ranks `rank` sends to or receives from in `schedule`, ascending.
std::set<int> Neighbours(const Schedule& schedule, int rank);

// For each neighbour of plan.rank(): gRPC when the spec asks for it, when the job computes
// on the CPU, when either worker lacks kNcclCapability, or when both ranks share a GPU
// (same UUID: NCCL cannot connect two ranks on one device); else an NCCL candidate.
std::vector<LinkPlan> PlanLinks(const baton::v1::JobPlan& plan, const std::set<int>& neighbours);

// Which engine sums the gradients of plan.rank()'s data-parallel group (plan.replica_peers):
// a candidate for NCCL when the spec does not ask for Gloo, the job computes on CUDA, every
// member registered kNcclCapability and no two members share a GPU (NCCL cannot connect two
// ranks on one device); Gloo otherwise. Every member decides alike from the same facts; an
// NCCL candidate still needs every member's NCCL to load (the worker checks at bring-up).
struct GroupEnginePlan {
  bool nccl = false;   // a candidate for NCCL
  std::string reason;  // why Gloo ("gloo: ..."), or "nccl"
};
GroupEnginePlan PlanGroupEngine(const baton::v1::JobPlan& plan);

// What this rank's inbox accepts while it runs `plan` (its clock in `schedule`): the
// tensors its RECV_F and RECV_B actions take, and the certificate name of every rank
// (tensor_inbox.h). `capacity_bytes` bounds what waits in it.
InboxPlan PlanInbox(const baton::v1::JobPlan& plan, const Schedule& schedule,
                    int64_t capacity_bytes);

// Who may file rendezvous values for `plan`'s attempt on this worker: the certificate
// names of the job's ranks (plan.peers) and of this rank's replicas (plan.replica_peers).
// Empty, meaning anyone with the job key, when any of them has none (no mutual TLS).
std::vector<std::string> RendezvousMembers(const baton::v1::JobPlan& plan);

// The rendezvous keys of the bring-up verdict that `from` sends `to` for a job attempt.
std::string VerdictKey(uint64_t job_key, int64_t attempt, int from, int to);
// What every key of a job starts with (for dropping its leftovers).
std::string JobRendezvousPrefix(uint64_t job_key);

}  // namespace baton

#endif  // BATON_WORKER_LINKS_H_
