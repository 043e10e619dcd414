// Prometheus metrics shared by the services (the metric contract is docs/observability.md).
//
// Each service owns a prometheus::Registry, builds its families on it, and serves it with
// a MetricsServer at http://HOST:PORT/metrics. prometheus-cpp's families and metrics are
// thread-safe: any thread may update them while the server collects.
//
// The HTTP side is baton's own (common/http), not prometheus-cpp's civetweb exposer:
// civetweb runs each connection on one of a few threads with fixed 100 KiB stacks, from
// which glibc also carves every thread's static TLS (OpenBLAS alone takes 60 KiB), so its
// error responses (404, 405, 413...) overflowed the stack and killed the process, and a
// few silent connections held every thread.
#ifndef BATON_COMMON_METRICS_METRICS_H_
#define BATON_COMMON_METRICS_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "prometheus/summary.h"

namespace baton {

// Serves registries over HTTP at /metrics (what each path and method gets:
// metrics_http.h). The output is the one prometheus-cpp's exposer gave: its exposer_*
// series first, then each collectable's families in order, in the text format, gzip when
// the scraper accepts it.
class MetricsServer {
 public:
  // `address` is "host:port"; port 0 picks a free one. UNAVAILABLE names the address when
  // it cannot be bound, INVALID_ARGUMENT when it is not host:port. Serves the union of
  // `collectables` (registries, or collectors computing their values at scrape time),
  // which the server keeps alive. `service` names the process on the landing page (/).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
      const std::string& service = "service", HttpServerOptions options = {});

  // "host:port" with the bound port.
  const std::string& address() const { return address_; }

  // The exposition text of every collectable, as GET /metrics returns it uncompressed.
  std::string Render() const;

 private:
  MetricsServer() = default;

  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  // The series prometheus-cpp's exposer added to every endpoint, kept under their names
  // so that dashboards and alerts on them go on working.
  std::shared_ptr<prometheus::Registry> exposer_registry_;
  prometheus::Counter* transferred_bytes_ = nullptr;
  prometheus::Counter* scrapes_ = nullptr;
  prometheus::Summary* latencies_ = nullptr;
  std::string address_;
  std::unique_ptr<HttpServer> http_;  // declared last, destroyed first: stops serving
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
