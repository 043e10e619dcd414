#include "common/core/part_profiler.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(PartProfilerTest, EachCallCountsInItsPartAndGivesTheBackendsBits) {
  PartProfiler profiler(CpuBackend(), /*vocab=*/7);
  const int64_t m = 5, n = 7, k = 3;
  std::vector<float> a(m * k), b(k * n), c1(m * n), c2(m * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.1f * static_cast<float>(i) - 0.4f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.3f - 0.05f * static_cast<float>(i);
  CpuBackend()->Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c1.data(), n);
  profiler.Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c2.data(), n);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0);
  // n is the vocabulary's size: the LM head's. The transposed product (k = 7) too.
  profiler.Gemm(true, false, k, k, n, 1.0f, c2.data(), k, c2.data(), k, 0.0f, c1.data(), k);
  profiler.Gemm(false, false, m, k, k, 1.0f, a.data(), k, a.data(), k, 0.0f, c1.data(), k);
  profiler.Add(4, a.data(), a.data(), c1.data());
  EXPECT_EQ(profiler.Sum(4, a.data()), CpuBackend()->Sum(4, a.data()));
  ASSERT_TRUE(profiler.Collect().ok());
  const auto& t = profiler.totals();
  EXPECT_EQ(t[static_cast<int>(StepPart::kHeadGemm)].calls, 2);
  EXPECT_EQ(t[static_cast<int>(StepPart::kGemm)].calls, 1);
  EXPECT_EQ(t[static_cast<int>(StepPart::kElementwise)].calls, 1);
  EXPECT_EQ(t[static_cast<int>(StepPart::kSums)].calls, 1);
  EXPECT_EQ(t[static_cast<int>(StepPart::kAttention)].calls, 0);
  // Per kernel within each part: the same calls.
  EXPECT_EQ(profiler.kernels(StepPart::kHeadGemm).at("Gemm").calls, 2);
  EXPECT_EQ(profiler.kernels(StepPart::kGemm).at("Gemm").calls, 1);
  EXPECT_EQ(profiler.kernels(StepPart::kGemm).size(), 1u);
  EXPECT_EQ(profiler.kernels(StepPart::kElementwise).at("Add").calls, 1);
  EXPECT_EQ(profiler.kernels(StepPart::kSums).at("Sum").calls, 1);
  EXPECT_TRUE(profiler.kernels(StepPart::kAttention).empty());
  profiler.ResetTotals();
  EXPECT_EQ(profiler.kernels(StepPart::kGemm).at("Gemm").calls, 0);
  EXPECT_EQ(profiler.totals()[static_cast<int>(StepPart::kGemm)].calls, 0);
  EXPECT_STREQ(StepPartName(StepPart::kHeadGemm), "lm-head gemm");
}

TEST(PartProfilerTest, TheOverrideIsWhatBackendForReturnsUntilRemoved) {
  PartProfiler profiler(CpuBackend(), 0);
  SetBackendOverride(Device::kCpu, &profiler);
  absl::StatusOr<Backend*> be = BackendFor(Device::kCpu);
  SetBackendOverride(Device::kCpu, nullptr);
  ASSERT_TRUE(be.ok());
  EXPECT_EQ(*be, &profiler);
  be = BackendFor(Device::kCpu);
  ASSERT_TRUE(be.ok());
  EXPECT_EQ(*be, CpuBackend());
}

}  // namespace
}  // namespace baton
