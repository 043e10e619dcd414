// A worker's TensorService with its rendezvous box, on a real loopback server, for tests
// of what meets through TensorService.Rendezvous. Include from *_test.cc only.
#ifndef BATON_COMMON_TRANSPORT_RENDEZVOUS_TEST_UTIL_H_
#define BATON_COMMON_TRANSPORT_RENDEZVOUS_TEST_UTIL_H_

#include <memory>
#include <string>

#include "common/rpc/rpc.h"
#include "common/transport/rendezvous.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"

namespace baton {

struct RendezvousNode {
  TensorInbox inbox;
  RendezvousBox box;
  std::unique_ptr<TensorServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  RendezvousNode() {
    TensorServiceImpl::Options so;
    so.rendezvous = &box;
    so.tune_malloc = false;
    service = std::make_unique<TensorServiceImpl>(&inbox, so);
    ServerOptions opts;
    opts.services = {service.get()};
    server = *StartServer(opts, &address);
  }
  ~RendezvousNode() { server->Shutdown(); }
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_RENDEZVOUS_TEST_UTIL_H_
