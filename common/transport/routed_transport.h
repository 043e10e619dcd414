// RoutedTransport: one Transport whose links use different backends, e.g. NCCL between two
// GPUs and gRPC where NCCL cannot connect (two ranks on one GPU, a worker without NCCL, a
// communicator that did not come up). Each peer's sends and receives go to the transport
// chosen for it; Abort aborts every one.
//
// The routed transports are not owned and must outlive this one. Thread-safe as the
// routed transports are.
#ifndef BATON_COMMON_TRANSPORT_ROUTED_TRANSPORT_H_
#define BATON_COMMON_TRANSPORT_ROUTED_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "common/comm/transport.h"

namespace baton {

class RoutedTransport final : public Transport {
 public:
  // by_peer[r]: the transport for rank r (null for this rank and for ranks it never talks
  // to: a send or receive with them is INVALID_ARGUMENT).
  RoutedTransport(int rank, std::vector<Transport*> by_peer);

  // "nccl", "grpc", ... when every link uses one backend, else e.g. "nccl+grpc".
  const char* backend() const override { return backend_.c_str(); }
  int rank() const override { return rank_; }
  // The backend of the link to `peer` ("" when none).
  std::string BackendFor(int peer) const;

  std::unique_ptr<SendWork> Send(int peer, const TensorTag& tag, const Tensor& t) override;
  absl::StatusOr<Tensor> Recv(int peer, const TensorTag& tag, absl::Time deadline) override;
  void Abort(const absl::Status& reason) override;

 private:
  Transport* For(int peer) const;

  const int rank_;
  const std::vector<Transport*> by_peer_;
  std::vector<Transport*> distinct_;  // each routed transport once
  std::string backend_;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_ROUTED_TRANSPORT_H_
