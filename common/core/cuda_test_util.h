// For tests that need a CUDA device (ctest label gpu): skip with a message without one,
// but fail under BATON_REQUIRE_GPU (scripts/gpu-test.sh), so a GPU run cannot pass by
// skipping. Include from *_test.cc only.
#ifndef BATON_COMMON_CORE_CUDA_TEST_UTIL_H_
#define BATON_COMMON_CORE_CUDA_TEST_UTIL_H_

#include <cstdlib>

#include "common/core/cuda_device.h"
#include "gtest/gtest.h"

#define BATON_SKIP_WITHOUT_CUDA_DEVICE()                                                \
  do {                                                                                  \
    if (::baton::CudaDeviceCount() == 0) {                                              \
      if (std::getenv("BATON_REQUIRE_GPU") != nullptr) {                                \
        FAIL() << "BATON_REQUIRE_GPU is set but no CUDA device was found (built with "  \
               << "CUDA: " << (::baton::BuiltWithCuda() ? "yes" : "no") << ")";        \
      }                                                                                 \
      GTEST_SKIP() << "no CUDA device found (built with CUDA: "                        \
                   << (::baton::BuiltWithCuda() ? "yes" : "no") << "); skipped";       \
    }                                                                                   \
  } while (false)

#endif  // BATON_COMMON_CORE_CUDA_TEST_UTIL_H_
