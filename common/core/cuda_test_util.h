// For tests that need a CUDA device (ctest label gpu): skip with a message without one,
// but fail under BATON_REQUIRE_GPU (scripts/gpu-test.sh), so a GPU run cannot pass by
// skipping. Include from *_test.cc only.
#ifndef BATON_COMMON_CORE_CUDA_TEST_UTIL_H_
#define BATON_COMMON_CORE_CUDA_TEST_UTIL_H_

#include <cstdio>
#include <cstdlib>

#include "common/core/cuda_device.h"
#include "gtest/gtest.h"

#define BATON_SKIP_WITHOUT_CUDA_DEVICE()                                                  \
  do {                                                                                    \
    if (::baton::CudaDeviceCount() == 0) {                                                \
      if (std::getenv("BATON_REQUIRE_GPU") != nullptr) {                                  \
        FAIL() << "BATON_REQUIRE_GPU is set but no CUDA device can be used: "             \
               << ::baton::CudaAbsenceReason();                                           \
      }                                                                                   \
      GTEST_SKIP() << "no CUDA device (" << ::baton::CudaAbsenceReason() << "); skipped"; \
    }                                                                                     \
  } while (false)

// For tests that need `n` CUDA devices (NCCL refuses two ranks on one GPU): skipped, with a
// message, where fewer are present, BATON_REQUIRE_GPU or not (a one-GPU host cannot run
// them; scripts/gpu-test.sh says which were skipped).
#define BATON_SKIP_WITHOUT_CUDA_DEVICES(n)                                                     \
  do {                                                                                         \
    BATON_SKIP_WITHOUT_CUDA_DEVICE();                                                          \
    if (::baton::CudaDeviceCount() < (n)) {                                                    \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << ::baton::CudaDeviceCount() \
                   << "; skipped";                                                             \
    }                                                                                          \
  } while (false)

// An environment that skips every test of a binary built to run whole on a GPU
// (cuda_pipeline_test) without a CUDA device, and fails them under BATON_REQUIRE_GPU:
//   const auto* const kRequireCuda =
//       ::testing::AddGlobalTestEnvironment(new ::baton::RequireCudaEnvironment());
namespace baton {
class RequireCudaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { BATON_SKIP_WITHOUT_CUDA_DEVICE(); }
};
}  // namespace baton

// Checks in a death test's child process (EXPECT_EXIT with the threadsafe style, for code
// that breaks the CUDA context): on failure, say what and exit 2.
#define BATON_CHILD_CHECK(cond)                                                     \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::_Exit(2);                                                                \
    }                                                                               \
  } while (false)
#define BATON_CHILD_CHECK_EQ(a, b) BATON_CHILD_CHECK((a) == (b))
#define BATON_CHILD_CHECK_NE(a, b) BATON_CHILD_CHECK((a) != (b))

#endif  // BATON_COMMON_CORE_CUDA_TEST_UTIL_H_
