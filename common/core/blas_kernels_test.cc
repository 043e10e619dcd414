#include "common/core/blas_kernels.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

// The self-test passes on the kernels this process runs, and catches a wrong product: the
// fallback's trigger, injected the way tests/batonctl_train_local_test.sh injects it into
// a whole process.
TEST(BlasKernelsTest, TheSelfTestPassesAndCatchesAWrongProduct) {
  EXPECT_EQ(SelfTestSgemm(), "");
  ASSERT_EQ(setenv("BATON_BLAS_SELFTEST_INJECT", "1", 1), 0);
  const std::string failed = SelfTestSgemm();
  unsetenv("BATON_BLAS_SELFTEST_INJECT");
  EXPECT_THAT(failed, HasSubstr("sgemm 64x64x64: element (32, 0) is"));
  EXPECT_THAT(failed, HasSubstr("a float64 product gives"));
}

TEST(BlasKernelsTest, TheKernelsInUseAreNamed) {
  const BlasKernels& k = CurrentBlasKernels();
  EXPECT_THAT(k.library, HasSubstr("OpenBLAS"));
  EXPECT_FALSE(k.core.empty());
  EXPECT_THAT(k.Describe(), HasSubstr(k.core + " kernels (chosen by "));
}

}  // namespace
}  // namespace baton
