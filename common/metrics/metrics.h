// Prometheus metrics shared by the services (the metric contract is docs/observability.md).
//
// Each service owns a prometheus::Registry, builds its families on it, and serves it with
// a MetricsServer at http://HOST:PORT/metrics. prometheus-cpp's families and metrics are
// thread-safe: any thread may update them while the server collects.
#ifndef BATON_COMMON_METRICS_METRICS_H_
#define BATON_COMMON_METRICS_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace baton {

// Serves registries over HTTP (prometheus-cpp's civetweb exposer) at /metrics.
class MetricsServer {
 public:
  // `address` is "host:port"; port 0 picks a free one. UNAVAILABLE names the address when
  // it cannot be bound, INVALID_ARGUMENT when it is not host:port. Serves the union of
  // `collectables` (registries, or collectors computing their values at scrape time),
  // which the server keeps alive.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);

  // "host:port" with the bound port.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // destroyed first: stops serving
  std::string address_;
};

// Adds baton_build_info{service, version, compiler, cuda} = 1.
void AddBuildInfo(prometheus::Registry& registry, const std::string& service);

// Bucket bounds start, start*factor, ..., `count` of them.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Bucket layouts used across the services: durations of whole steps and RPCs (1 ms to
// about 2 min), and of single clock actions (10 us to about 10 s).
const std::vector<double>& StepSecondsBuckets();
const std::vector<double>& ActionSecondsBuckets();

}  // namespace baton

#endif  // BATON_COMMON_METRICS_METRICS_H_
