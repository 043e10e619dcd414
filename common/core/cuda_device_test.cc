
#include "common/core/cuda_test_util.h"
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdio>
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

[[noreturn]] void SelfTestOnGpuOneInAChild() {
  BATON_CHILD_CHECK(CudaSelfTest(1).ok());
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  BATON_CHILD_CHECK_NE(cuda, nullptr);
  using GetState = int (*)(int, unsigned*, int*);
  using DeviceGet = int (*)(int*, int);
  auto get_state = reinterpret_cast<GetState>(dlsym(cuda, "cuDevicePrimaryCtxGetState"));
  auto device_get = reinterpret_cast<DeviceGet>(dlsym(cuda, "cuDeviceGet"));
  BATON_CHILD_CHECK(get_state != nullptr && device_get != nullptr);
  int dev0 = -1, active = -1;
  unsigned flags = 0;
  BATON_CHILD_CHECK_EQ(device_get(&dev0, 0), 0);
  BATON_CHILD_CHECK_EQ(get_state(dev0, &flags, &active), 0);
  std::fprintf(stderr, "GPU 0 primary context active: %d\n", active);
  std::_Exit(active == 0 ? 0 : 1);
}

// A worker on GPU 1 must not create a context on GPU 0 (in exclusive-process mode that
// fails; otherwise it takes GPU 0's memory from the worker that owns it): the self-test
// leaves its own device current instead of restoring device 0. In a child process, which
// has touched no GPU before; GPU 0's primary context is read through the driver API.
TEST(CudaDeviceTest, SelfTestOnGpuOneCreatesNoContextOnGpuZero) {
  BATON_SKIP_WITHOUT_CUDA_DEVICES(2);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(SelfTestOnGpuOneInAChild(), testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace baton
