#include "common/metrics/metrics.h"

#include <exception>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/gauge.h"

namespace baton {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\" is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    // Two civetweb threads are plenty for a scraper or two.
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        absl::StrCat(host, ":", port), /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  server->collectables_ = std::move(collectables);
  for (const auto& c : server->collectables_) server->exposer_->RegisterCollectable(c, "/metrics");
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  server->address_ = absl::StrCat(host, ":", ports.front());
  return server;
}

void AddBuildInfo(prometheus::Registry& registry, const std::string& service) {
  prometheus::BuildGauge()
      .Name("baton_build_info")
      .Help("What is running: service, version, compiler, CUDA version compiled against.")
      .Register(registry)
      .Add({{"service", service},
            {"version", BATON_VERSION},
            {"compiler", BATON_COMPILER},
            {"cuda", BATON_CUDA_VERSION}})
      .Set(1);
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i, start *= factor) out.push_back(start);
  return out;
}

const std::vector<double>& StepSecondsBuckets() {
  static const std::vector<double> b = ExponentialBuckets(0.001, 2, 18);  // 1 ms .. 131 s
  return b;
}

const std::vector<double>& ActionSecondsBuckets() {
  static const std::vector<double> b = ExponentialBuckets(1e-5, 2.5, 16);  // 10 us .. 9 s
  return b;
}

}  // namespace baton
