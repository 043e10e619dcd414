// Bringing up what connects a rank to its peers before a job's first step, beyond the
// gRPC transport: the NCCL links of the pipeline, and the data-parallel group that sums
// the gradients of the same rank of every replica. Both agree with the peers through
// TensorService.Rendezvous: values are sent to a peer over a channel from `channels` and
// taken from this worker's `rendezvous` box, where the peers' values land.
//
// Cross-process invariant: every rank of the job (every member of a group) calls these
// for the same attempt, and decides alike from the same facts (the plan, the verdicts).
//
// Each call blocks its caller (the job's thread) up to its timeout. Nothing is retained:
// the rendezvous box and the channel factory must outlive the call only.
#ifndef BATON_WORKER_PEER_SETUP_H_
#define BATON_WORKER_PEER_SETUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/worker.pb.h"
#include "common/comm/collective.h"
#include "common/comm/transport.h"
#include "common/transport/rendezvous.h"
#include "grpcpp/grpcpp.h"
#include "worker/links.h"

namespace baton {

// How a job reaches a peer's TensorService: a channel to `address` ("host:port"). It may
// hand out one shared channel per address (ChannelCache).
using ChannelFactory = std::function<std::shared_ptr<grpc::Channel>(const std::string& address)>;

// Brings up NCCL on the links of `links` that are candidates, agrees with each peer on
// whether its link uses it (both ends' bring-up verdicts, exchanged within `init_timeout`),
// and turns the others into gRPC links with the reason. Returns the NCCL transport when
// any link uses it, null otherwise; FAILED_PRECONDITION when the spec asks for NCCL and a
// link cannot use it. `rendezvous` may be null: then no link uses NCCL.
absl::StatusOr<std::unique_ptr<Transport>> BringUpNccl(const baton::v1::JobPlan& plan,
                                                       RendezvousBox* rendezvous,
                                                       const ChannelFactory& channels,
                                                       absl::Duration init_timeout,
                                                       std::vector<LinkPlan>* links);

// Joins this rank's data-parallel group (the same rank of every replica, plan.replica_peers):
// NCCL when PlanGroupEngine allows it and every member's NCCL loads, Gloo over TCP
// otherwise (or FAILED_PRECONDITION when the spec asks for NCCL). `report` says which
// engine and why. Errors name the group ("data-parallel group of rank R: ...");
// INVALID_ARGUMENT for a plan without its replica peers or without a rendezvous box.
absl::StatusOr<std::unique_ptr<Collective>> JoinReplicaGroup(const baton::v1::JobPlan& plan,
                                                             RendezvousBox* rendezvous,
                                                             const ChannelFactory& channels,
                                                             absl::Duration timeout,
                                                             baton::v1::GroupReport* report);

}  // namespace baton

#endif  // BATON_WORKER_PEER_SETUP_H_
