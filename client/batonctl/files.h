// Reading the files batonctl's commands are given (schedules, traces).
#ifndef BATON_CLIENT_BATONCTL_FILES_H_
#define BATON_CLIENT_BATONCTL_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace baton::cli {

// The whole file, as bytes. NOT_FOUND "cannot read PATH: REASON" when it cannot be opened
// or read.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_FILES_H_
