// gRPC glue shared by the services and clients: status conversion (the one place where an
// absl::Status becomes a grpc::Status and back), server start-up with health checking and
// reflection, and time conversions.
#ifndef BATON_COMMON_RPC_RPC_H_
#define BATON_COMMON_RPC_RPC_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/security.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"

namespace baton {

// absl and gRPC status codes map one to one.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// Builds and starts a server on `address` ("host:port"; port 0 picks a free one) with the
// given services, the standard grpc.health.v1 health service (every service reported
// SERVING) and server reflection. Returns the server and, in *bound_address, "host:port"
// with the actual port. TLS as `tls` and `client_certs` say (security.h); the caller
// checked the combination with CheckServerSecurity.
struct ServerOptions {
  std::string address = "127.0.0.1:0";
  TlsConfig tls;  // default: plaintext
  ClientCerts client_certs = ClientCerts::kNone;
  std::vector<grpc::Service*> services;  // not owned
  int max_message_bytes = 64 << 20;
  // Makes the server's interceptors (e.g. RpcMetrics::Interceptors); may be empty.
  std::function<std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
      interceptors;
};
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(const ServerOptions& options,
                                                          std::string* bound_address);

// A plaintext server on `address` that serves grpc.health.v1 and nothing of baton's (for
// Kubernetes' gRPC probes, which cannot speak TLS); its status is SERVING until the
// caller sets it otherwise. *bound_address as StartServer.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& address,
                                                                std::string* bound_address);

// Writes "address\n" to `path` atomically (through path.tmp and a rename), so a process
// waiting for the file never reads half of it. UNAVAILABLE names the file on failure.
absl::Status WritePortFile(const std::string& path, const std::string& address);

// A channel to `address` with baton's defaults: the process's TLS config (ProcessTls) and
// message limits matching StartServer's.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// A client context with a deadline `timeout` from now.
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout);

google::protobuf::Duration ToProtoDuration(absl::Duration d);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);
google::protobuf::Timestamp ToProtoTime(absl::Time t);
absl::Time FromProtoTime(const google::protobuf::Timestamp& t);

}  // namespace baton

#endif  // BATON_COMMON_RPC_RPC_H_
