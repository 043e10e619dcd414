// TextDataset: character-level text for the gpt. See dataset.h for the sampling scheme.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/log_text.h"
#include "common/core/rng.h"
#include "common/core/status.h"
#include "common/data/dataset.h"

namespace baton {
namespace {

std::string StepStreamName(int64_t step) { return "data/text/step/" + std::to_string(step); }

}  // namespace

absl::StatusOr<std::unique_ptr<TextDataset>> TextDataset::Create(std::string text,
                                                                 const Options& options) {
  if (options.context < 1 || options.vocab_size < 1 || options.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text dataset: sizes must be at least 1 (context=", options.context,
        ", vocab_size=", options.vocab_size, ", batch_size=", options.batch_size, ")"));
  }
  const std::string in_source =
      options.source.empty() ? std::string()
                             : absl::StrCat(" in '", EchoInput(options.source), "'");
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(options.field, ": empty text", in_source));
  }
  const int64_t len = static_cast<int64_t>(text.size());
  if (len <= options.context + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.field, ": the text", in_source, " has ", len,
        " bytes; model.gpt.context=", options.context, " needs more than ", options.context + 1));
  }

  std::array<bool, 256> present{};
  for (unsigned char c : text) present[c] = true;
  std::array<uint8_t, 256> rank{};
  std::string alphabet;
  for (int b = 0; b < 256; ++b) {
    if (!present[b]) continue;
    rank[b] = static_cast<uint8_t>(alphabet.size());
    alphabet.push_back(static_cast<char>(b));
  }
  const int64_t distinct = static_cast<int64_t>(alphabet.size());
  if (options.vocab_size < distinct) {
    return absl::InvalidArgumentError(absl::StrCat("model.gpt.vocab_size: ", options.vocab_size,
                                                   " is smaller than the ", distinct,
                                                   " distinct characters of the text", in_source));
  }

  std::vector<uint8_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = rank[static_cast<unsigned char>(text[i])];
  return std::unique_ptr<TextDataset>(
      new TextDataset(std::move(alphabet), std::move(ids), options));
}

TextDataset::TextDataset(std::string alphabet, std::vector<uint8_t> ids, const Options& options)
    : alphabet_(std::move(alphabet)), ids_(std::move(ids)), options_(options) {}

int64_t TextDataset::SampleOffset(int64_t step, int64_t index) const {
  const RngStream rng(options_.seed, StepStreamName(step));
  return static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(index),
                                             static_cast<uint64_t>(text_bytes() - context())));
}

absl::StatusOr<Batch> TextDataset::Get(int64_t step, int64_t first, int64_t count) const {
  BATON_RETURN_IF_ERROR(data_internal::CheckRange(step, first, count, options_.batch_size));
  const int64_t T = options_.context;
  Batch batch;
  BATON_ASSIGN_OR_RETURN(batch.inputs, Tensor::TryEmpty({count, T}, DType::kInt32));
  BATON_ASSIGN_OR_RETURN(batch.targets, Tensor::TryEmpty({count, T}, DType::kInt32));
  int32_t* inputs = batch.inputs.i32();
  int32_t* targets = batch.targets.i32();
  const RngStream rng(options_.seed, StepStreamName(step));
  const uint64_t bound = static_cast<uint64_t>(text_bytes() - T);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t offset =
        static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(first + k), bound));
    const uint8_t* sample = ids_.data() + offset;  // T + 1 ids
    for (int64_t t = 0; t < T; ++t) {
      inputs[k * T + t] = sample[t];
      targets[k * T + t] = sample[t + 1];
    }
  }
  return batch;
}

std::string TextDataset::Describe() const {
  const std::string source = options_.source.empty() ? "inline text" : options_.source;
  return absl::StrCat("text: ", text_bytes(), " bytes from ", source, ", ", num_chars(),
                      " distinct characters (vocab ", options_.vocab_size, "), context ",
                      options_.context, ", batch ", options_.batch_size, ", seed ", options_.seed);
}

std::string TextDataset::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) out.push_back(id >= 0 && id < num_chars() ? alphabet_[id] : '?');
  return out;
}

absl::StatusOr<std::vector<int32_t>> TextDataset::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    auto it = std::lower_bound(alphabet_.begin(), alphabet_.end(), c, [](char a, char b) {
      return static_cast<unsigned char>(a) < static_cast<unsigned char>(b);
    });
    if (it == alphabet_.end() || *it != c) {
      return absl::InvalidArgumentError(
          absl::StrCat("byte ", static_cast<int>(static_cast<unsigned char>(c)), " at position ", i,
                       " is not in the text's alphabet"));
    }
    out.push_back(static_cast<int32_t>(it - alphabet_.begin()));
  }
  return out;
}

}  // namespace baton
