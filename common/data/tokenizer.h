// Byte-level BPE tokenizers read from Hugging Face `tokenizer.json` files, encoding and
// decoding as the `tokenizers` library does (encode(text, add_special_tokens=False).ids,
// decode(ids, skip_special_tokens=False)).
//
// Read: model.type "BPE" (merges as ["a b", ...] or [["a", "b"], ...]; unk_token, fuse_unk
// and ignore_merges honoured; dropout must be null, byte_fallback false,
// continuing_subword_prefix and end_of_word_suffix null or "") behind a pre_tokenizer that is
// ByteLevel or a Sequence of Split steps (Regex or String pattern, any behavior, invert) and
// exactly one ByteLevel. That covers GPT-2, what scripts/prepare-data.py trains, and
// LLaMA-3 / Qwen-style files. The normalizer must be null or absent; the decoder ByteLevel
// (alone or as the one step of a Sequence) or null (tokens joined by spaces, as `tokenizers`
// does). post_processor, truncation and padding are ignored: Encode adds no special tokens
// and returns every id. Everything else (WordPiece, Unigram, Metaspace / SentencePiece-style
// files such as LLaMA-2's, normalizers) is refused with INVALID_ARGUMENT naming the field.
//
// added_tokens (special or not) are found in the text before pre-tokenization, leftmost
// longest match first (those with normalized false, then those with normalized true in what
// is left), and become their ids; lstrip and rstrip are honoured, single_word true is
// refused. An added token's id is the one `tokenizers` gives it: its model.vocab id when it
// is there, else the next free id after the vocabulary (the file's "id" normally agrees).
//
// Regexes run with PCRE2 in UTF + UCP mode where `tokenizers` uses Oniguruma, \s and \S read
// as Oniguruma's (Unicode White_Space); the patterns of the files above mean the same in both.
// Unicode property tables may differ for characters newer than PCRE2's Unicode version, and
// patterns using \w, \b or \h (hex digit in Oniguruma) could differ.
//
// A Tokenizer is immutable after construction; copies share its tables. Every method may be
// called from any number of threads at once. Nothing is cached across calls.
#ifndef BATON_COMMON_DATA_TOKENIZER_H_
#define BATON_COMMON_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

class Tokenizer {
 public:
  // The largest tokenizer.json read (LLaMA-3's is about 9 MB).
  static constexpr int64_t kMaxFileBytes = int64_t{64} << 20;

  // Reads a tokenizer.json of at most kMaxFileBytes. File errors as ReadFile's (file.h);
  // INVALID_ARGUMENT naming the file and the field for what is malformed or not supported.
  static absl::StatusOr<Tokenizer> FromFile(const std::string& path);
  // The same from the file's text; `where` names it in errors (a path, "inline JSON").
  static absl::StatusOr<Tokenizer> FromJson(const std::string& json, const std::string& where);

  // The ids of `text` with no special tokens added. INVALID_ARGUMENT when `text` is not
  // valid UTF-8 (naming the byte offset); RESOURCE_EXHAUSTED if a pre-tokenizer regex runs
  // out of its match limits on pathological text.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  // The text of `ids`, special tokens included; bytes that do not form UTF-8 become U+FFFD
  // as in `tokenizers`. INVALID_ARGUMENT naming the first id that is in neither the
  // vocabulary nor added_tokens (`tokenizers` would silently skip it).
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;

  // Distinct tokens, added tokens included (tokenizers' get_vocab_size()). Ids may have
  // gaps, so an embedding needs max_id() + 1 rows.
  int32_t vocab_size() const;
  int32_t max_id() const;
  // The id of a vocabulary or added token, by its text as written in the file (byte-level
  // form: " the" is "Ġthe").
  std::optional<int32_t> TokenId(const std::string& token) const;

 private:
  struct Impl;  // tokenizer.cc
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace baton

#endif  // BATON_COMMON_DATA_TOKENIZER_H_
