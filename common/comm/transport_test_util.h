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

}  // namespace transport_test
}  // namespace baton

#endif  // BATON_COMMON_COMM_TRANSPORT_TEST_UTIL_H_
