// Invariant checks for programming errors (not for bad input, which gets an absl::Status).
// Debian's Abseil predates absl/log, so we keep a minimal CHECK of our own.
#ifndef BATON_COMMON_CORE_CHECK_H_
#define BATON_COMMON_CORE_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

namespace baton::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* what,
                                     const char* detail) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, what, detail);
  std::abort();
}
}  // namespace baton::internal

#define BATON_CHECK(cond)                                                  \
  do {                                                                     \
    if (!(cond)) ::baton::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (false)

#define BATON_CHECK_OK(expr)                                                         \
  do {                                                                               \
    const ::absl::Status baton_check_status_ = (expr);                               \
    if (!baton_check_status_.ok())                                                   \
      ::baton::internal::CheckFailed(__FILE__, __LINE__, #expr,                      \
                                     baton_check_status_.ToString().c_str());        \
  } while (false)

#ifdef NDEBUG
#define BATON_DCHECK(cond) \
  do {                     \
  } while (false)
#else
#define BATON_DCHECK(cond) BATON_CHECK(cond)
#endif

#endif  // BATON_COMMON_CORE_CHECK_H_
