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
//  - TokenDataset (gpt, llama): pre-tokenized shards (data.tokens; docs/data.md). A sample
//    is context + 1 consecutive tokens of one shard; see TokenDataset for the windows.
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

  // Validation batches, for JobSpec.eval. Samples [first, first + count) of evaluation
  // batch `eval_batch` (0, 1, ... up to eval.batches - 1 within one evaluation; every
  // evaluation asks for the same batches, so its loss is comparable across steps). Sample k
  // of batch b is a pure function of (b, k) (the seed plays no part): a TokenDataset gives
  // validation window (b * batch_size + k) mod (its number of validation windows), the
  // windows laid out as the sequential training ones are (TokenDataset). Shapes as Get's;
  // the same argument checks (eval_batch >= 0 like a step). FAILED_PRECONDITION naming
  // data.tokens.val when the dataset has no validation split (has_validation() is false:
  // text and synthetic data, or tokens without val shards); spec validation refuses
  // JobSpec.eval in that case, so an executor honouring eval never sees it.
  virtual absl::StatusOr<Batch> GetValidation(int64_t eval_batch, int64_t first,
                                              int64_t count) const;
  virtual bool has_validation() const { return false; }
};

// Where a process may read training text from. A worker reads only under its data roots
// (so a job cannot make it read /etc/shadow); `batonctl train-local` reads the user's own
// files (no roots). Every file must be a regular file of at most max_file_bytes (so
// /dev/zero or a FIFO cannot make a worker read forever).
struct DataAccess {
  // Directories text files must lie under, after symlinks are resolved; empty: anywhere.
  std::vector<std::string> roots;
  int64_t max_file_bytes = int64_t{1} << 30;
};

// Builds the dataset for a validated spec (ValidatedJobSpec: it is not checked again),
// reading the text file, or mapping the token shards, if any, as `access` allows.
// Text errors (INVALID_ARGUMENT or the file's errno code, each naming the field): an empty
// text, a text not longer than model.gpt.context + 1 bytes, and model.gpt.vocab_size
// smaller than the number of distinct bytes; a missing file is NOT_FOUND naming
// data.text.path and the path. Token errors: see TokenDataset.
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

// The submit-time check of a file a spec names (`field`: data.text.path, or a file of
// init.from_hf), on a service that may see the workers' files (the coordinator, `path` as
// ConfineDataPath resolved it): when `path` exists here, it must be a regular file (a FIFO,
// a device, a directory or a socket is refused; it is looked at with stat(2), never opened,
// so a FIFO cannot block) of at most `max_bytes` bytes (-1: no bound), as the workers will
// require (DataAccess). INVALID_ARGUMENT naming `field`, the path and what is wrong. A path
// that does not exist here, or that this host cannot look at, is left to the workers.
absl::Status CheckDataFileAtSubmit(const std::string& path, const std::string& field,
                                   int64_t max_bytes);

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

// Pre-tokenized shards for the token models (data.tokens; docs/data.md).
//
// Files. Each entry of data.tokens.train / .val is a path or a glob(3) pattern; a pattern's
// matches are taken in byte order, entries in their order. A relative entry is looked up
// under each data root in turn (the first root where it exists or matches wins; with no
// roots, under the working directory); every file must lie under the roots
// (ConfineDataPath, naming data.tokens.train or data.tokens.val) and be a regular file.
// Formats (TokenFormat): nanoGPT raw little-endian uint16; raw uint32; llm.c (a header of
// 256 little-endian int32: magic 20240520, version 1 = uint16 tokens or 2 = uint32 tokens,
// token count; the tokens follow at byte 1024). AUTO reads llm.c when the first int32 is
// the magic, else raw uint16. Files are memory-mapped read-only; a batch touches only the
// windows it uses (no byte limit applies: nothing is read whole). A shard must not change
// while a dataset maps it (a file truncated under the mapping faults the process).
//
// Windows. Let T = context and n_i the tokens of shard i. A sample is T + 1 consecutive
// tokens of one shard: inputs the first T, targets the last T.
//  - RANDOM: sample k of step s starts at global start
//      u = RngStream(seed, "data/tokens/step/" + s).UniformInt(k, sum_i (n_i - T))
//    where shard i owns starts [sum_{j<i} (n_j - T), sum_{j<=i} (n_j - T)) and the start's
//    position within the shard is u minus its first (nanoGPT's randint(len - T), weighted
//    by shard size, over the concatenation of the shards' own ranges).
//  - SEQUENTIAL: shard i holds W_i = (n_i - 1) / T windows at positions 0, T, 2T, ...
//    (inputs never overlap; a window's last target is the next one's first input, as llm.c
//    reads); the windows of all shards are numbered in shard order, W = sum W_i, and sample
//    k of step s is window (s * batch_size + k) mod W (wrapping after the last).
//      e.g. shards of 9 and 7 tokens, T = 3: windows (0,0) (0,3) (1,0) (1,3); batch 3:
//      step 0 -> (0,0) (0,3) (1,0); step 1 -> (1,3) (0,0) (0,3)
//  - Validation: the SEQUENTIAL layout over the val shards; batch b, sample k is window
//    (b * batch_size + k) mod W_val (Dataset::GetValidation).
// Both samplings are pure functions of (seed, step, sample): the read position IS the step,
// which every checkpoint records, so a run resumed at step k (onto any partition or number
// of replicas) reads exactly the tokens the uninterrupted run read from step k on.
//
// Refusals (INVALID_ARGUMENT unless said, each naming the field and the file): a pattern
// matching nothing or a missing file (NOT_FOUND); a file outside the roots or not regular;
// a raw uint16 file of odd size or raw uint32 not a multiple of 4 (truncated); an llm.c
// header with another magic (format LLMC), another version, a negative count, or a count
// that does not match the file's size (truncated or lying); a shard of fewer than T + 1
// tokens. A token id >= the model's vocab_size is refused when the window holding it is
// read (Get / GetValidation), naming the shard and the token's offset in it.
class TokenDataset final : public Dataset {
 public:
  struct Options {
    int64_t context = 0;     // model.*.context, >= 1
    int64_t vocab_size = 0;  // model.*.vocab_size, >= 1
    int64_t batch_size = 0;  // data.batch_size, >= 1
    uint64_t seed = 0;
    baton::v1::TokenFormat format = baton::v1::TOKEN_FORMAT_AUTO;
    baton::v1::TokenSampling sampling = baton::v1::TOKEN_SAMPLING_RANDOM;
    // The model's spec fields, for messages ("model.gpt" or "model.llama").
    std::string model_field = "model.gpt";
  };
  // One mapped file.
  struct ShardInfo {
    std::string path;         // as opened (resolved)
    int64_t tokens = 0;       // n_i
    int bytes_per_token = 0;  // 2 or 4
    bool llmc = false;        // had llm.c's header
  };
  // One mapped file (opaque; defined in token_dataset.cc).
  struct Shard;
  // Where a sample comes from: shard index and the position of its first token.
  struct Window {
    int64_t shard = 0;
    int64_t position = 0;
  };

  // Opens data.tokens (the entries resolved as above against access.roots).
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const baton::v1::TokenData& tokens,
                                                            const Options& options,
                                                            const DataAccess& access);
  // Opens the given files as they are (no globbing, no confinement); `val` may be empty.
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Create(
      const std::vector<std::string>& train, const std::vector<std::string>& val,
      const Options& options);
  ~TokenDataset() override;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  absl::StatusOr<Batch> Get(int64_t step, int64_t first, int64_t count) const override;
  absl::StatusOr<Batch> GetValidation(int64_t eval_batch, int64_t first,
                                      int64_t count) const override;
  bool has_validation() const override { return !val_.empty(); }
  std::string Describe() const override;
  int64_t batch_size() const override { return options_.batch_size; }

  // The window of sample `index` of step `step` (the sampling above); of validation batch
  // `eval_batch`.
  Window TrainWindow(int64_t step, int64_t index) const;
  Window ValidationWindow(int64_t eval_batch, int64_t index) const;
  std::vector<ShardInfo> train_shards() const;
  int64_t train_tokens() const;
  // Sequential windows (W above) of the training and validation shards.
  int64_t train_windows() const { return train_windows_.empty() ? 0 : train_windows_.back(); }
  int64_t val_windows() const { return val_windows_.empty() ? 0 : val_windows_.back(); }

 private:
  explicit TokenDataset(const Options& options);
  absl::StatusOr<Batch> Read(const std::vector<std::unique_ptr<Shard>>& shards,
                             const char* field, absl::Span<const Window> windows) const;

  const Options options_;
  std::vector<std::unique_ptr<Shard>> train_, val_;
  // Prefix sums over shards: random starts (n_i - T) and sequential windows (W_i).
  std::vector<int64_t> train_starts_, train_windows_, val_windows_;
};

// The files data.tokens.train (`field` "data.tokens.train") or .val names: each entry
// expanded and confined as TokenDataset's comment says, in order. Errors name `field`.
absl::StatusOr<std::vector<std::string>> ResolveTokenFiles(
    const google::protobuf::RepeatedPtrField<std::string>& entries,
    const std::vector<std::string>& roots, const std::string& field);

// The submit-time check of data.tokens on a service whose data roots are `roots` (the
// coordinator): every absolute entry (and a pattern's directory) must lie under the roots
// and a relative one must not climb out of them with ".."; the files the coordinator can
// see are opened and their headers, sizes and window checked (not their token ids). Files
// it cannot find are left to the workers (they live there), so NOT_FOUND is not an error.
absl::Status CheckTokenDataAtSubmit(const baton::v1::JobSpec& spec,
                                    const std::vector<std::string>& roots);

namespace data_internal {
// Shared argument check of Dataset::Get.
absl::Status CheckRange(int64_t step, int64_t first, int64_t count, int64_t batch_size);
}  // namespace data_internal

}  // namespace baton

#endif  // BATON_COMMON_DATA_DATASET_H_
