// Reading a whole file, the one way every part of baton does it: job specs, data files,
// checkpoints, tokens and keys, batonctl's inputs.
#ifndef BATON_COMMON_CORE_FILE_H_
#define BATON_COMMON_CORE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

struct ReadFileOptions {
  // What the file is, for errors: "cannot open job spec 'x.json': No such file or
  // directory". Empty: "cannot open 'x.json': ...".
  std::string what;
  // Refuse a file of more bytes (also one that grows past it while read); -1: no bound.
  int64_t max_bytes = -1;
  // Refuse anything but a regular file (a directory, a device, a FIFO: opened without
  // blocking, so a FIFO with no writer is refused instead of waited on).
  bool regular_only = false;
};

// The file's bytes. Errors name the path (quoted as EchoInput does) and what failed: the
// errno's code (NOT_FOUND for a missing file, PERMISSION_DENIED, ...) with strerror for open
// and read, INVALID_ARGUMENT for a file that is not regular ("'x' is not a regular file") or
// over the bound ("'x' has N bytes, over the bound of M").
absl::StatusOr<std::string> ReadFile(const std::string& path, const ReadFileOptions& options = {});

}  // namespace baton

#endif  // BATON_COMMON_CORE_FILE_H_
