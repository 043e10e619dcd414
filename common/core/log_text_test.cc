#include "common/core/log_text.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(OneLineTest, ControlCharactersCannotForgeLogLines) {
  EXPECT_EQ(OneLine("plain name, 'quoted', ünïcode"), "plain name, 'quoted', ünïcode");
  EXPECT_EQ(OneLine("x\ncoordinator: job-000009 SUCCEEDED"),
            "x\\ncoordinator: job-000009 SUCCEEDED");
  EXPECT_EQ(OneLine("a\rb\tc\x1b[31md\x7f"), "a\\rb\\tc\\x1b[31md\\x7f");
  EXPECT_EQ(OneLine(std::string("nul\0here", 8)), "nul\\x00here");
  // An escape typed by the client stays distinguishable from one this function wrote.
  EXPECT_EQ(OneLine("literal \\n"), "literal \\\\n");
  EXPECT_EQ(OneLine("").size(), 0u);
}

}  // namespace
}  // namespace baton
