// For tests of the real NCCL on a real GPU (ctest label gpu): skip with a message without
// a device or without NCCL, but fail under BATON_REQUIRE_GPU (scripts/gpu-test.sh), so a
// GPU run cannot pass by skipping. Include from *_test.cc only.
#ifndef BATON_COMMON_NCCL_NCCL_TEST_UTIL_H_
#define BATON_COMMON_NCCL_NCCL_TEST_UTIL_H_

#include <cstdlib>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/core/cuda_device.h"
#include "common/nccl/nccl_api.h"
#include "gtest/gtest.h"

// Sets `api` or skips (fails under BATON_REQUIRE_GPU) saying why.
#define BATON_NCCL_OR_SKIP(api)                                                   \
  ::baton::NcclApi* api = nullptr;                                                \
  do {                                                                            \
    const bool required = std::getenv("BATON_REQUIRE_GPU") != nullptr;            \
    if (::baton::CudaDeviceCount() == 0) {                                        \
      if (required) {                                                             \
        FAIL() << "BATON_REQUIRE_GPU is set but no CUDA device can be used: "     \
               << ::baton::CudaAbsenceReason();                                   \
      }                                                                           \
      GTEST_SKIP() << "no CUDA device (" << ::baton::CudaAbsenceReason()          \
                   << "); real NCCL tests skipped";                               \
    }                                                                             \
    absl::StatusOr<::baton::NcclApi*> loaded = ::baton::LoadNccl();               \
    if (!loaded.ok()) {                                                           \
      if (required) FAIL() << "BATON_REQUIRE_GPU is set but " << loaded.status(); \
      GTEST_SKIP() << "NCCL is not available: " << loaded.status();               \
    }                                                                             \
    api = *loaded;                                                                \
  } while (false)

namespace baton {

// Polls `event` until it completed; false at the timeout.
inline bool Reached(NcclApi* api, CudaEvent event, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<bool> done = api->EventQuery(event);
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok() || *done) return done.ok();
    absl::SleepFor(absl::Microseconds(50));
  }
  return false;
}

}  // namespace baton

#endif  // BATON_COMMON_NCCL_NCCL_TEST_UTIL_H_
