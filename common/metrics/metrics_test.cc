#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/rpc_metrics.h"
#include "common/rpc/rpc.h"
#include "gmock/gmock.h"
#include "baton/v1/worker.grpc.pb.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// GET http://127.0.0.1:port/path with a plain socket; returns the whole response.
std::string HttpGet(int port, const std::string& path) {
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
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  close(fd);
  return out;
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
    auto ctx = ContextWithTimeout(absl::Seconds(5));
    ASSERT_TRUE(stub->GetStatus(ctx.get(), {}, &out).ok());
  }
  baton::v1::AbortJobResponse out;
  auto ctx = ContextWithTimeout(absl::Seconds(5));
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
