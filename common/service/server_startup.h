// Start-up and shutdown shared by the services' main.cc (coordinator, worker): the stop
// signals, transport security, the metrics endpoint, the gRPC and health servers, the
// lines that announce them on stdout and the port files, always in the same order.
//
// A main.cc, in this order:
//   ShutdownSignals signals;                  // first: before any thread is started
//   ApplyServerSecurity(tls, listen);         // before any channel is made
//   ServiceMetrics metrics("worker");         // the service adds its families, then
//   metrics.Serve(metrics_listen, {...});     // before the core, which records into it
//   ... the core and its gRPC services ...
//   RunningService::Start(startup, &metrics); // serving, announced, port files written
//   signals.Wait(on_hangup);                  // until SIGINT or SIGTERM
//   running->StopServing(); ... stop the core ...; running->Shutdown(grace);
//
// Lines printed (tests and operators read them):
//   NAME health on HOST:PORT            with --health_listen
//   NAME listening on HOST:PORT[NOTE]   then "NAME: WARNING: ..." for each warning
//   NAME metrics on HOST:PORT           with a metrics endpoint
// Each port file is written after its line is printed and flushed.
#ifndef BATON_COMMON_SERVICE_SERVER_STARTUP_H_
#define BATON_COMMON_SERVICE_SERVER_STARTUP_H_

#include <signal.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/metrics/rpc_metrics.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"

namespace baton {

// SIGINT, SIGTERM and SIGHUP, blocked in the constructing thread and so in every thread it
// starts afterwards; Wait() takes them synchronously. Construct it first in main, before
// any thread exists (gRPC, metrics, the core), or a signal may kill a thread instead.
class ShutdownSignals {
 public:
  ShutdownSignals();

  // Waits until SIGINT or SIGTERM arrives and returns it; each SIGHUP before that calls
  // `on_hangup` (on the calling thread).
  int Wait(const std::function<void()>& on_hangup);

 private:
  sigset_t signals_;
};

// Checks that a server may listen on `listen` with `tls` (CheckServerSecurity: the
// INVALID_ARGUMENT names the flag to give) and, when it may, makes `tls` the process's
// configuration for the channels the service opens (SetProcessTls).
absl::Status ApplyServerSecurity(const TlsConfig& tls, const std::string& listen);

// What every service measures: a registry carrying baton_build_info{service} and, once
// served, the gRPC interceptors counting its RPCs (baton_SERVICE_rpcs_total, ...;
// rpc_metrics.h). The service registers its own families on registry() before Serve, so
// that /metrics lists build info, the service's families, then the RPC ones.
class ServiceMetrics {
 public:
  explicit ServiceMetrics(const std::string& service);

  prometheus::Registry& registry() { return *registry_; }

  // Serves the registry and `extra` (e.g. collectors computing values at scrape time) at
  // http://`listen`/metrics. An empty `listen` serves nothing and returns OK (serving()
  // stays false). Errors as MetricsServer::Start (UNAVAILABLE naming the address).
  absl::Status Serve(const std::string& listen,
                     std::vector<std::shared_ptr<prometheus::Collectable>> extra = {});

  bool serving() const { return server_ != nullptr; }
  // The bound "host:port"; only while serving().
  const std::string& address() const { return server_->address(); }

  // For ServerOptions::interceptors: the RPC counters while serving(), none otherwise
  // (an empty function).
  std::function<
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
  Interceptors();

 private:
  const std::string service_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RpcMetrics> rpc_;  // made by Serve
  std::unique_ptr<MetricsServer> server_;
};

// What RunningService::Start needs besides the metrics.
struct ServiceStartup {
  std::string name;                   // "coordinator", "worker": the first word of each line
  ServerOptions server;               // address, TLS, client certificates, services (not owned);
                                      // Start fills in the interceptors from the metrics
  std::string port_file;              // "": none; receives the bound host:port
  std::string health_listen;          // "": no plaintext health server
  std::string metrics_port_file;      // "": none; receives the metrics host:port
  std::string listening_note;         // appended to the listening line, e.g. " (mutual TLS)"
  std::vector<std::string> warnings;  // printed as "NAME: WARNING: ..." after it
};

// A service's gRPC server (and health server) while it runs. Not thread-safe: main's.
class RunningService {
 public:
  // Starts the server, then the health server; prints the lines above and writes the port
  // files. The first failure is returned (the servers started so far are shut down).
  // `metrics` must outlive the service.
  static absl::StatusOr<std::unique_ptr<RunningService>> Start(ServiceStartup startup,
                                                               ServiceMetrics* metrics);
  ~RunningService();

  // "host:port" with the bound port.
  const std::string& address() const { return address_; }

  // Readiness probes (the server's and the health server's grpc.health.v1) see NOT_SERVING
  // from now on; calls are still served.
  void StopServing();

  // Stops accepting calls, lets those in flight finish for up to `grace` (then cancels
  // them), waits for the server, and stops the health server. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  RunningService() = default;
  absl::Status Announce(const ServiceStartup& startup, const ServiceMetrics& metrics) const;

  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_;  // null without --health_listen
  bool shut_down_ = false;
};

}  // namespace baton

#endif  // BATON_COMMON_SERVICE_SERVER_STARTUP_H_
