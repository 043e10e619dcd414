// Gloo's rendezvous store over baton's own gRPC: how the replicas of a data-parallel group
// on different workers find each other (the Gloo engine's connectFullMesh publishes each
// member's addresses under its key and reads the others').
//
// Push-based, like the NCCL id exchange (common/transport/rendezvous.h): set(key) sends
// the value to every other member's TensorService.Rendezvous, where it waits in that
// worker's RendezvousBox; get/wait take it from this worker's own box (and keep it, so a
// key may be read twice). Keys go on the wire as `prefix` + key; the prefix names the job
// key, the attempt and the group (GlooGroupPrefix), so groups and attempts never mix and a
// finished job's leftovers are dropped by prefix. A value must fit the box's bound
// (RendezvousBox::Options::max_value_bytes), which bounds the group's size.
//
// Thread-compatible (one Gloo context uses it at a time).
#ifndef BATON_COMMON_COLLECTIVE_GRPC_GLOO_STORE_H_
#define BATON_COMMON_COLLECTIVE_GRPC_GLOO_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/transport/rendezvous.h"
#include "gloo/rendezvous/store.h"
#include "grpcpp/grpcpp.h"

namespace baton {

// "baton/gloo/job/<job key>/attempt/<attempt>/group/<group>/".
std::string GlooGroupPrefix(uint64_t job_key, int attempt, int group);

class GrpcGlooStore final : public gloo::rendezvous::Store {
 public:
  // This member is `rank` of `size`; `channel_for(m)` is a channel to member m's
  // TensorService; `box` (not owned) is this worker's. `timeout` bounds every send and wait.
  GrpcGlooStore(std::string prefix, int rank, int size, RendezvousBox* box,
                std::function<std::shared_ptr<grpc::Channel>(int)> channel_for,
                absl::Duration timeout);

  // Gloo reports failures by exception: these throw std::runtime_error naming the key.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  void Take(const std::string& key, absl::Time deadline);

  const std::string prefix_;
  const int rank_;
  const int size_;
  RendezvousBox* const box_;
  const std::function<std::shared_ptr<grpc::Channel>(int)> channel_for_;
  const absl::Duration timeout_;
  std::map<std::string, std::vector<char>> values_;  // this member's and what it took
};

}  // namespace baton

#endif  // BATON_COMMON_COLLECTIVE_GRPC_GLOO_STORE_H_
