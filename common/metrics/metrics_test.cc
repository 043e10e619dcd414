#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/metrics/metrics_http.h"
#include "common/metrics/rpc_metrics.h"
#include "common/rpc/rpc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Sends `request` on a fresh connection to 127.0.0.1:port; returns everything the server
// sends until it closes (every request here closes: HTTP/1.0, or a body, or an error).
std::string HttpRaw(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

std::string HttpGet(int port, const std::string& path) {
  return HttpRaw(port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"));
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

std::string Text(prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

TEST(MetricsServer, ServesTheRegistryOnAFreePort) {
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "test");
  auto server = MetricsServer::Start("127.0.0.1:0", {registry});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  ASSERT_GT(port, 0);
  const std::string body = HttpGet(port, "/metrics");
  EXPECT_THAT(body, HasSubstr("200 OK"));
  EXPECT_THAT(body, HasSubstr("baton_build_info{"));
  EXPECT_THAT(body, HasSubstr("service=\"test\""));
  EXPECT_THAT(body, HasSubstr("version=\""));
}

http::Request Req(const std::string& method, const std::string& path, bool gzip = false) {
  http::Request r;
  r.method = method;
  r.target = path;
  r.path = path;
  r.accepts_gzip = gzip;
  return r;
}

TEST(ServeMetricsRequest, AnswersEveryPathAndMethod) {
  int renders = 0;
  size_t scraped_bytes = 0;
  MetricsEndpoint ep;
  ep.service = "worker";
  ep.render = [&] {
    ++renders;
    return std::string(1000, 'm');
  };
  ep.on_scrape = [&](size_t bytes, double micros) {
    scraped_bytes += bytes;
    EXPECT_GE(micros, 0.0);
  };

  http::Response r = ServeMetricsRequest(Req("GET", "/metrics"), ep);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, kMetricsContentType);
  EXPECT_EQ(r.body, std::string(1000, 'm'));
  EXPECT_EQ(r.content_encoding, "");
  EXPECT_EQ(scraped_bytes, 1000u);

  r = ServeMetricsRequest(Req("GET", "/metrics", /*gzip=*/true), ep);
  EXPECT_EQ(r.content_encoding, "gzip");
  EXPECT_LT(r.body.size(), 100u);
  EXPECT_EQ(scraped_bytes, 1000u + r.body.size());  // counts the bytes sent
  EXPECT_EQ(ServeMetricsRequest(Req("HEAD", "/metrics"), ep).status, 200);
  EXPECT_EQ(renders, 3);

  r = ServeMetricsRequest(Req("GET", "/"), ep);
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("baton worker"));
  EXPECT_THAT(r.body, HasSubstr("/metrics"));

  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"}) {
    for (const char* path : {"/metrics", "/"}) {
      r = ServeMetricsRequest(Req(method, path), ep);
      EXPECT_EQ(r.status, 405) << method << " " << path;
      ASSERT_EQ(r.headers.size(), 1u);
      EXPECT_EQ(r.headers[0].first, "Allow");
      EXPECT_EQ(r.headers[0].second, "GET, HEAD");
    }
  }
  for (const char* path : {"/nope", "/metrics/", "/METRICS", "*", "/%6detrics"}) {
    r = ServeMetricsRequest(Req("GET", path), ep);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_THAT(r.body, HasSubstr("/metrics"));
  }
  EXPECT_EQ(ServeMetricsRequest(Req("DELETE", "/nope"), ep).status, 404);
  EXPECT_EQ(renders, 3);  // only GET and HEAD of /metrics render
}

TEST(MetricsServer, AnswersOtherPathsAndMethodsAndStaysUp) {
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "test");
  auto server = MetricsServer::Start("127.0.0.1:0", {registry}, "coordinator");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = PortOf((*server)->address());
  EXPECT_THAT(HttpGet(port, "/"), HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(HttpGet(port, "/nope"), HasSubstr("HTTP/1.1 404 Not Found"));
  const std::string post = HttpRaw(port, "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_THAT(post, HasSubstr("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD"));
  EXPECT_THAT(HttpRaw(port, "garbage\r\n\r\n"), HasSubstr("HTTP/1.1 400 Bad Request"));
  const std::string head = HttpRaw(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(head, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(head, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  EXPECT_THAT(head, Not(HasSubstr("baton_build_info")));
  const std::string gz = HttpRaw(port, "GET /metrics HTTP/1.0\r\nAccept-Encoding: gzip\r\n\r\n");
  EXPECT_THAT(gz, HasSubstr("Content-Encoding: gzip"));
  // Still serving, with the exposer's series counting the scrapes of /metrics (HEAD, gzip).
  const std::string body = HttpGet(port, "/metrics");
  EXPECT_THAT(body, HasSubstr("baton_build_info{"));
  EXPECT_THAT(body, HasSubstr("exposer_scrapes_total 2\n"));
  EXPECT_THAT(body, HasSubstr("exposer_transferred_bytes_total "));
  EXPECT_THAT(body, HasSubstr("exposer_request_latencies_count 2\n"));
}

TEST(MetricsServer, RendersTheExposerSeriesThenEachCollectableInOrder) {
  auto a = std::make_shared<prometheus::Registry>();
  auto b = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge().Name("zz_first").Help("h").Register(*a).Add({}).Set(1);
  prometheus::BuildGauge().Name("aa_second").Help("h").Register(*b).Add({}).Set(2);
  auto server = MetricsServer::Start("127.0.0.1:0", {a, b});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string text = (*server)->Render();
  const size_t exposer = text.find("# TYPE exposer_transferred_bytes_total counter");
  const size_t first = text.find("zz_first 1");
  const size_t second = text.find("aa_second 2");
  ASSERT_NE(exposer, std::string::npos);
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(second, std::string::npos);
  EXPECT_LT(exposer, first);
  EXPECT_LT(first, second);
}

TEST(MetricsServer, RefusesBadAndTakenAddresses) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto bad = MetricsServer::Start("no-port", {registry});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("no-port"));
  auto range = MetricsServer::Start("127.0.0.1:70000", {registry});
  EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument);

  auto first = MetricsServer::Start("127.0.0.1:0", {registry});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::Start((*first)->address(), {registry});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->address()));
}

TEST(Buckets, AreIncreasingAndCoverTheirRange) {
  const std::vector<double>& step = StepSecondsBuckets();
  const std::vector<double>& action = ActionSecondsBuckets();
  for (const auto* b : {&step, &action}) {
    for (size_t i = 1; i < b->size(); ++i) EXPECT_LT((*b)[i - 1], (*b)[i]);
  }
  EXPECT_LE(step.front(), 0.001);
  EXPECT_GE(step.back(), 60.0);
  EXPECT_LE(action.front(), 1e-5);
  EXPECT_GE(action.back(), 5.0);
}

// A WorkerService answering GetStatus; its other methods stay UNIMPLEMENTED.
class StatusOnly : public baton::v1::WorkerService::Service {
 public:
  grpc::Status GetStatus(grpc::ServerContext*, const baton::v1::GetWorkerStatusRequest*,
                         baton::v1::WorkerStatus* out) override {
    out->set_worker_id("w");
    return grpc::Status::OK;
  }
};

TEST(RpcMetrics, CountsEveryRpcByServiceMethodAndCode) {
  prometheus::Registry registry;
  RpcMetrics rpc(registry, "baton_test");
  StatusOnly service;
  ServerOptions so;
  so.services = {&service};
  so.interceptors = [&rpc] { return rpc.Interceptors(); };
  std::string bound;
  auto server = StartServer(so, &bound);
  ASSERT_TRUE(server.ok()) << server.status();

  auto stub = baton::v1::WorkerService::NewStub(MakeChannel(bound));
  for (int i = 0; i < 2; ++i) {
    baton::v1::WorkerStatus out;
    auto ctx = ContextWithTimeout(absl::Seconds(60));  // only bounds a hang
    ASSERT_TRUE(stub->GetStatus(ctx.get(), {}, &out).ok());
  }
  baton::v1::AbortJobResponse out;
  auto ctx = ContextWithTimeout(absl::Seconds(60));  // only bounds a hang
  EXPECT_EQ(stub->AbortJob(ctx.get(), {}, &out).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  (*server)->Shutdown();

  const std::string text = Text(registry);
  EXPECT_THAT(text, HasSubstr("baton_test_rpcs_total{code=\"OK\",method=\"GetStatus\","
                              "service=\"baton.v1.WorkerService\"} 2"));
  EXPECT_THAT(text, HasSubstr("baton_test_rpcs_total{code=\"UNIMPLEMENTED\",method=\"AbortJob\","
                              "service=\"baton.v1.WorkerService\"} 1"));
  EXPECT_THAT(text, HasSubstr("baton_test_rpc_duration_seconds_count{method=\"GetStatus\","
                              "service=\"baton.v1.WorkerService\"} 2"));
  EXPECT_THAT(text, Not(HasSubstr("service=\"unknown\"")));
}

}  // namespace
}  // namespace baton
