#include "common/service/server_startup.h"

#include <pthread.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {

ShutdownSignals::ShutdownSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

int ShutdownSignals::Wait(const std::function<void()>& on_hangup) {
  int sig = 0;
  while (sigwait(&signals_, &sig) == 0 && sig == SIGHUP) on_hangup();
  return sig;
}

absl::Status ApplyServerSecurity(const TlsConfig& tls, const std::string& listen) {
  if (absl::Status s = CheckServerSecurity(tls, listen); !s.ok()) return s;
  SetProcessTls(tls);
  return absl::OkStatus();
}

ServiceMetrics::ServiceMetrics(const std::string& service)
    : service_(service), registry_([&service] {
        auto registry = std::make_shared<prometheus::Registry>();
        AddBuildInfo(*registry, service);
        return registry;
      }()) {}

absl::Status ServiceMetrics::Serve(const std::string& listen,
                                   std::vector<std::shared_ptr<prometheus::Collectable>> extra) {
  if (listen.empty()) return absl::OkStatus();
  rpc_ = std::make_unique<RpcMetrics>(*registry_, absl::StrCat("baton_", service_));
  extra.insert(extra.begin(), registry_);
  absl::StatusOr<std::unique_ptr<MetricsServer>> started =
      MetricsServer::Start(listen, std::move(extra), service_);
  if (!started.ok()) return started.status();
  server_ = *std::move(started);
  return absl::OkStatus();
}

std::function<std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
ServiceMetrics::Interceptors() {
  if (!serving()) return nullptr;
  return [this] { return rpc_->Interceptors(); };
}

absl::StatusOr<std::unique_ptr<RunningService>> RunningService::Start(ServiceStartup startup,
                                                                      ServiceMetrics* metrics) {
  auto running = std::unique_ptr<RunningService>(new RunningService());
  startup.server.interceptors = metrics->Interceptors();
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartServer(startup.server, &running->address_);
  if (!server.ok()) return server.status();
  running->server_ = *std::move(server);
  if (!startup.health_listen.empty()) {
    std::string health_bound;
    absl::StatusOr<std::unique_ptr<grpc::Server>> health =
        StartHealthServer(startup.health_listen, &health_bound);
    if (!health.ok()) return health.status();
    running->health_ = *std::move(health);
    std::printf("%s health on %s\n", startup.name.c_str(), health_bound.c_str());
  }
  if (absl::Status s = running->Announce(startup, *metrics); !s.ok()) return s;
  return running;
}

absl::Status RunningService::Announce(const ServiceStartup& startup,
                                      const ServiceMetrics& metrics) const {
  const char* name = startup.name.c_str();
  std::printf("%s listening on %s%s\n", name, address_.c_str(), startup.listening_note.c_str());
  for (const std::string& warning : startup.warnings) {
    std::printf("%s: WARNING: %s\n", name, warning.c_str());
  }
  std::fflush(stdout);
  if (!startup.port_file.empty()) {
    if (absl::Status s = WritePortFile(startup.port_file, address_); !s.ok()) return s;
  }
  if (!metrics.serving()) return absl::OkStatus();
  std::printf("%s metrics on %s\n", name, metrics.address().c_str());
  std::fflush(stdout);
  if (!startup.metrics_port_file.empty()) {
    return WritePortFile(startup.metrics_port_file, metrics.address());
  }
  return absl::OkStatus();
}

RunningService::~RunningService() { Shutdown(absl::ZeroDuration()); }

void RunningService::StopServing() {
  if (auto* h = server_->GetHealthCheckService()) h->SetServingStatus(false);
  if (health_ != nullptr) {
    if (auto* h = health_->GetHealthCheckService()) h->SetServingStatus(false);
  }
}

void RunningService::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
  if (health_ != nullptr) health_->Shutdown();
}

}  // namespace baton
