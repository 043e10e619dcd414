#include "client/batonctl/args.h"

#include "gtest/gtest.h"

namespace baton::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"file", "f", false, "spec"}, {"steps", "", false, "steps"}, {"quiet", "q", true, "quiet"}};

TEST(ArgsTest, ParsesLongShortEqualsAndBoolean) {
  absl::StatusOr<Args> a =
      Args::Parse({"-f", "x.json", "--steps=5", "--quiet", "extra"}, kFlags);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Get("file"), "x.json");
  EXPECT_EQ(*a->GetInt("steps", 0), 5);
  EXPECT_EQ(a->Get("quiet"), "true");
  EXPECT_EQ(a->positional(), std::vector<std::string>{"extra"});
  EXPECT_EQ(a->Get("missing", "dflt"), "dflt");
}

TEST(ArgsTest, UnknownFlagIsNamed) {
  absl::StatusOr<Args> a = Args::Parse({"--nope", "1"}, kFlags);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--nope"), absl::string_view::npos);
}

TEST(ArgsTest, MissingValueIsNamed) {
  absl::StatusOr<Args> a = Args::Parse({"--file"}, kFlags);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--file needs a value"), absl::string_view::npos);
}

TEST(ArgsTest, NonIntegerIsRefused) {
  absl::StatusOr<Args> a = Args::Parse({"--steps", "ten"}, kFlags);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<int64_t> v = a->GetInt("steps", 0);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("'ten'"), absl::string_view::npos);
}

TEST(ArgsTest, DoubleDashEndsFlags) {
  absl::StatusOr<Args> a = Args::Parse({"--", "--steps"}, kFlags);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->positional(), std::vector<std::string>{"--steps"});
  EXPECT_FALSE(a->Has("steps"));
}

// An argument comes back in errors escaped and bounded: a terminal shows the message, not
// what a pasted escape sequence would do, and a megabyte argument makes a short line.
TEST(ArgsTest, ErrorsQuoteArgumentsEscapedAndBounded) {
  absl::StatusOr<Args> a = Args::Parse({"--" + std::string(1 << 20, 'x') + "\x1b[2J"}, kFlags);
  ASSERT_FALSE(a.ok());
  EXPECT_LT(a.status().message().size(), 1024u);
  EXPECT_NE(a.status().message().find("unknown flag --xxx"), absl::string_view::npos);
  EXPECT_EQ(a.status().message().find('\x1b'), absl::string_view::npos);

  a = Args::Parse({"--steps", "1\n2\xff"}, kFlags);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<int64_t> v = a->GetInt("steps", 0);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("'1\\n2\\xff'"), absl::string_view::npos)
      << v.status();
}

}  // namespace
}  // namespace baton::cli
