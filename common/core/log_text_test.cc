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

TEST(EchoInputTest, ShortPrintableTextIsUnchanged) {
  EXPECT_EQ(EchoInput("/data/corpus.txt"), "/data/corpus.txt");
  EXPECT_EQ(EchoInput("job-000042"), "job-000042");
  EXPECT_EQ(EchoInput("ünïcode, 日本語, 🙂"), "ünïcode, 日本語, 🙂");
  EXPECT_EQ(EchoInput(""), "");
}

TEST(EchoInputTest, EscapesControlAndNonUtf8Bytes) {
  EXPECT_EQ(EchoInput("a\nb\x1b[31m"), "a\\nb\\x1b[31m");
  EXPECT_EQ(EchoInput(std::string("nul\0", 4)), "nul\\x00");
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate, a C1 CSI.
  EXPECT_EQ(EchoInput("\x80"), "\\x80");
  EXPECT_EQ(EchoInput("x\xe6\x97"), "x\\xe6\\x97");
  EXPECT_EQ(EchoInput("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(EchoInput("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(EchoInput("\xc2\x9b"), "\\xc2\\x9b");
  EXPECT_EQ(EchoInput("\xff\xfe"), "\\xff\\xfe");
}

TEST(EchoInputTest, BoundsTheOutputAndSaysHowMuchWasLeftOut) {
  const std::string big(1 << 20, 'a');
  const std::string echoed = EchoInput(big);
  EXPECT_EQ(echoed, std::string(kMaxEchoBytes, 'a') + "...(" +
                        std::to_string(big.size() - kMaxEchoBytes) + " more bytes)");
  EXPECT_EQ(EchoInput("abcdef", 4), "abcd...(2 more bytes)");
  EXPECT_EQ(EchoInput("abcd", 4), "abcd");
  // The bound is on what is shown: escapes count at their escaped size, and neither an
  // escape nor a character is cut in half.
  EXPECT_EQ(EchoInput("ab\x01" "cd", 4), "ab...(3 more bytes)");
  EXPECT_EQ(EchoInput("ab\xc3\xa9", 3), "ab...(2 more bytes)");
  const std::string binary(100000, '\xff');
  EXPECT_LE(EchoInput(binary).size(), kMaxEchoBytes + 24);
}

}  // namespace
}  // namespace baton
