// What the metrics port answers, path by path and method by method (docs/observability.md
// lists it for users). Plain C++ over http.h, so the HTTP fuzzer (tests/fuzz/http_fuzz.cc)
// drives the same routing as the services.
#ifndef BATON_COMMON_METRICS_METRICS_HTTP_H_
#define BATON_COMMON_METRICS_METRICS_HTTP_H_

#include <cstddef>
#include <functional>
#include <string>

#include "common/http/http.h"

namespace baton {

struct MetricsEndpoint {
  // Named on the landing page ("coordinator", "worker").
  std::string service;
  // The exposition text; called once for each GET or HEAD of /metrics.
  std::function<std::string()> render;
  // Called after each such request with the body bytes it sends (compressed or not) and
  // the microseconds taken to render and compress them. May be empty.
  std::function<void(size_t bytes, double micros)> on_scrape;
};

// The Content-Type of /metrics: Prometheus text exposition format 0.0.4.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// GET or HEAD /metrics: 200 with the text format (gzip when the request accepts it).
// GET or HEAD /: 200 with a short page naming the service and /metrics.
// Another method on either: 405 with "Allow: GET, HEAD". Any other path: 404.
// A query string is ignored.
http::Response ServeMetricsRequest(const http::Request& request, const MetricsEndpoint& endpoint);

}  // namespace baton

#endif  // BATON_COMMON_METRICS_METRICS_HTTP_H_
