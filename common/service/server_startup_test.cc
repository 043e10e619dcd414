#include "common/service/server_startup.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace baton {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/server_startup_test_" + std::to_string(getpid()) + "_" + name;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ShutdownSignalsTest, HangupsCallBackUntilATerminatingSignal) {
  ShutdownSignals signals;  // blocked in this thread: raise() leaves them pending
  ASSERT_EQ(raise(SIGHUP), 0);
  ASSERT_EQ(raise(SIGTERM), 0);
  int hangups = 0;
  EXPECT_EQ(signals.Wait([&hangups] { ++hangups; }), SIGTERM);
  EXPECT_EQ(hangups, 1);
}

TEST(ApplyServerSecurityTest, PlaintextOnlyOnLoopbackUnlessInsecure) {
  TlsConfig plaintext;
  EXPECT_TRUE(ApplyServerSecurity(plaintext, "127.0.0.1:0").ok());
  EXPECT_EQ(ApplyServerSecurity(plaintext, "0.0.0.0:7070").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ServiceMetricsTest, AnEmptyAddressServesNothing) {
  ServiceMetrics metrics("worker");
  ASSERT_TRUE(metrics.Serve("").ok());
  EXPECT_FALSE(metrics.serving());
  EXPECT_FALSE(metrics.Interceptors());
}

TEST(RunningServiceTest, WritesPortFilesAndShutsDownOnce) {
  ServiceMetrics metrics("worker");
  ASSERT_TRUE(metrics.Serve("127.0.0.1:0").ok());
  ASSERT_TRUE(metrics.serving());
  ServiceStartup startup;
  startup.name = "test";
  startup.server.address = "127.0.0.1:0";
  startup.port_file = TempPath("port");
  startup.metrics_port_file = TempPath("metrics");
  absl::StatusOr<std::unique_ptr<RunningService>> running =
      RunningService::Start(startup, &metrics);
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(Slurp(startup.port_file), (*running)->address() + "\n");
  EXPECT_EQ(Slurp(startup.metrics_port_file), metrics.address() + "\n");
  (*running)->StopServing();
  (*running)->Shutdown(absl::Seconds(1));
  (*running)->Shutdown(absl::Seconds(1));
  std::remove(startup.port_file.c_str());
  std::remove(startup.metrics_port_file.c_str());
}

TEST(RunningServiceTest, AnUnwritablePortFileIsAnError) {
  ServiceMetrics metrics("worker");
  ServiceStartup startup;
  startup.name = "test";
  startup.server.address = "127.0.0.1:0";
  startup.port_file = "/nonexistent-dir/port";
  EXPECT_FALSE(RunningService::Start(startup, &metrics).ok());
}

}  // namespace
}  // namespace baton
