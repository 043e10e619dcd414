// The safetensors file format (https://huggingface.co/docs/safetensors), which PyTorch and
// Hugging Face tools read directly:
//   8 bytes   N, the header's length, unsigned little-endian;
//   N bytes   a JSON object: for each tensor {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]} under its name, and optionally "__metadata__",
//             a string-to-string map; padded with spaces to a multiple of 8 bytes;
//   the data  every tensor's bytes, little-endian, row-major, at its offsets (relative to
//             the end of the header), contiguous, covering the rest of the file exactly.
// baton writes F32 and I32 tensors, in the order given (so the same tensors give the same
// bytes). It reads those two dtypes and also F16 and BF16 (Hugging Face checkpoints), which
// become float32 (exactly: every F16 and BF16 value is a float32 value); anything else is
// refused with the tensor named.
#ifndef BATON_COMMON_CHECKPOINT_SAFETENSORS_H_
#define BATON_COMMON_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/core/tensor.h"

namespace baton {

// A tensor to write: its name and the tensor (on any device; device tensors are copied to
// the host as they are written).
struct NamedTensor {
  std::string name;
  const Tensor* tensor = nullptr;
};

// The file's bytes. INVALID_ARGUMENT for an empty, reserved ("__metadata__") or duplicate
// name, or an undefined tensor; a device copy's error as it comes.
// = EncodeSafetensorsHeader of the tensors' layouts, then their bytes.
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<NamedTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// A tensor's place in a file to write: its name, dtype and shape (its bytes follow).
struct TensorLayout {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};
// The start of the file of tensors laid out contiguously in the order given: the 8-byte
// header length and the header, padded (for writing the data after it, from elsewhere).
// INVALID_ARGUMENT for names as EncodeSafetensors.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<TensorLayout>& tensors, const std::map<std::string, std::string>& metadata);

// One tensor of a parsed file; `data` points into the buffer that was parsed.
struct SafetensorsEntry {
  DType dtype = DType::kFloat32;  // as read: F16 and BF16 entries read as kFloat32
  std::string file_dtype = "F32";  // the file's tag: "F32", "I32", "F16" or "BF16"
  Shape shape;
  uint64_t offset = 0;  // data_offsets' begin, from the end of the header
  absl::string_view data;  // the file's bytes (2 per element for F16 and BF16)
};

struct Safetensors {
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafetensorsEntry> tensors;
  std::vector<std::string> order;  // tensor names by offset, as laid out in the file
};

// The largest header read, as the format's reference implementation has it
// (MAX_HEADER_SIZE): a longer one is refused from its length field alone.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses `file` (which must outlive the result). INVALID_ARGUMENT naming what is wrong and
// where (header length, JSON, a tensor's dtype, shape or offsets, holes or overlaps in the
// data) for anything that is not a well-formed file of F32/I32 tensors. The header must be
// JSON in UTF-8; a tensor named twice is refused. Names and bytes of the file that an error
// quotes are escaped and bounded (EchoInput). Parsing takes memory proportional to the header
// (about four times it for a header of many small entries), besides the result's.
absl::StatusOr<Safetensors> ParseSafetensors(absl::string_view file);

// For reading some tensors of a large file without reading all of it: the header's length N
// from the file's first 8 bytes (INVALID_ARGUMENT when N exceeds the file, or, saying the
// header is too large, kMaxSafetensorsHeaderBytes: check it before allocating N bytes), then
// the header itself (bytes 8 .. 8 + N) parsed as ParseSafetensors does, for a file whose data
// section has `data_bytes` bytes. Entries have their offset and an empty `data`: read
// entry.data_size() bytes at 8 + N + offset and point `data` at them.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view first8, uint64_t file_bytes);
absl::StatusOr<Safetensors> ParseSafetensorsHeader(absl::string_view header, uint64_t data_bytes);
// The bytes an entry's data takes in the file.
uint64_t SafetensorsDataBytes(const SafetensorsEntry& e);

// A new tensor on `device` holding the entry (F16 and BF16 converted to float32).
absl::StatusOr<Tensor> EntryToTensor(const SafetensorsEntry& e, Device device);
// Copies the entry into `dst`, which must have its dtype and shape (INVALID_ARGUMENT naming
// `what` and both shapes otherwise).
absl::Status CopyEntryInto(const SafetensorsEntry& e, const std::string& what, Tensor* dst);

}  // namespace baton

#endif  // BATON_COMMON_CHECKPOINT_SAFETENSORS_H_
