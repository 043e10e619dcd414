// Counts the RPCs a gRPC server handles, by service, method and status code, and times
// the unary ones, through a server interceptor (so no handler has to remember to).
//
//   RpcMetrics rpc(*registry, "baton_coordinator");   // baton_coordinator_rpcs_total, ...
//   server_options.interceptors = [&rpc] { return rpc.Interceptors(); };
//
// Thread-safe; must outlive the server.
#ifndef BATON_COMMON_METRICS_RPC_METRICS_H_
#define BATON_COMMON_METRICS_RPC_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton {

class RpcMetrics {
 public:
  // Registers `prefix`_rpcs_total{service, method, code} and
  // `prefix`_rpc_duration_seconds{service, method} on `registry`.
  RpcMetrics(prometheus::Registry& registry, const std::string& prefix);

  // A fresh interceptor factory list for grpc::ServerBuilder (which takes ownership).
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  Interceptors();

  // Records one finished RPC; `full_method` is gRPC's "/package.Service/Method".
  // `seconds` < 0 records the count only (streams, whose duration is their lifetime).
  void Record(const std::string& full_method, grpc::StatusCode code, double seconds);

 private:
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& durations_;
};

}  // namespace baton

#endif  // BATON_COMMON_METRICS_RPC_METRICS_H_
