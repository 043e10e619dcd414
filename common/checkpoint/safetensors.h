// The safetensors file format (https://huggingface.co/docs/safetensors), which PyTorch and
// Hugging Face tools read directly:
//   8 bytes   N, the header's length, unsigned little-endian;
//   N bytes   a JSON object: for each tensor {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]} under its name, and optionally "__metadata__",
//             a string-to-string map; padded with spaces to a multiple of 8 bytes;
//   the data  every tensor's bytes, little-endian, row-major, at its offsets (relative to
//             the end of the header), contiguous, covering the rest of the file exactly.
// baton writes F32 and I32 tensors, in the order given (so the same tensors give the same
// bytes), and reads those two dtypes; anything else is refused with the tensor named.
#ifndef BATON_COMMON_CHECKPOINT_SAFETENSORS_H_
#define BATON_COMMON_CHECKPOINT_SAFETENSORS_H_

#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
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
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<NamedTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// One tensor of a parsed file; `data` points into the buffer that was parsed.
struct SafetensorsEntry {
  DType dtype = DType::kFloat32;
  Shape shape;
  absl::string_view data;
};

struct Safetensors {
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafetensorsEntry> tensors;
  std::vector<std::string> order;  // tensor names by offset, as laid out in the file
};

// Parses `file` (which must outlive the result). INVALID_ARGUMENT naming what is wrong and
// where (header length, JSON, a tensor's dtype, shape or offsets, holes or overlaps in the
// data) for anything that is not a well-formed file of F32/I32 tensors.
absl::StatusOr<Safetensors> ParseSafetensors(absl::string_view file);

// A new tensor on `device` holding the entry.
absl::StatusOr<Tensor> EntryToTensor(const SafetensorsEntry& e, Device device);
// Copies the entry into `dst`, which must have its dtype and shape (INVALID_ARGUMENT naming
// `what` and both shapes otherwise).
absl::Status CopyEntryInto(const SafetensorsEntry& e, const std::string& what, Tensor* dst);

}  // namespace baton

#endif  // BATON_COMMON_CHECKPOINT_SAFETENSORS_H_
