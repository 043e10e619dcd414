#include "common/metrics/metrics_http.h"

#include <chrono>
#include <utility>

namespace baton {
namespace {

// Bodies shorter than this are sent as they are: gzip would save little or grow them.
constexpr size_t kMinGzipBytes = 256;

http::Response Text(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

http::Response ServeMetricsRequest(const http::Request& request, const MetricsEndpoint& endpoint) {
  const bool metrics = request.path == "/metrics";
  if (!metrics && request.path != "/") {
    return Text(404, "not found: " + request.path + "\n" + "baton " + endpoint.service +
                         " serves Prometheus metrics at /metrics\n");
  }
  if (request.method != "GET" && request.method != "HEAD") {
    http::Response r = Text(405, "method " + request.method + " not allowed on " + request.path +
                                     "; use GET or HEAD\n");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  if (!metrics) {
    return Text(200, "baton " + endpoint.service + "\nPrometheus metrics: /metrics\n");
  }

  const auto start = std::chrono::steady_clock::now();
  http::Response r;
  r.content_type = kMetricsContentType;
  r.body = endpoint.render ? endpoint.render() : std::string();
  r.headers.emplace_back("Vary", "Accept-Encoding");
  if (request.accepts_gzip && r.body.size() >= kMinGzipBytes) {
    std::string gz = http::Gzip(r.body);
    if (!gz.empty()) {
      r.body = std::move(gz);
      r.content_encoding = "gzip";
    }
  }
  if (endpoint.on_scrape) {
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    endpoint.on_scrape(r.body.size(), took.count());
  }
  return r;
}

}  // namespace baton
