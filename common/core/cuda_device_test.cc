
#include "common/core/cuda_test_util.h"
#include <gtest/gtest.h>

#include <cstdlib>

namespace baton {
namespace {


TEST(CudaDeviceTest, NoDeviceMeansZeroNotError) {
  // Runs everywhere: the count is never negative, and a build without CUDA reports none.
  const int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  if (!BuiltWithCuda()) {
    EXPECT_EQ(count, 0);
    EXPECT_EQ(GetCudaDeviceInfo(0).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(CudaSelfTest(0).code(), absl::StatusCode::kUnavailable);
  } else {
    // An index past the last device is bad input, whether or not any device exists.
    EXPECT_EQ(GetCudaDeviceInfo(count).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(GetCudaDeviceInfo(-1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(CudaSelfTest(count).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(CudaDeviceTest, DeviceZeroInfo) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->index, 0);
  EXPECT_FALSE(info->name.empty());
  EXPECT_GT(info->total_memory_bytes, 0);
  EXPECT_GT(info->compute_major, 0);
  EXPECT_GE(info->compute_minor, 0);
  EXPECT_EQ(info->uuid.size(), 40u) << info->uuid;
  EXPECT_EQ(info->uuid.rfind("GPU-", 0), 0u) << info->uuid;
}

TEST(CudaDeviceTest, EveryDeviceHasInfo) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  for (int i = 0; i < CudaDeviceCount(); ++i) {
    const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(i);
    ASSERT_TRUE(info.ok()) << "device " << i << ": " << info.status();
    EXPECT_EQ(info->index, i);
    EXPECT_FALSE(info->name.empty());
  }
}

TEST(CudaDeviceTest, MemcpyRoundTripAndKernel) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  const absl::Status st = CudaSelfTest(0);
  EXPECT_TRUE(st.ok()) << st;
  // Twice: the first run must leave the device usable.
  const absl::Status again = CudaSelfTest(0);
  EXPECT_TRUE(again.ok()) << again;
}

}  // namespace
}  // namespace baton
