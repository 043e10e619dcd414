#include "coordinator/checkpoint_dirs.h"

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

// A root that does not exist: resolution is lexical past the missing part.
constexpr char kRoot[] = "/nonexistent-ckpt-root";

std::string Under(const std::string& rel) { return std::string(kRoot) + "/" + rel; }

TEST(CheckpointDirsTest, DefaultDirectoryIsTheUsersOwnUnderUsers) {
  CheckpointDirs dirs(kRoot);
  EXPECT_EQ(dirs.DefaultDir("carol"), Under("users/carol"));
  EXPECT_EQ(DefaultCheckpointDir(kRoot, "carol"), Under("users/carol"));
  EXPECT_EQ(DefaultCheckpointDir("", "carol"), "");
  EXPECT_TRUE(dirs.Check(Under("users/carol"), "carol", false).ok());
  EXPECT_TRUE(dirs.Check(Under("users/carol/runs"), "carol", false).ok());
}

TEST(CheckpointDirsTest, AnotherUsersDefaultDirectoryIsTheirsAlone) {
  CheckpointDirs dirs(kRoot);
  for (const char* dir : {"users/bob", "users/bob/x"}) {
    const absl::Status s = dirs.Check(Under(dir), "carol", /*admin=*/false);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << dir;
    EXPECT_THAT(std::string(s.message()), HasSubstr("user bob's default checkpoint directory"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("yours is '" + Under("users/carol") + "'"));
  }
  EXPECT_TRUE(dirs.Check(Under("users/bob"), "root", /*admin=*/true).ok());
}

TEST(CheckpointDirsTest, UsersItselfIsNoJobsDirectoryNotEvenAnAdmins) {
  CheckpointDirs dirs(kRoot);
  for (bool admin : {false, true}) {
    const absl::Status s = dirs.Check(Under("users"), "carol", admin);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("holds every user's default"));
  }
}

// One user naming the root (as resolved at submit) was what locked every other user out.
// Such a job, stored before the root was refused, claims nothing.
TEST(CheckpointDirsTest, TheRootOrUsersRecordedEarlierClaimsNothing) {
  CheckpointDirs dirs(kRoot);
  EXPECT_FALSE(dirs.Add(kRoot, "carol", "job-000001"));
  EXPECT_FALSE(dirs.Add(Under("users"), "carol", "job-000002"));
  EXPECT_TRUE(dirs.Check(Under("team"), "dave", false).ok());
  EXPECT_TRUE(dirs.Check(Under("users/dave"), "dave", false).ok());
  // Their own job directories still are theirs.
  EXPECT_EQ(dirs.Check(Under("job-000001/x"), "dave", false).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointDirsTest, AnotherUsersDirectoryMayBeNeitherEnteredNorSurrounded) {
  CheckpointDirs dirs(kRoot);
  ASSERT_TRUE(dirs.Add(Under("team/alice"), "alice", "job-000003"));
  for (const char* dir : {"team/alice", "team/alice/mine", "team"}) {
    const absl::Status s = dirs.Check(Under(dir), "bob", false);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << dir;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("the checkpoint directory of job-000003 submitted by alice"));
  }
  EXPECT_TRUE(dirs.Check(Under("team/alice-2"), "bob", false).ok());  // a sibling
  EXPECT_TRUE(dirs.Check(Under("team/alice"), "alice", false).ok());  // her own, again
  EXPECT_TRUE(dirs.Check(Under("team"), "root", /*admin=*/true).ok());
  // The first job to name a directory owns it.
  ASSERT_TRUE(dirs.Add(Under("team/alice"), "bob", "job-000004"));
  EXPECT_EQ(dirs.Check(Under("team/alice"), "bob", false).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(CheckpointDirsTest, NoDirectoryLiesInAnotherJobsOwnDirectory) {
  CheckpointDirs dirs(kRoot);
  ASSERT_TRUE(dirs.Add(Under("users/alice"), "alice", "job-000005"));
  for (bool admin : {false, true}) {
    for (const char* dir : {"users/alice/job-000005", "users/alice/job-000005/nested"}) {
      const absl::Status s = dirs.Check(Under(dir), "alice", admin);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dir;
      EXPECT_THAT(std::string(s.message()), HasSubstr("where job-000005 writes its own"));
    }
  }
  EXPECT_TRUE(dirs.Check(Under("users/alice/job-0000050"), "alice", false).ok());
}

TEST(CheckpointDirsTest, WithoutARootOnlyTheOwnerAndJobRulesApply) {
  CheckpointDirs dirs("");
  EXPECT_EQ(dirs.DefaultDir("carol"), "");
  ASSERT_TRUE(dirs.Add("/shared/ckpt/alice", "alice", "job-000001"));
  EXPECT_EQ(dirs.Check("/shared/ckpt", "bob", false).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(dirs.Check("/shared/users", "bob", false).ok());
}

}  // namespace
}  // namespace baton
