// Test utility for every Transport's tests (common/comm, common/transport, and the contract
// suite in common/pipeline/transport_contract_test.cc): tensors whose bytes show mix-ups.
#ifndef BATON_COMMON_COMM_TRANSPORT_TEST_UTIL_H_
#define BATON_COMMON_COMM_TRANSPORT_TEST_UTIL_H_

#include <cstdint>
#include <cstring>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/core/tensor.h"

namespace baton {
namespace transport_test {

// A tensor whose bytes depend on `seed`, so that mix-ups show.
inline Tensor Pattern(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::Empty(shape, dtype);
  auto* p = static_cast<uint32_t*>(t.raw());
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = x;
  }
  return t;
}

// Same definedness, dtype, shape and bytes.
inline bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

inline absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Deadlines for operations whose expected outcome is not DEADLINE_EXCEEDED: they only
// bound a hang, so no load can make the test miss them.
//  - kHangBound: for an operation expected to succeed (or to fail for another reason).
//  - kNeverReached: for what a test shows an operation does NOT wait for (an abort that
//    must not wait for the receive deadline, a failure that must be reported before the
//    send deadline): the operation ending with a status that is not DEADLINE_EXCEEDED
//    proves it, and a regression is a hung test, not a flaky assertion on elapsed time.
inline constexpr absl::Duration kHangBound = absl::Seconds(60);
inline constexpr absl::Duration kNeverReached = absl::Minutes(10);

// Polls `done` (every millisecond) until it is true; false if it is still false after
// kHangBound. For waiting until a fact a test needs (a tensor filed, a caller blocked) is
// true, instead of sleeping and assuming it is.
template <typename F>
bool WaitUntil(F done) {
  const absl::Time deadline = In(kHangBound);
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace transport_test
}  // namespace baton

#endif  // BATON_COMMON_COMM_TRANSPORT_TEST_UTIL_H_
