#include "common/data/tokenizer.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

#ifndef BATON_SOURCE_DIR
#error "tokenizer_test needs BATON_SOURCE_DIR (the repository root)"
#endif

// The fixtures in testdata/ were trained with the Python `tokenizers` library (0.23) on a
// small mixed-language corpus, vocab_size 360:
//  - tokenizer_bytelevel.json: models.BPE() behind pre_tokenizers.ByteLevel(add_prefix_space=
//    False), decoders.ByteLevel(), BpeTrainer(special_tokens=["<|endoftext|>"],
//    initial_alphabet=ByteLevel.alphabet()), as scripts/prepare-data.py's train_bpe does.
//  - tokenizer_llama3_style.json: the same behind LLaMA-3's pre-tokenizer, Sequence[Split(
//    Regex(<LLaMA-3 pattern>), "isolated"), ByteLevel(add_prefix_space=False,
//    use_regex=False)], with <|begin_of_text|>, <|end_of_text|>, <|eot_id|> and model
//    ignore_merges set to true as LLaMA-3's file has it.
//  - tokenizer_gpt2_style.json: tokenizer_bytelevel.json with its merges written "a b" and
//    continuing_subword_prefix / end_of_word_suffix "", as GPT-2's file has them.
// The expected ids are Tokenizer.from_file(f).encode(text, add_special_tokens=False).ids
// from that library.
std::string Fixture(const std::string& name) {
  return std::string(BATON_SOURCE_DIR) + "/common/data/testdata/" + name;
}

constexpr char kPlain[] = "Hello world! It's what we'll do, isn't it?";
constexpr char kUnicode[] =
    "Café naïve résumé — 東京は日本の首都です 😀👍🏽 Øresund";
constexpr char kSpaces[] = "  runs   of\n\n\n spaces\t\ttabs \r\n trailing   ";
constexpr char kDigits[] = "DON'T WE'LL 12345 3.14159 ٣٤٥ 2024-01-15";
constexpr char kCode[] = "def foo(x):\n    return x ** 2  # comment\n";

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

const std::vector<Case>& ByteLevelCases() {
  static const auto* cases = new std::vector<Case>{
      {kPlain, {40,  69,  76, 76, 79, 306, 79,  82, 76,  68, 1,  285, 84, 320, 306, 72,
                299, 306, 69, 7,  76, 76,  298, 12, 309, 83, 78, 7,   84, 309, 84,  31}},
      {kUnicode, {35,  65,  70,  264, 221, 78,  277, 108, 276, 221, 82,  264, 83,  278,
                  264, 221, 262, 243, 221, 163, 252, 110, 322, 321, 108, 163, 246, 99,
                  163, 251, 321, 107, 166, 100, 245, 166, 226, 122, 270, 101, 270, 248,
                  221, 294, 223, 259, 236, 257, 238, 122, 315, 247, 260, 83,  85,  281}},
      {kSpaces, {221, 221, 82, 85, 78, 83,  258, 317, 70,  271, 199, 312, 310, 67, 69,  83, 198,
                 198, 84,  65, 66, 83, 221, 202, 199, 221, 284, 65,  73,  76,  73, 313, 325}},
      {kDigits,
       {36, 47,  46, 7,   52,  221, 55,  37, 7,   330, 314, 18, 19, 20, 21, 221, 19, 14, 17,
        20, 304, 25, 221, 150, 97,  150, 98, 150, 99,  311, 16, 18, 20, 13, 16,  17, 13, 304}},
      {kCode, {68,  69, 70,  303, 79, 8,   88,  9,   26, 199, 325, 221, 260, 84, 85, 82, 78,
               221, 88, 221, 10,  10, 311, 221, 221, 3,  308, 77,  77,  69,  78, 84, 199}},
      {"a<|endoftext|>b <|endoftext|><|endoftext|>\n<|endoftext",
       {65, 0, 66, 221, 0, 0, 199, 28, 92, 69, 281, 79, 70, 84, 69, 88, 84}},
  };
  return *cases;
}

const std::vector<Case>& Llama3StyleCases() {
  static const auto* cases = new std::vector<Case>{
      {kPlain, {42,  71,  78, 78, 81, 308, 81,  84, 78,  70, 3,  287, 86, 320, 308, 74,
                302, 308, 71, 9,  78, 78,  301, 14, 311, 85, 80, 9,   86, 311, 86,  33}},
      {kUnicode, {37,  67,  72,  267, 223, 80,  279, 110, 278, 223, 84,  267, 85,  280,
                  267, 223, 265, 245, 223, 165, 254, 112, 322, 321, 110, 165, 248, 101,
                  165, 253, 321, 109, 168, 102, 247, 168, 228, 124, 273, 103, 273, 250,
                  223, 296, 225, 261, 238, 259, 240, 124, 315, 249, 263, 85,  87,  283}},
      {kSpaces, {223, 223, 84, 87, 80, 85,  260, 317, 72,  262, 201, 313, 312, 69, 71,  85, 200,
                 200, 86,  67, 68, 85, 223, 204, 201, 223, 286, 67,  75,  78,  75, 314, 325}},
      {kDigits,
       {38, 49, 48,  329, 223, 57,  39,  9,   331, 223, 19, 20, 21, 22, 23, 223, 21, 16, 19, 22, 19,
        23, 27, 223, 152, 99,  152, 100, 152, 101, 223, 20, 18, 20, 22, 15, 18,  19, 15, 19, 23}},
      {kCode, {70, 71,  72, 305, 81,  10, 90,  11,  299, 325, 223, 263, 86, 87, 84, 80, 223,
               90, 223, 12, 12,  223, 20, 223, 223, 5,   310, 79,  79,  71, 80, 86, 201}},
      {"<|begin_of_text|>Hi there<|eot_id|> ok<|end_of_text|>",
       {0, 42, 75, 223, 86, 266, 263, 2, 317, 77, 1}},
  };
  return *cases;
}

Tokenizer MustLoad(const std::string& name) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::FromFile(Fixture(name));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

void ExpectMatchesReference(const Tokenizer& tok, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(c.text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(c.ids)) << c.text;
    absl::StatusOr<std::string> text = tok.Decode(*ids);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, c.text);
  }
}

TEST(TokenizerTest, ByteLevelMatchesTokenizers) {
  const Tokenizer tok = MustLoad("tokenizer_bytelevel.json");
  ExpectMatchesReference(tok, ByteLevelCases());
  EXPECT_EQ(tok.vocab_size(), 360);
  EXPECT_EQ(tok.max_id(), 359);
  EXPECT_EQ(tok.TokenId("<|endoftext|>"), 0);
  EXPECT_EQ(tok.TokenId("Ġ"), 221);  // a space, in byte-level form
  EXPECT_EQ(tok.TokenId("not a token"), std::nullopt);
}

TEST(TokenizerTest, Llama3StyleMatchesTokenizers) {
  const Tokenizer tok = MustLoad("tokenizer_llama3_style.json");
  ExpectMatchesReference(tok, Llama3StyleCases());
  EXPECT_EQ(tok.vocab_size(), 360);
  EXPECT_EQ(tok.TokenId("<|eot_id|>"), 2);
}

TEST(TokenizerTest, MergesWrittenAsStringsGiveTheSameIds) {
  ExpectMatchesReference(MustLoad("tokenizer_gpt2_style.json"), ByteLevelCases());
}

TEST(TokenizerTest, EmptyTextHasNoIds) {
  const Tokenizer tok = MustLoad("tokenizer_bytelevel.json");
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode("");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_TRUE(ids->empty());
  absl::StatusOr<std::string> text = tok.Decode({});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "");
}

TEST(TokenizerTest, RoundTrips) {
  const std::string texts[] = {
      " ",        "\n",    "x",          std::string(5000, ' ') + "a", std::string(3000, 'z'),
      "\x01\x7f", "\t \t", "İstanbul ǅ", "a  \n  b\n\n\nc   ",         "'''s 'S 'ſ ’s"};
  for (const char* name : {"tokenizer_bytelevel.json", "tokenizer_llama3_style.json"}) {
    const Tokenizer tok = MustLoad(name);
    for (const std::string& s : texts) {
      absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(s);
      ASSERT_TRUE(ids.ok()) << ids.status();
      absl::StatusOr<std::string> back = tok.Decode(*ids);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, s) << name;
    }
  }
}

TEST(TokenizerTest, DecodeWritesBrokenUtf8AsReplacementCharacters) {
  const Tokenizer tok = MustLoad("tokenizer_bytelevel.json");
  // The first byte of "é" (0xC3, written "Ã"), then "a": as tokenizers' from_utf8_lossy.
  absl::StatusOr<std::string> text = tok.Decode({*tok.TokenId("Ã"), *tok.TokenId("a")});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "\xef\xbf\xbd"
            "a");
}

TEST(TokenizerTest, RefusesIdsAndTextItCannotHandle) {
  const Tokenizer tok = MustLoad("tokenizer_bytelevel.json");
  absl::StatusOr<std::string> text = tok.Decode({5, 360});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("id 360 (ids[1])"));
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode("ok \xff");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("not UTF-8 (byte offset 3)"));
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  const Tokenizer tok = MustLoad("tokenizer_llama3_style.json");
  std::vector<std::thread> threads;
  std::vector<bool> ok(4, false);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool all = true;
      for (int round = 0; round < 50; ++round) {
        for (const Case& c : Llama3StyleCases()) {
          absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(c.text);
          all = all && ids.ok() && *ids == c.ids;
        }
      }
      ok[t] = all;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<bool>(4, true));
}

// A minimal byte-level BPE: "a" + "b" -> "ab", with edits for what is refused.
constexpr char kMinimal[] =
    R"({"added_tokens": [{"id": 3, "content": "<|eot|>", "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": null, "vocab": {"a": 0, "b": 1, "ab": 2},
                  "merges": [["a", "b"]]}})";

absl::Status LoadError(const std::string& json) {
  return Tokenizer::FromJson(json, "test.json").status();
}

TEST(TokenizerTest, ReadsTheMinimalFile) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::FromJson(kMinimal, "test.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode("aab<|eot|>ab");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAreArray({0, 2, 3, 2}));
  EXPECT_EQ(tok->vocab_size(), 4);
}

TEST(TokenizerTest, RefusesWhatItDoesNotSupport) {
  const struct {
    std::string from, to;
    std::vector<std::string> message;
  } cases[] = {
      {R"("type": "BPE")",
       R"("type": "WordPiece")",
       {"test.json: model.type \"WordPiece\" is not supported"}},
      {R"("normalizer": null)",
       R"("normalizer": {"type": "NFC"})",
       {"test.json: normalizer of type \"NFC\" is not supported"}},
      {R"("type": "ByteLevel", "add)",
       R"("type": "Metaspace", "add)",
       {"pre_tokenizer of type \"Metaspace\" is not supported"}},
      {R"("dropout": null)", R"("dropout": 0.1)", {"model.dropout 0.1 is not supported"}},
      {R"(["a", "b"])", R"(["a", "zz"])", {"model.merges[0] names \"zz\", which is not in"}},
      {R"("ab": 2)", R"("abc": 2)", {"model.merges[0] makes \"ab\", which is not in"}},
      {R"("b": 1)", R"("b": -1)", {"model.vocab[\"b\"] -1 is not an id"}},
      {R"("decoder": {"type": "ByteLevel"})",
       R"("decoder": {"type": "WordPiece"})",
       {"decoder of type \"WordPiece\" is not supported"}},
      {R"("special": true)",
       R"("special": true, "single_word": true)",
       {"added_tokens[0].single_word true is not supported"}},
      {R"("model": {)", R"("model": [{)", {"is not a JSON object"}},
      {R"("merges")", "\"merges\xff\"", {"test.json is not UTF-8 (byte offset"}},
  };
  for (const auto& c : cases) {
    const std::string json = absl::StrReplaceAll(kMinimal, {{c.from, c.to}});
    ASSERT_NE(json, kMinimal) << c.from;
    const absl::Status status = LoadError(json);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.to;
    for (const std::string& part : c.message) EXPECT_THAT(status.message(), HasSubstr(part));
    // Messages are UTF-8 whatever the file held: no raw 0xff echoed.
    EXPECT_FALSE(absl::StrContains(status.message(), "\xff")) << status;
  }
  EXPECT_THAT(LoadError("{\"model\": ").message(), HasSubstr("test.json is not a JSON object"));
}

TEST(TokenizerTest, FromFileNamesTheFile) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tok.status().message(), HasSubstr("/nonexistent/tokenizer.json"));
}

}  // namespace
}  // namespace baton
