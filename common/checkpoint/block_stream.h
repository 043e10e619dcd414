// A checkpoint's block files read in bounded pieces, never whole: the SHA-256 check of a
// file, and the weights export (the file ExportWeights in checkpoint.h returns) produced
// piece by piece, so that a model of any size is checked and exported in constant memory.
//
// The export: WeightsExport::Open computes the output's safetensors header from the block
// files' headers alone (every tensor but the optimizer's "optimizer.*" state, blocks in
// canonical order and each file's tensors in its order; F16 and BF16 tensors become F32;
// metadata format baton-weights-1, job, step). Next then reads each block file from its
// first byte to its last in pieces of at most chunk_bytes: every byte feeds the file's
// SHA-256, and the bytes of its weights become the output's. At a file's end its hash must
// match its manifest: a file that changed after Open (other bytes, another size, replaced,
// gone) ends the export with DATA_LOSS naming it. Some of that file's bytes may have been
// produced by then, so a caller that hands the output on as it goes checks the checkpoint
// first (VerifyCheckpoint; FindCheckpoint does) and learns of a change since from the
// error, before the export ends.
//
// Thread safety: a WeightsExport is used by one thread at a time; separate ones (of the
// same checkpoint too) are independent.
#ifndef BATON_COMMON_CHECKPOINT_BLOCK_STREAM_H_
#define BATON_COMMON_CHECKPOINT_BLOCK_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint/checkpoint.h"

namespace baton {

// The pieces block files are read in, and the export's largest piece, by default.
inline constexpr size_t kBlockStreamChunkBytes = size_t{1} << 20;

class BlockFileReader;  // block_stream.cc

// Checks the block file `f` names under `step_dir` against its SHA-256, reading it in pieces
// of kBlockStreamChunkBytes. DATA_LOSS naming the block and the file when it cannot be read
// or its hash differs (the message VerifyCheckpoint's errors carry).
absl::Status VerifyBlockFile(const std::string& step_dir, const CheckpointBlockFile& f);

class WeightsExport {
 public:
  // Reads step_dir's manifests and every block file's header (not their data).
  // NOT_FOUND when the manifests miss a block or there are none; DATA_LOSS naming the file
  // when a manifest or a block file cannot be read or its header is not safetensors;
  // INVALID_ARGUMENT when two blocks hold a weight of the same name. chunk_bytes must be at
  // least 8 (INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<WeightsExport>> Open(
      const std::string& step_dir, size_t chunk_bytes = kBlockStreamChunkBytes);
  ~WeightsExport();
  WeightsExport(const WeightsExport&) = delete;
  WeightsExport& operator=(const WeightsExport&) = delete;

  int64_t step() const { return step_; }
  // The whole output's size, known at Open.
  uint64_t total_bytes() const { return total_bytes_; }

  // Replaces *out with the output's next piece: 1 to chunk_bytes bytes, the header's first;
  // empty once all total_bytes() have been produced. DATA_LOSS as above; after an error
  // every call returns it again. Holds at most one open file and a buffer of chunk_bytes
  // (out's capacity is kept from call to call).
  absl::Status Next(std::string* out);

 private:
  // A byte range of a block file: read and hashed always, produced when `weight`.
  struct Span {
    uint64_t bytes = 0;
    bool weight = false;
    std::string widen;  // "F16" or "BF16": produced as float32 (twice the bytes); else ""
  };
  struct File {
    CheckpointBlockFile manifest;
    std::string path;
    uint64_t bytes = 0;        // its size at Open
    std::vector<Span> spans;   // cover the file exactly, in order (the header first)
  };
  WeightsExport(int64_t step, size_t chunk_bytes);
  // Reads (and hashes) the next piece of the current span, appending what it produces to
  // *out, which has at least 4 bytes of room left before chunk_bytes_. Opens the span's file
  // at its first byte and checks its hash after its last.
  absl::Status Advance(std::string* out);

  const int64_t step_;
  const size_t chunk_bytes_;
  uint64_t total_bytes_ = 0;
  std::string header_;  // the output's header: length, JSON, padding
  std::vector<File> files_;
  // Where the export is: bytes of header_ produced, then files_[file_] span span_ at byte
  // span_at_ (reader_ open on it, created at its first byte and reset after its last).
  size_t header_at_ = 0;
  size_t file_ = 0;
  size_t span_ = 0;
  uint64_t span_at_ = 0;
  std::unique_ptr<BlockFileReader> reader_;
  std::string scratch_;
  absl::Status failed_;  // the first error, returned from then on
};

}  // namespace baton

#endif  // BATON_COMMON_CHECKPOINT_BLOCK_STREAM_H_
