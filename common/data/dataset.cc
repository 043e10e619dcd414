#include "common/data/dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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

namespace {

absl::Status FileError(int err, const std::string& what, const std::string& path) {
  // ErrnoToStatus appends ": <strerror>".
  return absl::ErrnoToStatus(err, absl::StrCat("data.text.path: cannot ", what, " '", path, "'"));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "open", path);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return FileError(err, "read", path);
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

absl::StatusOr<std::string> LoadText(const baton::v1::TextData& text) {
  switch (text.content_case()) {
    case baton::v1::TextData::kPath:
      return ReadWholeFile(text.path());
    case baton::v1::TextData::kInlineText:
      return text.inline_text();
    case baton::v1::TextData::CONTENT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("data.text: no content set (want path or inline_text)");
}

absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const baton::v1::JobSpec& original) {
  baton::v1::JobSpec spec = original;
  BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(&spec));
  const auto& data = spec.data();
  if (data.has_text()) {
    // Validation guarantees a gpt model here.
    const auto& gpt = spec.model().gpt();
    TextDataset::Options options;
    options.context = gpt.context();
    options.vocab_size = gpt.vocab_size();
    options.batch_size = data.batch_size();
    options.seed = spec.seed();
    if (data.text().has_path()) {
      options.field = "data.text.path";
      options.source = data.text().path();
    }
    BATON_ASSIGN_OR_RETURN(std::string text, LoadText(data.text()));
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<TextDataset> dataset,
                           TextDataset::Create(std::move(text), options));
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
