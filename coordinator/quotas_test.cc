#include "coordinator/quotas.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(QuotasTest, UserLinesReplaceRoleLinesAndDashIsNoLimit) {
  absl::StatusOr<QuotaRules> r = ParseQuotaRules(
      "# scope name max_workers max_queued max_priority\n"
      "role submitter 16 50 0\n"
      "user alice 8 - 5   # alice gets her own\n",
      "q");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->roles.count("submitter"), 1u);
  EXPECT_EQ(r->roles["submitter"].max_workers, 16);
  EXPECT_EQ(r->users["alice"].max_workers, 8);
  EXPECT_FALSE(r->users["alice"].max_queued.has_value());
  EXPECT_EQ(r->users["alice"].max_priority, 5);
}

TEST(QuotasTest, BadLinesAreRefusedNamingTheFileAndLine) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"role submitter 1 2\n", "q:1: want five fields"},
                        Case{"\ngroup x 1 2 3\n", "q:2: unknown scope \"group\""},
                        Case{"role boss 1 2 3\n", "unknown role \"boss\""},
                        Case{"user bob -1 2 3\n", "max_workers must be a count >= 0"},
                        Case{"user bob 1 x 3\n", "max_queued must be a count >= 0"},
                        Case{"user bob 1 1 high\n", "max_priority must be an integer"},
                        Case{"user bob 1 1 1\nuser bob 2 2 2\n", "q:2: user bob has a line"}}) {
    absl::StatusOr<QuotaRules> r = ParseQuotaRules(c.text, "q");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status();
  }
}

TEST(QuotasTest, DefaultsWithoutAFileBoundOnlyTheSubmittersPriority) {
  QuotaBook none;
  EXPECT_FALSE(none.enabled());
  const QuotaLimits s = none.LimitsFor("bob", "submitter");
  EXPECT_FALSE(s.max_workers.has_value());
  EXPECT_FALSE(s.max_queued.has_value());
  EXPECT_EQ(s.max_priority, 0);
  EXPECT_FALSE(none.LimitsFor("root", "admin").max_priority.has_value());
}

TEST(QuotasTest, AFileIsReadAndReloadedAndABadReloadKeepsTheOldRules) {
  const std::string path = ::testing::TempDir() + "/quotas.txt";
  std::ofstream(path) << "role submitter 4 10 0\n";
  absl::StatusOr<std::unique_ptr<QuotaBook>> book = QuotaBook::FromFile(path);
  ASSERT_TRUE(book.ok()) << book.status();
  EXPECT_EQ((*book)->LimitsFor("bob", "submitter").max_workers, 4);
  std::ofstream(path) << "role submitter 6 10 0\nuser bob 1 1 1\n";
  ASSERT_TRUE((*book)->Reload().ok());
  EXPECT_EQ((*book)->LimitsFor("bob", "submitter").max_workers, 1);
  EXPECT_EQ((*book)->LimitsFor("carol", "submitter").max_workers, 6);
  std::ofstream(path) << "nonsense\n";
  EXPECT_FALSE((*book)->Reload().ok());
  EXPECT_EQ((*book)->LimitsFor("carol", "submitter").max_workers, 6);
  std::remove(path.c_str());
  EXPECT_FALSE(QuotaBook::FromFile(path).ok());
}

}  // namespace
}  // namespace baton
