#include "common/core/paths.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PathsTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "/paths_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = fs::canonical(tmpl).string();
    root_ = dir_ + "/ckpt";
    fs::create_directories(root_ + "/alice");
    fs::create_directories(dir_ + "/ckpt2");
    fs::create_directories(dir_ + "/elsewhere");
    fs::create_symlink(dir_ + "/elsewhere", root_ + "/escape");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, root_;
};

TEST_F(PathsTest, CheckpointDirsLieUnderTheRoot) {
  // Relative: under the root. Absolute: as given. The root itself holds job directories.
  EXPECT_EQ(*ConfineCheckpointDir("alice/run-1", root_), root_ + "/alice/run-1");
  EXPECT_EQ(*ConfineCheckpointDir(root_ + "/alice", root_), root_ + "/alice");
  EXPECT_EQ(*ConfineCheckpointDir("alice/../bob", root_), root_ + "/bob");
}

// The root holds every job's checkpoints: a job naming it (or a path that resolves to it)
// would own everyone's directory.
TEST_F(PathsTest, TheCheckpointRootItselfIsRefused) {
  for (const std::string& root : {root_, std::string("."), std::string("alice/.."),
                                  root_ + "/", std::string("")}) {
    absl::StatusOr<std::string> got = ConfineCheckpointDir(root, root_);
    ASSERT_FALSE(got.ok()) << "'" << root << "' -> " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    if (!root.empty()) {
      EXPECT_THAT(std::string(got.status().message()),
                  HasSubstr("is the checkpoint root itself"));
    }
  }
}

TEST_F(PathsTest, EscapesAreRefusedNamingTheField) {
  for (const std::string& bad :
       {std::string("/etc/baton"), std::string("ckpt/../../.."), std::string("../ckpt2/x"),
        dir_ + "/ckpt2", std::string("escape/x"), root_ + "/escape", std::string("")}) {
    absl::StatusOr<std::string> got = ConfineCheckpointDir(bad, root_);
    ASSERT_FALSE(got.ok()) << "'" << bad << "' -> " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("checkpoint.dir"));
  }
  // The error says where a path went.
  EXPECT_THAT(std::string(ConfineCheckpointDir("escape/x", root_).status().message()),
              HasSubstr("resolves to '" + dir_ + "/elsewhere/x'"));
}

TEST_F(PathsTest, DataPathsMustLieStrictlyUnderARoot) {
  Confinement c;
  c.field = "data.text.path";
  c.roots = {dir_ + "/ckpt"};
  c.roots_are = "the data roots";
  EXPECT_TRUE(ConfinePath(root_ + "/alice/text", c).ok());
  EXPECT_FALSE(ConfinePath(root_, c).ok());  // a directory root, not a file under it
  EXPECT_FALSE(ConfinePath(dir_ + "/ckpt2/text", c).ok());
  c.roots.clear();
  EXPECT_EQ(*ConfinePath("anything", c), "anything");  // no roots: as given
}

TEST(PathWithinTest, ComponentByComponent) {
  EXPECT_TRUE(PathWithin("/data/x", "/data"));
  EXPECT_TRUE(PathWithin("/data/x", "/data/"));
  EXPECT_TRUE(PathWithin("/data", "/data"));
  EXPECT_FALSE(PathWithin("/data", "/data", /*dir_itself=*/false));
  EXPECT_FALSE(PathWithin("/data2/x", "/data"));
  EXPECT_FALSE(PathWithin("/", "/data"));
}

TEST(CheckpointRootTest, DefaultsBesideTheBinary) {
  EXPECT_EQ(CheckpointRootFromFlag("/srv/ckpt"), "/srv/ckpt");
  EXPECT_EQ(fs::path(CheckpointRootFromFlag("")).filename(), "checkpoints");
}

}  // namespace
}  // namespace baton
