// Out-of-band setup between the ranks of a cluster job, over baton's gRPC: what a peer sent
// through TensorService.Rendezvous (tensor.proto), kept by key until this worker's job
// takes it; and the NcclIdExchange that hands NCCL unique ids to peers that way (Gloo's
// rendezvous uses the same box: common/collective/grpc_gloo_store.h).
//
// Keys name the job (they start with "baton/nccl/job/<job key>/"), so what arrives before
// this worker's job started waits for it, and a finished job's leftovers are dropped by
// prefix. The box is bounded (entries and value size): a peer cannot grow it without limit.
//
// Thread-safe.
#ifndef BATON_COMMON_TRANSPORT_RENDEZVOUS_H_
#define BATON_COMMON_TRANSPORT_RENDEZVOUS_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/nccl_transport.h"
#include "grpcpp/grpcpp.h"

namespace baton {

class RendezvousBox {
 public:
  struct Options {
    // At most 16 MiB held. A value is an NCCL id (128 bytes) or a Gloo member's
    // addresses (about 136 bytes per member of its group: 16 KiB holds ~120 members).
    size_t max_entries = 1024;
    size_t max_value_bytes = 16 * 1024;
  };
  RendezvousBox() : RendezvousBox(Options()) {}
  explicit RendezvousBox(Options options) : options_(options) {}

  // Keeps `value` under `key`. The same value again is OK (a retried RPC);
  // ALREADY_EXISTS for a different one, INVALID_ARGUMENT for an empty key or a value over
  // max_value_bytes, RESOURCE_EXHAUSTED when max_entries are held.
  absl::Status Put(const std::string& key, std::string value);
  // Removes and returns the value under `key`, waiting for it until `deadline`
  // (DEADLINE_EXCEEDED naming the key).
  absl::StatusOr<std::string> Take(const std::string& key, absl::Time deadline);
  // Drops every value whose key starts with `prefix`.
  void DropPrefix(const std::string& prefix);
  size_t size() const;

 private:
  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable put_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Sends `value` under `key` to the TensorService at the other end of `channel`, retrying
// a refused connection until `deadline` (the peer's worker may still be starting its
// server). Errors name the key.
absl::Status SendRendezvous(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, absl::Time deadline);

// The NcclIdExchange of a cluster job. Publish sends the id to the other rank of the edge
// its key names (nccl_internal::EdgeKey: ".../<src>-><dst>"); Fetch takes it from this
// worker's box, where the peer's Publish put it.
class GrpcNcclIdExchange final : public NcclIdExchange {
 public:
  // `channel_for(rank)`: a channel to that rank's TensorService. `box` is not owned.
  GrpcNcclIdExchange(int rank, RendezvousBox* box,
                     std::function<std::shared_ptr<grpc::Channel>(int)> channel_for,
                     absl::Duration publish_timeout);

  absl::Status Publish(const std::string& key, const NcclUniqueId& id) override;
  absl::StatusOr<NcclUniqueId> Fetch(const std::string& key, absl::Time deadline) override;

 private:
  const int rank_;
  RendezvousBox* const box_;
  const std::function<std::shared_ptr<grpc::Channel>(int)> channel_for_;
  const absl::Duration publish_timeout_;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_RENDEZVOUS_H_
