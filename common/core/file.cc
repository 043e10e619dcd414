#include "common/core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/core/log_text.h"

namespace baton {
namespace {

absl::Status FileError(int err, const char* op, const ReadFileOptions& o, const std::string& path) {
  // ErrnoToStatus appends ": <strerror>".
  return absl::ErrnoToStatus(
      err, absl::StrCat("cannot ", op, " ", o.what, o.what.empty() ? "" : " ", "'",
                        EchoInput(path), "'"));
}

// Closes the descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path, const ReadFileOptions& o) {
  const int flags = O_RDONLY | O_CLOEXEC | (o.regular_only ? O_NONBLOCK : 0);
  Fd f{::open(path.c_str(), flags)};
  if (f.fd < 0) return FileError(errno, "open", o, path);
  if (o.regular_only || o.max_bytes >= 0) {
    struct stat st;
    if (::fstat(f.fd, &st) != 0) return FileError(errno, "stat", o, path);
    if (o.regular_only && !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", EchoInput(path), "' is not a regular file"));
    }
    if (o.max_bytes >= 0 && S_ISREG(st.st_mode) && st.st_size > o.max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("'", EchoInput(path), "' has ", st.st_size,
                                                     " bytes, over the bound of ", o.max_bytes));
    }
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(f.fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, "read", o, path);
    }
    if (o.max_bytes >= 0 && static_cast<int64_t>(out.size()) + n > o.max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", EchoInput(path), "' is over the bound of ", o.max_bytes, " bytes"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace baton
