#include "coordinator/auth.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAlice[] = "alice-token-0123456789abcdef";
constexpr char kBob[] = "bob-token-0123456789abcdef00";
constexpr char kRoot[] = "root-token-0123456789abcdef0";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("auth-test-", getpid(), "-", name))
          .string();
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

std::string Tokens() {
  return WriteFile("tokens", absl::StrCat("# token name role\n", kAlice, " alice submitter\n",
                                          "\n", kBob, "\tbob  viewer   # read only\n", kRoot,
                                          " ci-bot@example admin\n"));
}

TEST(AuthTest, BearerTokensMapToTheirNamesAndRoles) {
  auto auth = Authenticator::FromFile(Tokens());
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<Principal> alice = (*auth)->Authenticate(absl::StrCat("Bearer ", kAlice));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kSubmitter);
  absl::StatusOr<Principal> bot = (*auth)->Authenticate(absl::StrCat("Bearer ", kRoot));
  ASSERT_TRUE(bot.ok());
  EXPECT_EQ(bot->name, "ci-bot@example");
  EXPECT_EQ(bot->role, Role::kAdmin);
  EXPECT_EQ((*auth)->Authenticate(absl::StrCat("Bearer ", kBob))->role, Role::kViewer);
}

TEST(AuthTest, MissingMalformedOrUnknownTokensAreUnauthenticatedWithoutEchoingThem) {
  auto auth = Authenticator::FromFile(Tokens());
  ASSERT_TRUE(auth.ok());
  for (const std::string& header :
       {std::string(""), std::string(kAlice), absl::StrCat("Basic ", kAlice),
        std::string("Bearer wrong-token-0123456789abcdef"), absl::StrCat("Bearer ", kAlice, "x"),
        absl::StrCat("Bearer ", std::string(kAlice).substr(0, 10))}) {
    absl::StatusOr<Principal> p = (*auth)->Authenticate(header);
    ASSERT_FALSE(p.ok()) << header;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kUnauthenticated) << header;
    EXPECT_THAT(p.status().message(), Not(HasSubstr("token-0123")));
  }
}

TEST(AuthTest, RolesAllowWhatTheRoleBelowAllows) {
  const Principal viewer{"v", Role::kViewer}, submitter{"s", Role::kSubmitter},
      admin{"a", Role::kAdmin};
  EXPECT_TRUE(Authorize(viewer, Role::kViewer, "read").ok());
  absl::Status s = Authorize(viewer, Role::kSubmitter, "submit jobs");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("v (viewer) may not submit jobs"));
  EXPECT_TRUE(Authorize(submitter, Role::kSubmitter, "submit").ok());
  EXPECT_FALSE(Authorize(submitter, Role::kAdmin, "cancel").ok());
  EXPECT_TRUE(Authorize(admin, Role::kAdmin, "cancel").ok());
  EXPECT_TRUE(Authorize(admin, Role::kViewer, "read").ok());
}

TEST(AuthTest, WithoutATokenFileEveryoneIsAnonymousAdmin) {
  Authenticator open;
  EXPECT_FALSE(open.enabled());
  absl::StatusOr<Principal> p = open.Authenticate("");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->name, kAnonymous);
  EXPECT_EQ(p->role, Role::kAdmin);
}

TEST(AuthTest, BadTokenFilesNameTheLine) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {absl::StrCat(kAlice, " alice\n"), ":1: want three fields"},
      {absl::StrCat("# c\n", kAlice, " alice owner\n"), ":2: unknown role \"owner\""},
      {"short alice viewer\n", ":1: the token is shorter than 16"},
      {absl::StrCat(kAlice, " al/ice viewer\n"), ":1: the name must be"},
      {absl::StrCat(kAlice, " alice viewer\n", kAlice, " eve admin\n"),
       ":2: the token of eve is also alice's"},
      {"# nothing\n", "no tokens"},
  };
  for (const Case& c : cases) {
    auto auth = Authenticator::FromFile(WriteFile("bad", c.text));
    ASSERT_FALSE(auth.ok()) << c.text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(auth.status().message(), HasSubstr(c.want));
    EXPECT_THAT(auth.status().message(), Not(HasSubstr("token-0123")));
  }
  EXPECT_THAT(Authenticator::FromFile("/nonexistent/tokens").status().message(),
              HasSubstr("cannot read /nonexistent/tokens"));
}

TEST(AuthTest, ReloadReplacesTokensAndKeepsThemOnError) {
  const std::string path = WriteFile("reload", absl::StrCat(kAlice, " alice viewer\n"));
  auto auth = Authenticator::FromFile(path);
  ASSERT_TRUE(auth.ok());
  std::ofstream(path, std::ios::trunc) << kBob << " bob admin\n";
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_FALSE((*auth)->Authenticate(absl::StrCat("Bearer ", kAlice)).ok());
  EXPECT_EQ((*auth)->Authenticate(absl::StrCat("Bearer ", kBob))->role, Role::kAdmin);
  std::ofstream(path, std::ios::trunc) << "garbage\n";
  EXPECT_FALSE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Authenticate(absl::StrCat("Bearer ", kBob)).ok());  // kept
}

TEST(AccessWarningsTest, SayPlainlyWhatAnOpenCoordinatorLetsAnyoneDo) {
  // The default: loopback, plaintext, no tokens, no join token.
  const std::vector<std::string> open = OpenAccessWarnings({});
  ASSERT_EQ(open.size(), 3u);
  EXPECT_THAT(open[0], HasSubstr("every caller is an admin"));
  EXPECT_THAT(open[1], HasSubstr("anyone may register as a worker"));
  EXPECT_THAT(open[2], HasSubstr("plaintext"));
  // A join token closes registration, mutual TLS too; tokens close the admin hole.
  EXPECT_EQ(OpenAccessWarnings({false, false, true, true}).size(), 1u);
  EXPECT_EQ(OpenAccessWarnings({true, true, false, false}).size(), 1u);
  EXPECT_TRUE(OpenAccessWarnings({true, true, true, false}).empty());
  EXPECT_TRUE(OpenAccessWarnings({true, false, true, true}).empty());
}

}  // namespace
}  // namespace baton
