#include "common/core/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

std::string TempFile(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(ReadFileTest, ReadsEveryByte) {
  std::string bytes(200000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  absl::StatusOr<std::string> got = ReadFile(TempFile("every-byte", bytes));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
}

TEST(ReadFileTest, AMissingFileIsNotFoundNamingWhatAndWhere) {
  ReadFileOptions o;
  o.what = "job spec";
  absl::StatusOr<std::string> got = ReadFile("/nonexistent/spec.json", o);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("cannot open job spec '/nonexistent/spec.json': No such file"));
  got = ReadFile("/nonexistent/x");
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("cannot open '/nonexistent/x'"));
}

TEST(ReadFileTest, TheBoundAndRegularFilesAreEnforcedWhenAsked) {
  const std::string path = TempFile("bounded", std::string(11, 'x'));
  ReadFileOptions o;
  o.max_bytes = 10;
  absl::StatusOr<std::string> got = ReadFile(path, o);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("has 11 bytes, over the bound of 10"));
  o.max_bytes = 11;
  EXPECT_TRUE(ReadFile(path, o).ok());

  ReadFileOptions regular;
  regular.regular_only = true;
  got = ReadFile(::testing::TempDir(), regular);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("is not a regular file"));
  got = ReadFile("/dev/zero", regular);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("'/dev/zero' is not a regular file"));
  // A FIFO with no writer is refused, not waited on.
  const std::string fifo = ::testing::TempDir() + "/fifo-" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  got = ReadFile(fifo, regular);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  std::remove(fifo.c_str());
  // Unbounded, a device reads like any file (here: an empty one).
  got = ReadFile("/dev/null");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
}

}  // namespace
}  // namespace baton
