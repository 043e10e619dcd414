// Test utility for the gRPC transport's tests and the transport contract suite
// (common/pipeline/transport_contract_test.cc): every rank's server, inbox and transport
// in one process, on loopback.
#ifndef BATON_COMMON_TRANSPORT_GRPC_TRANSPORT_TEST_UTIL_H_
#define BATON_COMMON_TRANSPORT_GRPC_TRANSPORT_TEST_UTIL_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/rpc/rpc.h"
#include "common/transport/grpc_transport.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"
#include "gtest/gtest.h"

namespace baton {

// One rank's receiving side: inbox, service, server.
struct Node {
  TensorInbox inbox;
  std::unique_ptr<TensorServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

class GrpcTestCluster {
 public:
  explicit GrpcTestCluster(int n, int64_t capacity = int64_t{256} << 20,
                   TensorServiceImpl::Options so = {}, uint64_t job_key = 7)
      : job_key_(job_key) {
    for (int r = 0; r < n; ++r) {
      auto node = std::make_unique<Node>();
      node->inbox.Open(job_key_, capacity);
      node->service = std::make_unique<TensorServiceImpl>(&node->inbox, so);
      ServerOptions opts;
      opts.services = {node->service.get()};
      auto server = StartServer(opts, &node->address);
      EXPECT_TRUE(server.ok()) << server.status();
      node->server = *std::move(server);
      nodes_.push_back(std::move(node));
    }
  }
  ~GrpcTestCluster() {
    transports_.clear();
    for (auto& n : nodes_) {
      n->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      n->inbox.Close();
    }
  }

  std::vector<std::string> addresses() const {
    std::vector<std::string> out;
    for (auto& n : nodes_) out.push_back(n->address);
    return out;
  }
  Node& node(int r) { return *nodes_[r]; }

  GrpcTransport::Options Options(int rank) const {
    GrpcTransport::Options o;
    o.rank = rank;
    o.job_key = job_key_;
    o.peer_addresses = addresses();
    o.send_timeout = absl::Seconds(20);
    o.shutdown_timeout = absl::Seconds(5);
    return o;
  }
  GrpcTransport* Add(GrpcTransport::Options o) {
    const int r = o.rank;
    transports_.push_back(std::make_unique<GrpcTransport>(std::move(o), &nodes_[r]->inbox));
    return transports_.back().get();
  }
  GrpcTransport* Add(int rank) { return Add(Options(rank)); }
  void Drop(GrpcTransport* t) {
    std::erase_if(transports_, [t](const auto& p) { return p.get() == t; });
  }

 private:
  const uint64_t job_key_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<GrpcTransport>> transports_;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_GRPC_TRANSPORT_TEST_UTIL_H_
