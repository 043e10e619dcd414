#include "common/data/dataset.h"

#include "common/core/file.h"
#include "common/core/log_text.h"
#include "common/core/paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/core/status.h"
#include "common/spec/spec.h"

namespace baton {
namespace data_internal {

absl::Status CheckRange(int64_t step, int64_t first, int64_t count, int64_t batch_size) {
  if (step < 0 || first < 0 || count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset: bad request step=", step, " first=", first, " count=", count));
  }
  if (count > batch_size || first > batch_size - count) {
    return absl::OutOfRangeError(absl::StrCat("dataset: samples [", first, ", ", first + count,
                                              ") are outside the batch of ", batch_size));
  }
  return absl::OkStatus();
}

}  // namespace data_internal

absl::StatusOr<Batch> Dataset::GetValidation(int64_t eval_batch, int64_t first,
                                             int64_t count) const {
  BATON_RETURN_IF_ERROR(data_internal::CheckRange(eval_batch, first, count, batch_size()));
  return absl::FailedPreconditionError(
      "data.tokens.val: this job's data has no validation split (only data.tokens with val "
      "shards has one)");
}

namespace {

namespace fs = std::filesystem;

// The text file at `path`, within the bound; errors name data.text.path.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<std::string> bytes =
      ReadFile(path, {.max_bytes = max_bytes, .regular_only = true});
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("data.text.path: ", bytes.status().message()));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<std::string> ConfineDataPath(const std::string& path,
                                            const std::vector<std::string>& roots,
                                            const std::string& field) {
  Confinement c;
  c.field = field;
  c.roots = roots;
  c.roots_are = "the directories this cluster reads data from";
  return ConfinePath(path, c);
}

absl::Status CheckDataFileAtSubmit(const std::string& path, const std::string& field,
                                   int64_t max_bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();  // the workers' to find
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : nullptr;
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", EchoInput(path), "' is ", kind != nullptr ? kind : "not a regular file",
        "; the workers read only regular files"));
  }
  if (max_bytes >= 0 && st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", EchoInput(path), "' has ",
                                                   st.st_size, " bytes, over the bound of ",
                                                   max_bytes, " the workers read"));
  }
  return absl::OkStatus();
}

std::vector<std::string> DataRootsFromFlag(const std::string& flag) {
  std::vector<std::string> roots;
  for (absl::string_view r : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    roots.emplace_back(absl::StripAsciiWhitespace(r));
  }
  if (!roots.empty()) return roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back((exe.parent_path() / "data").string());
  roots.push_back("/usr/share/common-licenses");
  return roots;
}

absl::StatusOr<std::string> LoadText(const baton::v1::TextData& text, const DataAccess& access) {
  switch (text.content_case()) {
    case baton::v1::TextData::kPath: {
      BATON_ASSIGN_OR_RETURN(std::string path, ConfineDataPath(text.path(), access.roots));
      return ReadWholeFile(path, access.max_file_bytes);
    }
    case baton::v1::TextData::kInlineText:
      return text.inline_text();
    case baton::v1::TextData::CONTENT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("data.text: no content set (want path or inline_text)");
}

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const ValidatedJobSpec& valid,
                                                     const DataAccess& access) {
  const baton::v1::JobSpec& spec = *valid;
  const auto& data = spec.data();
  if (data.has_text()) {
    // Validation guarantees a token model (gpt or llama) here.
    const TokenModel model = *TokenModelOf(spec.model());
    TextDataset::Options options;
    options.context = model.context;
    options.vocab_size = model.vocab_size;
    options.batch_size = data.batch_size();
    options.seed = spec.seed();
    if (data.text().has_path()) {
      options.field = "data.text.path";
      options.source = data.text().path();
    }
    BATON_ASSIGN_OR_RETURN(std::string text, LoadText(data.text(), access));
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<TextDataset> dataset,
                           TextDataset::Create(std::move(text), options));
    return std::unique_ptr<Dataset>(std::move(dataset));
  }
  if (data.has_tokens()) {
    // Validation guarantees a token model (gpt or llama) here.
    const TokenModel model = *TokenModelOf(spec.model());
    TokenDataset::Options options;
    options.context = model.context;
    options.vocab_size = model.vocab_size;
    options.batch_size = data.batch_size();
    options.seed = spec.seed();
    options.model_field = model.prefix;
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<TokenDataset> dataset,
                           TokenDataset::Open(data.tokens(), options, access));
    return std::unique_ptr<Dataset>(std::move(dataset));
  }
  // Validation guarantees synthetic data and an mlp model here.
  const auto& mlp = spec.model().mlp();
  SyntheticDataset::Options options;
  options.input_dim = mlp.input_dim();
  options.output_dim = mlp.output_dim();
  options.teacher_width = data.synthetic().teacher_width();
  options.noise = data.synthetic().noise();
  options.batch_size = data.batch_size();
  options.seed = spec.seed();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<SyntheticDataset> dataset,
                         SyntheticDataset::Create(options));
  return std::unique_ptr<Dataset>(std::move(dataset));
}

}  // namespace baton
