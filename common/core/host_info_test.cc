#include "common/core/host_info.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(UsableMemoryTest, TheLeastOfTheLimitsThatApply) {
  MemoryLimits m;
  m.physical_bytes = 64 << 20;
  EXPECT_EQ(UsableMemoryBytes(m), 64 << 20);  // no limit: the RAM
  m.address_space_left = 16 << 20;
  EXPECT_EQ(UsableMemoryBytes(m), 16 << 20);
  m.cgroup_left = 8 << 20;
  EXPECT_EQ(UsableMemoryBytes(m), 8 << 20);
  m.data_left = 0;  // nothing left at all
  EXPECT_EQ(UsableMemoryBytes(m), 0);
  MemoryLimits unknown;
  unknown.cgroup_left = 4 << 20;
  EXPECT_EQ(UsableMemoryBytes(unknown), 4 << 20);  // RAM unreadable: the limit
}

// An address-space limit (ulimit -v) is seen, minus what the process already maps.
TEST(UsableMemoryTest, AnAddressSpaceLimitIsSeen) {
  EXPECT_GT(ReadMemoryLimits().physical_bytes, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  const int64_t before = UsableMemoryBytes();
  // One GiB beyond what is mapped now (not below it: the test must keep running).
  const MemoryLimits now = ReadMemoryLimits();
  ASSERT_EQ(now.address_space_left < 0, old.rlim_cur == RLIM_INFINITY);
  rlimit tight = old;
  std::ifstream status("/proc/self/status");
  int64_t vm = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) vm = std::stoll(line.substr(7)) * 1024;
  }
  ASSERT_GT(vm, 0);
  tight.rlim_cur = static_cast<rlim_t>(vm + (int64_t{1} << 30));
  if (old.rlim_max != RLIM_INFINITY && tight.rlim_cur > old.rlim_max) GTEST_SKIP();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &tight), 0);
  const int64_t limited = UsableMemoryBytes();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &old), 0);
  EXPECT_LE(limited, int64_t{1} << 30);
  EXPECT_GT(limited, int64_t{900} << 20);
  EXPECT_LE(limited, before);
}

}  // namespace
}  // namespace baton
