// Datasets: deterministic sources of training samples.
//
// Sample i of step s is a pure function of (seed, s, i): any worker regenerates any
// micro-batch without coordination, and the global batch of a step does not depend on how
// it is split into micro-batches. Two datasets exist, one per model family:
//
//  - TextDataset (gpt): character-level text. The vocabulary is the text's distinct bytes
//    in ascending byte order; a byte's token id is its rank. Sample i of step s is the
//    context + 1 consecutive bytes starting at
//      offset = RngStream(seed, "data/text/step/" + s).UniformInt(i, len - context)
//    (so every offset in [0, len - context - 1] can occur); inputs are the first `context`
//    ids, targets the last `context` (inputs shifted by one).
//
//  - SyntheticDataset (mlp): regression onto a fixed random teacher,
//      x[j] = RngStream(seed, "data/synthetic/step/" + s).Normal(i * input_dim + j)
//      y[k] = W2 tanh(W1 x + b1) + b2 + noise * RngStream(seed, "data/noise/step/" + s)
//                                                 .Normal(i * output_dim + k)
//    with teacher weights drawn once at construction (see SyntheticDataset).
//
// Steps are numbered by the caller (any s >= 0); sample indices run over the global batch,
// [0, data.batch_size). Every Dataset is immutable after construction: Get may be called
// from any number of threads at once.
#ifndef BATON_COMMON_DATA_DATASET_H_
#define BATON_COMMON_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "baton/v1/job.pb.h"
#include "common/spec/spec.h"
#include "common/core/tensor.h"

namespace baton {

// A micro-batch of samples, on the CPU.
//   text:      inputs int32 [count, context], targets int32 [count, context]
//   synthetic: inputs f32 [count, input_dim], targets f32 [count, output_dim]
struct Batch {
  Tensor inputs;
  Tensor targets;
};

// A deterministic source of training samples. Sample i of step s is a pure function of
// (seed, s, i): any worker regenerates any micro-batch without coordination, and the
// global batch of a step does not depend on how it is split into micro-batches.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // Samples [first, first + count) of step `step`'s global batch. Requires step >= 0,
  // first >= 0, count >= 1 (else INVALID_ARGUMENT) and first + count <= batch_size (else
  // OUT_OF_RANGE).
  virtual absl::StatusOr<Batch> Get(int64_t step, int64_t first, int64_t count) const = 0;
  virtual std::string Describe() const = 0;  // one line for logs
  // Samples per step (data.batch_size).
  virtual int64_t batch_size() const = 0;
};

// Builds the dataset for a spec (reads the text file, if any). The spec is validated and
// defaulted on a copy first (ValidateAndDefaultJobSpec), so its errors come back unchanged.
// Text errors (INVALID_ARGUMENT or the file's errno code, each naming the field): an empty
// text, a text not longer than model.gpt.context + 1 bytes, and model.gpt.vocab_size
// smaller than the number of distinct bytes; a missing file is NOT_FOUND naming
// data.text.path and the path.
absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const baton::v1::JobSpec& spec);

// Where a process may read training text from. A worker reads only under its data roots
// (so a job cannot make it read /etc/shadow); `batonctl train-local` reads the user's own
// files (no roots). Every file must be a regular file of at most max_file_bytes (so
// /dev/zero or a FIFO cannot make a worker read forever).
struct DataAccess {
  // Directories text files must lie under, after symlinks are resolved; empty: anywhere.
  std::vector<std::string> roots;
  int64_t max_file_bytes = int64_t{1} << 30;
};
absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const baton::v1::JobSpec& spec,
                                                     const DataAccess& access);
// The same for a spec already validated, which is not checked again.
absl::StatusOr<std::unique_ptr<Dataset>> MakeDataset(const ValidatedJobSpec& spec,
                                                     const DataAccess& access);
// The roots a service's --data_root flag names: comma-separated directories; empty means
// the defaults, data/ beside the running binary and /usr/share/common-licenses (the demo's
// text).
std::vector<std::string> DataRootsFromFlag(const std::string& flag);

// `path` with symlinks resolved (as far as it exists) when it lies under one of `roots`
// (also resolved); INVALID_ARGUMENT naming `field` (the spec field that gave the path), the
// path and the roots when it does not. With no roots, `path` itself.
absl::StatusOr<std::string> ConfineDataPath(const std::string& path,
                                            const std::vector<std::string>& roots,
                                            const std::string& field = "data.text.path");

// The content of a TextData: the whole file at `path` (read as bytes), or the inline text.
// File errors carry the errno's code (NOT_FOUND for a missing file) and name
// data.text.path and the path; a path outside access.roots, a file that is not a regular
// file, or one over access.max_file_bytes is INVALID_ARGUMENT. Does not check the content.
absl::StatusOr<std::string> LoadText(const baton::v1::TextData& text,
                                     const DataAccess& access = DataAccess());

// Character-level text for the gpt (see the file comment for the sampling scheme).
class TextDataset final : public Dataset {
 public:
  struct Options {
    int64_t context = 0;     // model.gpt.context, >= 1
    int64_t vocab_size = 0;  // model.gpt.vocab_size, >= 1
    int64_t batch_size = 0;  // data.batch_size, >= 1
    uint64_t seed = 0;
    // Names the text in error messages ("data.text.path" or "data.text.inline_text").
    std::string field = "data.text.inline_text";
    // The file the text came from, for messages; empty for inline text.
    std::string source;
  };

  // Refuses (INVALID_ARGUMENT naming the field) an empty text, a text of at most
  // context + 1 bytes, and vocab_size below the number of distinct bytes; sizes below 1
  // are INVALID_ARGUMENT too.
  static absl::StatusOr<std::unique_ptr<TextDataset>> Create(std::string text,
                                                             const Options& options);

  absl::StatusOr<Batch> Get(int64_t step, int64_t first, int64_t count) const override;
  std::string Describe() const override;
  int64_t batch_size() const override { return options_.batch_size; }

  int64_t context() const { return options_.context; }
  int64_t vocab_size() const { return options_.vocab_size; }
  int64_t text_bytes() const { return static_cast<int64_t>(ids_.size()); }
  // Number of distinct bytes: ids [0, num_chars()) are in use, the rest of the vocabulary
  // never occurs.
  int num_chars() const { return static_cast<int>(alphabet_.size()); }
  // alphabet()[id] is the byte of token id `id`, in ascending byte order.
  const std::string& alphabet() const { return alphabet_; }
  // Offset in the text of sample `index` of step `step` (the first byte of its inputs).
  int64_t SampleOffset(int64_t step, int64_t index) const;

  // Token ids to text; ids outside [0, num_chars()) decode as '?'.
  std::string Decode(absl::Span<const int32_t> ids) const;
  // Text to token ids; INVALID_ARGUMENT naming the first byte that is not in the text's
  // alphabet.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

 private:
  TextDataset(std::string alphabet, std::vector<uint8_t> ids, const Options& options);

  std::string alphabet_;
  std::vector<uint8_t> ids_;  // the whole text as token ids (at most 256 distinct)
  Options options_;
};

// Regression onto a fixed random teacher for the mlp (see the file comment). The teacher,
// drawn once at construction:
//   W1 [teacher_width, input_dim]  = RngStream(seed, "data/teacher/W1"), std 1/sqrt(input_dim)
//   b1 [teacher_width]             = RngStream(seed, "data/teacher/b1"), std 0.1
//   W2 [output_dim, teacher_width] = RngStream(seed, "data/teacher/W2"), std 1/sqrt(width)
//   b2 [output_dim]                = RngStream(seed, "data/teacher/b2"), std 0.1
// each filled with RngStream::FillNormal(out, n, 0, std) (row-major, std as float).
// Targets are computed in double in this order, then rounded once to float:
//   h[t] = tanh(b1[t] + sum_j W1[t,j] x[j]),  y[k] = b2[k] + sum_t W2[k,t] h[t]
//   (+ noise * n[k] when noise != 0), sums in increasing index order.
class SyntheticDataset final : public Dataset {
 public:
  struct Options {
    int64_t input_dim = 0;      // model.mlp.input_dim
    int64_t output_dim = 0;     // model.mlp.output_dim
    int64_t teacher_width = 0;  // data.synthetic.teacher_width (after defaulting)
    float noise = 0;            // data.synthetic.noise, finite and >= 0
    int64_t batch_size = 0;     // data.batch_size
    uint64_t seed = 0;
  };

  // INVALID_ARGUMENT for sizes below 1 or a negative or non-finite noise.
  static absl::StatusOr<std::unique_ptr<SyntheticDataset>> Create(const Options& options);

  absl::StatusOr<Batch> Get(int64_t step, int64_t first, int64_t count) const override;
  std::string Describe() const override;
  int64_t batch_size() const override { return options_.batch_size; }

  const Options& options() const { return options_; }
  // Teacher weights, row-major with the shapes above.
  const std::vector<float>& w1() const { return w1_; }
  const std::vector<float>& b1() const { return b1_; }
  const std::vector<float>& w2() const { return w2_; }
  const std::vector<float>& b2() const { return b2_; }

 private:
  explicit SyntheticDataset(const Options& options);

  Options options_;
  std::vector<float> w1_, b1_, w2_, b2_;
};

namespace data_internal {
// Shared argument check of Dataset::Get.
absl::Status CheckRange(int64_t step, int64_t first, int64_t count, int64_t batch_size);
}  // namespace data_internal

}  // namespace baton

#endif  // BATON_COMMON_DATA_DATASET_H_
