#include "common/metrics/metrics.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics_http.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace baton {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
    const std::string& service, HttpServerOptions options) {
  std::string host;
  int port = 0;
  if (absl::Status st = SplitHostPort(address, &host, &port); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\" is not host:port"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collectables_ = std::move(collectables);
  server->exposer_registry_ = std::make_shared<prometheus::Registry>();
  server->transferred_bytes_ = &prometheus::BuildCounter()
                                    .Name("exposer_transferred_bytes_total")
                                    .Help("Transferred bytes to metrics services")
                                    .Register(*server->exposer_registry_)
                                    .Add({});
  server->scrapes_ = &prometheus::BuildCounter()
                          .Name("exposer_scrapes_total")
                          .Help("Number of times metrics were scraped")
                          .Register(*server->exposer_registry_)
                          .Add({});
  server->latencies_ =
      &prometheus::BuildSummary()
           .Name("exposer_request_latencies")
           .Help("Latencies of serving scrape requests, in microseconds")
           .Register(*server->exposer_registry_)
           .Add({}, prometheus::Summary::Quantiles{{0.5, 0.05}, {0.9, 0.01}, {0.99, 0.001}});

  MetricsEndpoint endpoint;
  endpoint.service = service;
  MetricsServer* self = server.get();  // the HTTP server stops before *self goes away
  endpoint.render = [self] { return self->Render(); };
  endpoint.on_scrape = [self](size_t bytes, double micros) {
    self->transferred_bytes_->Increment(static_cast<double>(bytes));
    self->scrapes_->Increment();
    self->latencies_->Observe(micros);
  };
  auto http = HttpServer::Start(
      address,
      [endpoint = std::move(endpoint)](const http::Request& request) {
        return ServeMetricsRequest(request, endpoint);
      },
      options);
  if (!http.ok()) {
    return absl::Status(http.status().code(), absl::StrCat("cannot serve metrics on ", address,
                                                           ": ", http.status().message()));
  }
  server->http_ = std::move(*http);
  server->address_ = absl::StrCat(host.find(':') == std::string::npos ? host : "[" + host + "]",
                                  ":", server->http_->port());
  return server;
}

std::string MetricsServer::Render() const {
  std::vector<prometheus::MetricFamily> families = exposer_registry_->Collect();
  for (const auto& c : collectables_) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
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
