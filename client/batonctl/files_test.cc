#include "client/batonctl/files.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace baton::cli {
namespace {

TEST(ReadFileTest, ReadsEveryByte) {
  const std::string path = ::testing::TempDir() + "/files_test_" + std::to_string(getpid());
  const std::string bytes("a\0b\nc", 5);
  std::ofstream(path, std::ios::binary) << bytes;
  absl::StatusOr<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  std::remove(path.c_str());
}

TEST(ReadFileTest, AMissingFileIsNamed) {
  absl::StatusOr<std::string> got = ReadFile("/nonexistent/schedule.csv");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.status().message(),
            "cannot read /nonexistent/schedule.csv: No such file or directory");
}

}  // namespace
}  // namespace baton::cli
