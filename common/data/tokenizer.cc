#include "common/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/core/file.h"
#include "common/core/log_text.h"
#include "common/core/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// What ByteLevel splits with when use_regex is true (GPT-2's pattern).
constexpr char kByteLevelPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: byte b is written as the character kByteChar[b] (printable bytes
// as themselves, the other 68 as U+0100, U+0101, ... in byte order).
constexpr std::array<char32_t, 256> MakeByteChars() {
  std::array<char32_t, 256> out{};
  char32_t next = 256;
  for (char32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    out[b] = printable ? b : next++;
  }
  return out;
}
constexpr std::array<char32_t, 256> kByteChar = MakeByteChars();

// At the start of non-empty `s`: the length of a well-formed UTF-8 character, or minus the
// length of the maximal ill-formed subpart (Unicode's rule, as Rust's from_utf8_lossy).
int Utf8Step(absl::string_view s) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    lo = c == 0xe0 ? 0xa0 : lo;
    hi = c == 0xed ? 0x9f : hi;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    lo = c == 0xf0 ? 0x90 : lo;
    hi = c == 0xf4 ? 0x8f : hi;
  } else {
    return -1;
  }
  for (int i = 1; i < n; ++i) {
    if (static_cast<size_t>(i) >= s.size() || at(i) < (i == 1 ? lo : 0x80) ||
        at(i) > (i == 1 ? hi : 0xbf)) {
      return -i;
    }
  }
  return n;
}

// The character at the start of `s`, which is well-formed UTF-8.
char32_t CodePoint(absl::string_view s) {
  const int n = std::max(Utf8Step(s), 1);
  const auto at = [&](int i) { return static_cast<char32_t>(static_cast<unsigned char>(s[i])); };
  char32_t c = n == 1 ? at(0) : at(0) & (0x7f >> n);
  for (int i = 1; i < n; ++i) c = (c << 6) | (at(i) & 0x3f);
  return c;
}

// The byte offset of the first ill-formed UTF-8 in `s`, or -1.
int64_t FirstBadUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = Utf8Step(s.substr(i));
    if (n < 0) return static_cast<int64_t>(i);
    i += static_cast<size_t>(n);
  }
  return -1;
}

// Rust's char::is_whitespace (Unicode White_Space), for added tokens' lstrip and rstrip.
bool IsWhitespace(char32_t c) {
  return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

// Oniguruma's \s (what tokenizers' patterns mean) is Unicode White_Space; PCRE2's also
// matches U+180E. So `pattern` with \s and \S written as the property.
std::string OnigWhitespace(absl::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
    } else if (const char c = pattern[++i]; c == 's' || c == 'S') {
      out += c == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
    } else {
      out += {'\\', c};
    }
  }
  return out;
}

// `pattern` compiled for UTF-8 (a regex in UCP mode, JIT-compiled where PCRE2 can); errors
// name `field`.
absl::StatusOr<std::shared_ptr<pcre2_code>> Compile(const std::string& pattern, bool literal,
                                                    const std::string& where,
                                                    const std::string& field) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  std::shared_ptr<pcre2_code> code;
  // PCRE2 before 10.40 has no \p{White_Space}: there, its own \s.
  for (const std::string& text : {literal ? pattern : OnigWhitespace(pattern), pattern}) {
    code.reset(
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                      PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &error, &offset, nullptr),
        pcre2_code_free);
    if (code != nullptr) break;
  }
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", field, " does not compile: ", reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);  // the interpreter runs without it
  return code;
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
constexpr std::pair<const char*, Behavior> kBehaviors[] = {
    {"Removed", Behavior::kRemoved},
    {"Isolated", Behavior::kIsolated},
    {"MergedWithPrevious", Behavior::kMergedWithPrevious},
    {"MergedWithNext", Behavior::kMergedWithNext},
    {"Contiguous", Behavior::kContiguous}};

// One pre-tokenization step, applied to every piece: ByteLevel is kPrefixSpace (when
// add_prefix_space), a kSplit with kByteLevelPattern (when use_regex), then kBytes.
struct Step {
  enum Kind { kPrefixSpace, kSplit, kBytes };
  explicit Step(Kind k) : kind(k) {}
  Kind kind;
  std::shared_ptr<pcre2_code> regex;  // kSplit's; matched concurrently, never changed
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  std::string field;  // where the pattern is in the file, for errors
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, normalized;
};

struct Segment {
  absl::string_view text;
  int32_t id;  // an added token's, or -1 for text to pre-tokenize
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
}

// Reads the members of one JSON object; errors name the file and `path`.member.
class Object {
 public:
  Object(const std::string& where, const Struct& s, std::string path)
      : where_(where), s_(s), path_(std::move(path)) {}

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", Field(key), " ", what));
  }
  std::string Field(absl::string_view key) const {
    return key.empty() ? path_ : path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  }
  // A value, for messages: a string quoted, an object by its "type".
  static std::string Show(const Value& v) {
    if (v.has_string_value()) return absl::StrCat("\"", EchoInput(v.string_value()), "\"");
    if (v.has_number_value()) return absl::StrFormat("%g", v.number_value());
    if (v.has_bool_value()) return v.bool_value() ? "true" : "false";
    if (v.has_list_value()) return "(a list)";
    if (!v.has_struct_value()) return "null";
    const Value* type = Get(v.struct_value(), "type");
    return type == nullptr ? "(an object)" : absl::StrCat("of type ", Show(*type));
  }
  // The member `key` of `s`; nullptr when absent or null.
  static const Value* Get(const Struct& s, const std::string& key) {
    const auto it = s.fields().find(key);
    return it == s.fields().end() || it->second.has_null_value() ? nullptr : &it->second;
  }
  const Value* Get(const std::string& key) const { return Get(s_, key); }

  absl::StatusOr<bool> Bool(const std::string& key, bool if_absent) const {
    const Value* v = Get(key);
    if (v != nullptr && !v->has_bool_value()) return Error(key, "must be true or false");
    return v == nullptr ? if_absent : v->bool_value();
  }
  absl::StatusOr<std::optional<std::string>> String(const std::string& key) const {
    const Value* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->has_string_value()) return Error(key, "must be a string");
    return v->string_value();
  }
  absl::StatusOr<Object> Member(const std::string& key) const {
    const Value* v = Get(key);
    if (v == nullptr) return Error(key, "is missing");
    if (!v->has_struct_value()) return Error(key, "must be an object");
    return Object(where_, v->struct_value(), Field(key));
  }
  absl::StatusOr<const ListValue*> List(const std::string& key) const {
    const Value* v = Get(key);
    if (v == nullptr) return Error(key, "is missing");
    if (!v->has_list_value()) return Error(key, "must be a list");
    return &v->list_value();
  }
  // The objects of the list `key`, named key[i].
  absl::StatusOr<std::vector<Object>> Objects(const std::string& key) const {
    BATON_ASSIGN_OR_RETURN(const ListValue* list, List(key));
    std::vector<Object> out;
    for (int i = 0; i < list->values_size(); ++i) {
      const std::string item = absl::StrCat(Field(key), "[", i, "]");
      if (!list->values(i).has_struct_value())
        return Object(where_, s_, item).Error("", "must be an object");
      out.emplace_back(where_, list->values(i).struct_value(), item);
    }
    return out;
  }
  const Struct& fields() const { return s_; }

 private:
  const std::string& where_;
  const Struct& s_;
  std::string path_;
};

}  // namespace

struct Tokenizer::Impl {
  std::string where;
  absl::flat_hash_map<std::string, int32_t> vocab;
  absl::flat_hash_map<int32_t, std::string> vocab_r;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // PairKey -> (rank, id)
  std::optional<int32_t> unk;
  bool fuse_unk = false, ignore_merges = false;
  std::vector<AddedToken> added;
  absl::flat_hash_map<std::string, int32_t> added_ids;
  absl::flat_hash_map<int32_t, std::string> added_r;
  // Per normalized flag and first byte: indices into `added`, longest content first.
  std::array<std::array<std::vector<int>, 256>, 2> added_by_byte;
  std::vector<Step> steps;
  bool byte_level_decoder = false;
  std::array<std::string, 256> byte_text;  // kByteChar in UTF-8
  absl::flat_hash_map<std::string, char> text_byte;
  int32_t vocab_size = 0, max_id = -1;

  absl::Status ReadModel(const Object& model);
  absl::Status ReadAddedTokens(const Object& root);
  absl::Status ReadPreTokenizer(const Object& p, int* byte_levels);
  void FindAdded(absl::string_view s, bool normalized, std::vector<Segment>* out) const;
  absl::Status Split(const Step& step, absl::string_view s, std::vector<std::string>* out) const;
  void Bpe(const std::string& word, std::vector<int32_t>* out) const;
  const std::pair<int32_t, int32_t>* Merge(int32_t a, int32_t b) const {
    const auto it = merges.find(PairKey(a, b));
    return it == merges.end() ? nullptr : &it->second;
  }
};

absl::Status Tokenizer::Impl::ReadModel(const Object& model) {
  BATON_ASSIGN_OR_RETURN(const std::optional<std::string> type, model.String("type"));
  if (!type.has_value() && model.Get("merges") == nullptr) return model.Error("type", "is missing");
  if (type.has_value() && *type != "BPE") {
    return model.Error("type", absl::StrCat("\"", EchoInput(*type),
                                            "\" is not supported: baton reads byte-level BPE "
                                            "tokenizers (\"BPE\")"));
  }
  if (const Value* dropout = model.Get("dropout"); dropout != nullptr) {
    return model.Error("dropout", absl::StrCat(Object::Show(*dropout),
                                               " is not supported (only null: BPE-dropout is "
                                               "for training)"));
  }
  BATON_ASSIGN_OR_RETURN(fuse_unk, model.Bool("fuse_unk", false));
  BATON_ASSIGN_OR_RETURN(ignore_merges, model.Bool("ignore_merges", false));
  BATON_ASSIGN_OR_RETURN(const bool byte_fallback, model.Bool("byte_fallback", false));
  if (byte_fallback) return model.Error("byte_fallback", "true is not supported");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    BATON_ASSIGN_OR_RETURN(const std::optional<std::string> text, model.String(affix));
    if (!text.value_or("").empty())
      return model.Error(affix, "is not supported (only \"\" or null)");
  }

  BATON_ASSIGN_OR_RETURN(const Object v, model.Member("vocab"));
  vocab.reserve(v.fields().fields_size());
  vocab_r.reserve(v.fields().fields_size());
  for (const auto& [token, value] : v.fields().fields()) {
    const double d = value.number_value();
    const bool is_id = value.has_number_value() && d >= 0 && d == std::floor(d) &&
                       d <= std::numeric_limits<int32_t>::max();
    const int32_t id = is_id ? static_cast<int32_t>(d) : -1;
    if (!is_id || !vocab_r.emplace(id, token).second) {
      const std::string key = absl::StrCat("[\"", EchoInput(token), "\"]");
      return model.Error(
          absl::StrCat("vocab", key),
          !is_id ? absl::StrCat(Object::Show(value), " is not an id (an integer in [0, 2^31))")
                 : absl::StrCat("has id ", id, ", as \"", EchoInput(vocab_r[id]), "\" has"));
    }
    vocab.emplace(token, id);
    max_id = std::max(max_id, id);
  }
  BATON_ASSIGN_OR_RETURN(const std::optional<std::string> unk_token, model.String("unk_token"));
  if (unk_token.has_value()) {
    const auto it = vocab.find(*unk_token);
    if (it == vocab.end()) return model.Error("unk_token", "is not in model.vocab");
    unk = it->second;
  }

  BATON_ASSIGN_OR_RETURN(const ListValue* m, model.List("merges"));
  merges.reserve(m->values_size());
  for (int i = 0; i < m->values_size(); ++i) {
    const Value& merge = m->values(i);
    // ["a", "b"], or "a b" as older files write it.
    const auto& pair = merge.list_value().values();
    const size_t space = merge.string_value().find(' ');
    const bool is_pair =
        pair.size() == 2 && pair[0].has_string_value() && pair[1].has_string_value();
    if (!is_pair && (space == std::string::npos ||
                     merge.string_value().find(' ', space + 1) != std::string::npos)) {
      return model.Error(absl::StrCat("merges[", i, "]"), "is not [\"a\", \"b\"] or \"a b\"");
    }
    const std::string a = is_pair ? pair[0].string_value() : merge.string_value().substr(0, space);
    const std::string b = is_pair ? pair[1].string_value() : merge.string_value().substr(space + 1);
    const auto ia = vocab.find(a), ib = vocab.find(b), ij = vocab.find(a + b);
    const std::string* missing = ia == vocab.end() ? &a : ib == vocab.end() ? &b : nullptr;
    if (missing != nullptr || ij == vocab.end()) {
      return model.Error(absl::StrCat("merges[", i, "]"),
                         absl::StrCat(missing != nullptr ? "names \"" : "makes \"",
                                      EchoInput(missing != nullptr ? *missing : a + b),
                                      "\", which is not in model.vocab"));
    }
    // A pair listed twice keeps its last rank, as in tokenizers.
    merges.insert_or_assign(PairKey(ia->second, ib->second), std::make_pair(i, ij->second));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ReadAddedTokens(const Object& root) {
  if (root.Get("added_tokens") == nullptr) return absl::OkStatus();
  BATON_ASSIGN_OR_RETURN(const std::vector<Object> list, root.Objects("added_tokens"));
  const int32_t model_size = static_cast<int32_t>(vocab.size());
  int32_t added_max = -1;
  for (const Object& t : list) {
    AddedToken token;
    BATON_ASSIGN_OR_RETURN(const std::optional<std::string> content, t.String("content"));
    if (content.value_or("").empty()) return t.Error("content", "is missing");
    token.content = *content;
    BATON_ASSIGN_OR_RETURN(const bool special, t.Bool("special", false));
    BATON_ASSIGN_OR_RETURN(token.normalized, t.Bool("normalized", !special));
    BATON_ASSIGN_OR_RETURN(token.lstrip, t.Bool("lstrip", false));
    BATON_ASSIGN_OR_RETURN(token.rstrip, t.Bool("rstrip", false));
    BATON_ASSIGN_OR_RETURN(const bool single_word, t.Bool("single_word", false));
    if (single_word) return t.Error("single_word", "true is not supported");
    if (added_ids.contains(token.content)) {
      return t.Error("content", absl::StrCat("\"", EchoInput(token.content), "\" is repeated"));
    }
    // The id tokenizers gives it (AddedVocabulary::add_tokens), whatever the file's "id" says.
    if (const auto it = vocab.find(token.content); it != vocab.end()) {
      token.id = it->second;
    } else {
      token.id =
          added_max < 0 || (added_max < model_size && model_size > 0) ? model_size : added_max + 1;
    }
    added_max = std::max(added_max, token.id);
    max_id = std::max(max_id, token.id);
    added_ids.emplace(token.content, token.id);
    added_r.insert_or_assign(token.id, token.content);
    added.push_back(std::move(token));
  }
  for (int i = 0; i < static_cast<int>(added.size()); ++i) {
    const unsigned char first = static_cast<unsigned char>(added[i].content[0]);
    added_by_byte[added[i].normalized ? 1 : 0][first].push_back(i);
  }
  for (auto& table : added_by_byte) {
    for (std::vector<int>& candidates : table) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](int x, int y) {
        return added[x].content.size() > added[y].content.size();
      });
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ReadPreTokenizer(const Object& p, int* byte_levels) {
  BATON_ASSIGN_OR_RETURN(const std::optional<std::string> type, p.String("type"));
  Step split(Step::kSplit);
  if (type == "Sequence") {
    BATON_ASSIGN_OR_RETURN(const std::vector<Object> list, p.Objects("pretokenizers"));
    for (const Object& item : list) BATON_RETURN_IF_ERROR(ReadPreTokenizer(item, byte_levels));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    ++*byte_levels;
    BATON_ASSIGN_OR_RETURN(const bool prefix_space, p.Bool("add_prefix_space", true));
    BATON_ASSIGN_OR_RETURN(const bool use_regex, p.Bool("use_regex", true));
    if (prefix_space) steps.emplace_back(Step::kPrefixSpace);
    if (use_regex) {
      split.field = "the ByteLevel pattern";
      BATON_ASSIGN_OR_RETURN(split.regex, Compile(kByteLevelPattern, false, where, split.field));
      steps.push_back(std::move(split));
    }
    steps.emplace_back(Step::kBytes);
    return absl::OkStatus();
  } else if (type != "Split") {
    return p.Error("", absl::StrCat("of type \"", EchoInput(type.value_or("")),
                                    "\" is not supported: baton reads ByteLevel, Split and "
                                    "Sequence pre-tokenizers"));
  }
  BATON_ASSIGN_OR_RETURN(const Object pattern, p.Member("pattern"));
  BATON_ASSIGN_OR_RETURN(const std::optional<std::string> regex, pattern.String("Regex"));
  BATON_ASSIGN_OR_RETURN(const std::optional<std::string> literal, pattern.String("String"));
  if (regex.has_value() == literal.has_value()) {
    return pattern.Error("", "must have one of Regex and String");
  }
  split.field = pattern.Field(regex.has_value() ? "Regex" : "String");
  BATON_ASSIGN_OR_RETURN(split.regex, Compile(regex.value_or(literal.value_or("")),
                                              !regex.has_value(), where, split.field));
  BATON_ASSIGN_OR_RETURN(split.invert, p.Bool("invert", false));
  BATON_ASSIGN_OR_RETURN(const std::optional<std::string> behavior, p.String("behavior"));
  const auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                               [&](const auto& b) { return behavior == b.first; });
  if (it == std::end(kBehaviors)) {
    return p.Error("behavior", absl::StrCat("\"", EchoInput(behavior.value_or("")),
                                            "\" is not a Split behavior"));
  }
  split.behavior = it->second;
  steps.push_back(std::move(split));
  return absl::OkStatus();
}

// Splits `s` at the added tokens of the `normalized` kind, as tokenizers' AddedVocabulary
// does: leftmost-longest matches, lstrip and rstrip taking whitespace along.
void Tokenizer::Impl::FindAdded(absl::string_view s, bool normalized,
                                std::vector<Segment>* out) const {
  const auto& table = added_by_byte[normalized ? 1 : 0];
  size_t done = 0;  // s[0, done) is in `out`
  for (size_t i = 0; i < s.size();) {
    const AddedToken* hit = nullptr;
    for (const int k : table[static_cast<unsigned char>(s[i])]) {
      if (absl::StartsWith(s.substr(i), added[k].content)) {
        hit = &added[k];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    while (hit->lstrip && start > done) {
      size_t prev = start - 1;
      while (prev > done && (static_cast<unsigned char>(s[prev]) & 0xc0) == 0x80) --prev;
      if (!IsWhitespace(CodePoint(s.substr(prev)))) break;
      start = prev;
    }
    while (hit->rstrip && stop < s.size() && IsWhitespace(CodePoint(s.substr(stop)))) {
      stop += static_cast<size_t>(Utf8Step(s.substr(stop)));
    }
    if (done < start) out->push_back({s.substr(done, start - done), -1});
    out->push_back({s.substr(start, stop - start), hit->id});
    done = i = stop;
  }
  if (done < s.size()) out->push_back({s.substr(done), -1});
}

// The non-empty pieces of `s` that a split step keeps, as tokenizers' split with a
// SplitDelimiterBehavior, the matches found as Oniguruma's find_iter finds them.
absl::Status Tokenizer::Impl::Split(const Step& step, absl::string_view s,
                                    std::vector<std::string>* out) const {
  struct Span {
    size_t begin, end;
    bool match;
  };
  std::vector<Span> spans;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
  if (md == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  size_t at = 0, prev = 0;
  std::optional<size_t> last_end;
  while (at <= s.size()) {
    const int rc = pcre2_match(step.regex.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(),
                               at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::ResourceExhaustedError(absl::StrCat(
          where, ": ", step.field, " failed: ", reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0], end = std::max(ov[0], ov[1]);
    if (begin == end && last_end == end) {  // no empty match right after a match
      at += at < s.size() ? static_cast<size_t>(Utf8Step(s.substr(at))) : 1;
      continue;
    }
    if (prev != begin) spans.push_back({prev, begin, false});
    spans.push_back({begin, end, true});
    at = prev = end;
    last_end = end;
  }
  if (prev != s.size()) spans.push_back({prev, s.size(), false});
  for (Span& span : spans) span.match = span.match != step.invert;
  const Behavior b = step.behavior;
  const bool backwards = b == Behavior::kMergedWithNext;
  if (backwards) std::reverse(spans.begin(), spans.end());
  std::vector<Span> kept;  // match now means "removed"
  bool previous_match = false;
  for (const Span& span : spans) {
    bool merge = span.match && !previous_match;  // kMergedWithPrevious, kMergedWithNext
    if (b == Behavior::kContiguous) merge = span.match == previous_match;
    if (b == Behavior::kIsolated || b == Behavior::kRemoved) merge = false;
    if (merge && !kept.empty()) {
      (backwards ? kept.back().begin : kept.back().end) = backwards ? span.begin : span.end;
    } else {
      kept.push_back({span.begin, span.end, b == Behavior::kRemoved && span.match});
    }
    previous_match = span.match;
  }
  if (backwards) std::reverse(kept.begin(), kept.end());
  for (const Span& span : kept) {
    if (!span.match && span.end > span.begin)
      out->emplace_back(s.substr(span.begin, span.end - span.begin));
  }
  return absl::OkStatus();
}

// The ids of one pre-tokenized word: tokenizers' BPE::merge_word and Word::merge_all
// (lowest rank first, the leftmost of equal ranks).
void Tokenizer::Impl::Bpe(const std::string& word, std::vector<int32_t>* out) const {
  if (ignore_merges) {
    if (const auto it = vocab.find(word); it != vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int prev, next;
    size_t len;  // bytes of `word`; 0 once merged into the symbol on its left
  };
  std::vector<Symbol> sym;
  const auto add = [&](int32_t id, size_t len) {
    const int n = static_cast<int>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };
  int32_t unk_id = -1;  // an unknown character's, pending (with fuse_unk, a run's)
  size_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    const size_t n = static_cast<size_t>(std::max(Utf8Step(absl::string_view(word).substr(i)), 1));
    const auto it = vocab.find(absl::string_view(word).substr(i, n));
    i += n;
    if (it != vocab.end()) {
      if (unk_id >= 0) add(unk_id, unk_len);
      unk_id = -1;
      add(it->second, n);
      continue;
    }
    if (!unk.has_value()) continue;  // dropped, as tokenizers drops it
    if (unk_id >= 0 && fuse_unk) {
      unk_len += n;
    } else {
      if (unk_id >= 0) add(unk_id, unk_len);
      unk_id = *unk;
      unk_len = n;
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  struct Candidate {
    int pos;
    int32_t rank, new_id;
  };
  const auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  const auto push = [&](int pos, int next) {
    if (const auto* m = Merge(sym[pos].id, sym[next].id)) queue.push({pos, m->first, m->second});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push(i, i + 1);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = sym[cur.next];
    const auto* m = Merge(cur.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;  // a stale candidate
    sym[cur.next].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, top.pos);
    if (cur.next >= 0) push(top.pos, cur.next);
  }
  for (const Symbol& s : sym) {
    if (s.len != 0) out->push_back(s.id);
  }
}

absl::StatusOr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(
      const std::string json,
      ReadFile(path, {.what = "tokenizer", .max_bytes = kMaxFileBytes, .regular_only = true}));
  return FromJson(json, absl::StrCat("'", path, "'"));
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(const std::string& json, const std::string& where) {
  auto impl = std::make_shared<Impl>();
  impl->where = EchoInput(where);
  if (const int64_t bad = FirstBadUtf8(json); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl->where, " is not UTF-8 (byte offset ", bad, ")"));
  }
  Struct root_struct;
  if (const auto st = google::protobuf::util::JsonStringToMessage(json, &root_struct); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        impl->where, " is not a JSON object: ",
        EchoInput(std::string(st.message().data(), st.message().size()), 2 * kMaxEchoBytes)));
  }
  const Object root(impl->where, root_struct, "");
  if (const Value* n = root.Get("normalizer"); n != nullptr) {
    return root.Error("normalizer", absl::StrCat(Object::Show(*n),
                                                 " is not supported: baton reads tokenizers "
                                                 "whose normalizer is null"));
  }
  BATON_ASSIGN_OR_RETURN(const Object model, root.Member("model"));
  BATON_RETURN_IF_ERROR(impl->ReadModel(model));
  BATON_RETURN_IF_ERROR(impl->ReadAddedTokens(root));

  const std::string byte_level_only = "baton reads byte-level BPE tokenizers";
  if (root.Get("pre_tokenizer") == nullptr) {
    return root.Error("pre_tokenizer", "is null: " + byte_level_only);
  }
  BATON_ASSIGN_OR_RETURN(const Object pre, root.Member("pre_tokenizer"));
  int byte_levels = 0;
  BATON_RETURN_IF_ERROR(impl->ReadPreTokenizer(pre, &byte_levels));
  if (byte_levels != 1) {
    return root.Error(
        "pre_tokenizer",
        absl::StrCat("has ", byte_levels, " ByteLevel steps, not one: ", byte_level_only));
  }

  // The decoder: ByteLevel, alone or as the one step of a Sequence, or null.
  const Value* d = root.Get("decoder");
  const Value* list = d != nullptr ? Object::Get(d->struct_value(), "decoders") : nullptr;
  const bool one = list != nullptr && list->list_value().values_size() == 1 &&
                   Object::Show(*d) == "of type \"Sequence\"";
  const std::string decoder =
      d == nullptr ? "null" : Object::Show(one ? list->list_value().values(0) : *d);
  if (decoder != "null" && decoder != "of type \"ByteLevel\"") {
    return root.Error("decoder", absl::StrCat(Object::Show(*d),
                                              " is not supported: baton "
                                              "decodes with ByteLevel (or null)"));
  }
  impl->byte_level_decoder = decoder != "null";
  for (int b = 0; b < 256; ++b) {  // kByteChar is below U+0800: one or two UTF-8 bytes
    const char32_t c = kByteChar[b];
    impl->byte_text[b] = c < 0x80 ? std::string(1, static_cast<char>(c))
                                  : std::string{static_cast<char>(0xc0 | (c >> 6)),
                                                static_cast<char>(0x80 | (c & 0x3f))};
    impl->text_byte.emplace(impl->byte_text[b], static_cast<char>(b));
  }
  impl->vocab_size = static_cast<int32_t>(impl->vocab.size());
  for (const AddedToken& t : impl->added)
    impl->vocab_size += impl->vocab.contains(t.content) ? 0 : 1;
  return Tokenizer(std::move(impl));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(const std::string& text) const {
  const Impl& m = *impl_;
  if (const int64_t bad = FirstBadUtf8(text); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("text to encode is not UTF-8 (byte offset ", bad, ")"));
  }
  // Added tokens that are not normalized first, then normalized ones in the text between.
  std::vector<Segment> outer, segments;
  m.FindAdded(text, /*normalized=*/false, &outer);
  for (const Segment& s : outer) {
    if (s.id < 0) {
      m.FindAdded(s.text, /*normalized=*/true, &segments);
    } else {
      segments.push_back(s);
    }
  }
  std::vector<int32_t> ids;
  std::vector<std::string> pieces, next;
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    pieces.assign(1, std::string(segment.text));
    for (const Step& step : m.steps) {
      next.clear();
      for (std::string& piece : pieces) {  // never empty
        if (step.kind == Step::kSplit) {
          BATON_RETURN_IF_ERROR(m.Split(step, piece, &next));
          continue;
        }
        std::string mapped;
        if (step.kind == Step::kPrefixSpace) {
          mapped = piece[0] == ' ' ? piece : " " + piece;
        } else {
          for (const char c : piece) mapped += m.byte_text[static_cast<unsigned char>(c)];
        }
        next.push_back(std::move(mapped));
      }
      pieces.swap(next);
    }
    for (const std::string& word : pieces) m.Bpe(word, &ids);
  }
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* token = nullptr;
    if (const auto it = m.added_r.find(ids[i]); it != m.added_r.end()) {
      token = &it->second;
    } else if (const auto it = m.vocab_r.find(ids[i]); it != m.vocab_r.end()) {
      token = &it->second;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", ids[i], " (ids[", i, "]) is not a token of ", m.where));
    }
    if (!m.byte_level_decoder) {  // tokenizers joins the tokens with spaces
      absl::StrAppend(&bytes, i > 0 ? " " : "", *token);
      continue;
    }
    // A token of byte characters is those bytes; any other (an added token) is its text.
    std::string decoded;
    for (size_t j = 0, n = 0; j < token->size(); j += n) {
      n = static_cast<size_t>(std::max(Utf8Step(absl::string_view(*token).substr(j)), 1));
      const auto it = m.text_byte.find(absl::string_view(*token).substr(j, n));
      if (it == m.text_byte.end()) {
        decoded = *token;
        break;
      }
      decoded += it->second;
    }
    bytes += decoded;
  }
  std::string out;  // `bytes` with each maximal ill-formed subpart replaced by U+FFFD
  for (size_t i = 0; i < bytes.size();) {
    const int n = Utf8Step(absl::string_view(bytes).substr(i));
    out.append(n > 0 ? bytes.substr(i, n) : "\xef\xbf\xbd");
    i += static_cast<size_t>(std::abs(n));
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

int32_t Tokenizer::max_id() const { return impl_->max_id; }

std::optional<int32_t> Tokenizer::TokenId(const std::string& token) const {
  if (const auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

}  // namespace baton
