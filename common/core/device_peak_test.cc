#include "common/core/device_peak.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(DevicePeakTest, KnownGpusByTheNameCudaReports) {
  EXPECT_EQ(GpuPeakFlops("NVIDIA H100 80GB HBM3", PeakPrecision::kFp32), 67e12);
  EXPECT_EQ(GpuPeakEntry("NVIDIA H100 80GB HBM3"), "H100 SXM");
  EXPECT_EQ(GpuPeakEntry("NVIDIA H100 PCIe"), "H100 PCIe");
  EXPECT_EQ(GpuPeakEntry("NVIDIA H100 NVL"), "H100 NVL");
  EXPECT_EQ(GpuPeakFlops("NVIDIA H200", PeakPrecision::kBf16), 989.4e12);
  EXPECT_EQ(GpuPeakFlops("NVIDIA A100-SXM4-40GB", PeakPrecision::kTf32), 156e12);
  // L40S is not the L40, nor the L4.
  EXPECT_EQ(GpuPeakEntry("NVIDIA L40S"), "L40S");
  EXPECT_EQ(GpuPeakEntry("NVIDIA L4"), "L4");
}

TEST(DevicePeakTest, AnUnknownDeviceHasNoPeakRatherThanAGuess) {
  EXPECT_EQ(GpuPeakFlops("Some Future GPU", PeakPrecision::kFp32), 0);
  EXPECT_EQ(GpuPeakEntry("Some Future GPU"), "");
  EXPECT_EQ(GpuPeakFlops("Tesla V100-SXM2-16GB", PeakPrecision::kBf16), 0);  // none
}

TEST(DevicePeakTest, TheCpuIsMeasured) {
  const double flops = MeasureCpuPeakFlops(64, 2);
  EXPECT_GT(flops, 1e6);     // any CPU does a 64^3 GEMM faster than a megaflop
  EXPECT_LT(flops, 1e15);    // and slower than a petaflop
}

}  // namespace
}  // namespace baton
