// Device discovery and a smoke test on the CUDA runtime.
//
// Compiled by nvcc (C++17), so this file includes no Abseil headers: it exposes plain
// functions returning cudaError_t codes and C strings, and cuda_device.cc turns them into
// the absl::Status API of cuda_device.h. Keep the declarations below in sync with the ones
// in cuda_device.cc (a mismatch fails at link time).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace baton::cuda_detail {

int RuntimeDeviceCount();
int RuntimeDeviceCountError();
int RuntimeVersions(int* driver, int* runtime);
int RuntimeDeviceInfo(int index, char* name, int name_capacity, int64_t* total_memory_bytes,
                      int* compute_major, int* compute_minor);
int RuntimeDeviceUuid(int index, char* uuid, int uuid_capacity);
const char* RuntimeErrorName(int error);
const char* RuntimeErrorString(int error);
int RuntimeSelfTest(int index, char* message, int message_capacity);

namespace {

__global__ void AffineKernel(int n, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}

// Frees a device allocation when it goes out of scope.
struct DeviceBuffer {
  float* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

int Fail(cudaError_t err, const char* what, char* message, int capacity) {
  std::snprintf(message, static_cast<size_t>(capacity), "%s: %s (%s)", what,
                cudaGetErrorString(err), cudaGetErrorName(err));
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  return static_cast<int>(err);
}

}  // namespace

int RuntimeDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // cudaErrorNoDevice, cudaErrorInsufficientDriver, a missing driver library...: no
    // usable device. Clear the error so it does not surface from a later call.
    cudaGetLastError();
    return 0;
  }
  return count < 0 ? 0 : count;
}

int RuntimeDeviceInfo(int index, char* name, int name_capacity, int64_t* total_memory_bytes,
                      int* compute_major, int* compute_minor) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return static_cast<int>(err);
  }
  std::snprintf(name, static_cast<size_t>(name_capacity), "%s", prop.name);
  *total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  *compute_major = prop.major;
  *compute_minor = prop.minor;
  return static_cast<int>(cudaSuccess);
}

int RuntimeDeviceUuid(int index, char* uuid, int uuid_capacity) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return static_cast<int>(err);
  }
  // nvidia-smi's and DCGM's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
  const unsigned char* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(uuid, static_cast<size_t>(uuid_capacity),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return static_cast<int>(cudaSuccess);
}

int RuntimeDeviceCountError() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  cudaGetLastError();
  return static_cast<int>(err);
}

int RuntimeVersions(int* driver, int* runtime) {
  *driver = 0;
  *runtime = 0;
  cudaDriverGetVersion(driver);  // 0 without a driver
  const cudaError_t err = cudaRuntimeGetVersion(runtime);
  cudaGetLastError();
  return static_cast<int>(err);
}

const char* RuntimeErrorName(int error) {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}

const char* RuntimeErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

int RuntimeSelfTest(int index, char* message, int message_capacity) {
  message[0] = '\0';
  // `index` stays current afterwards. Restoring the previous device would be wrong: on a
  // thread that never chose one, cudaGetDevice answers 0, and cudaSetDevice(0) then creates
  // a context on GPU 0 (or fails, when GPU 0 is another process's in exclusive mode).
  cudaError_t err = cudaSetDevice(index);
  if (err != cudaSuccess) return Fail(err, "cudaSetDevice", message, message_capacity);

  constexpr int kN = 4099;  // not a multiple of the block size: exercises the bounds check
  const size_t bytes = kN * sizeof(float);
  std::vector<float> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i % 1000) - 500.0f;

  DeviceBuffer a, b, c;
  if ((err = cudaMalloc(&a.ptr, bytes)) != cudaSuccess) {
    return Fail(err, "cudaMalloc", message, message_capacity);
  }
  if ((err = cudaMalloc(&b.ptr, bytes)) != cudaSuccess) {
    return Fail(err, "cudaMalloc", message, message_capacity);
  }
  if ((err = cudaMalloc(&c.ptr, bytes)) != cudaSuccess) {
    return Fail(err, "cudaMalloc", message, message_capacity);
  }
  if ((err = cudaMemset(c.ptr, 0xff, bytes)) != cudaSuccess) {
    return Fail(err, "cudaMemset", message, message_capacity);
  }
  if ((err = cudaMemcpy(a.ptr, host.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
    return Fail(err, "cudaMemcpy host to device", message, message_capacity);
  }
  if ((err = cudaMemcpy(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice)) != cudaSuccess) {
    return Fail(err, "cudaMemcpy device to device", message, message_capacity);
  }

  // Plain round trip first: what went in must come back bit for bit.
  std::vector<float> back(kN, 0.0f);
  if ((err = cudaMemcpy(back.data(), b.ptr, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return Fail(err, "cudaMemcpy device to host", message, message_capacity);
  }
  if (std::memcmp(back.data(), host.data(), bytes) != 0) {
    std::snprintf(message, static_cast<size_t>(message_capacity),
                  "memcpy round trip returned different bytes");
    return -1;
  }

  constexpr int kBlock = 256;
  AffineKernel<<<(kN + kBlock - 1) / kBlock, kBlock>>>(kN, b.ptr, c.ptr);
  if ((err = cudaGetLastError()) != cudaSuccess) {
    return Fail(err, "kernel launch", message, message_capacity);
  }
  if ((err = cudaMemcpy(back.data(), c.ptr, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return Fail(err, "cudaMemcpy device to host after kernel", message, message_capacity);
  }
  for (int i = 0; i < kN; ++i) {
    const float want = 2.0f * host[i] + 1.0f;  // exact in float for these inputs
    if (back[i] != want) {
      std::snprintf(message, static_cast<size_t>(message_capacity),
                    "kernel result mismatch at %d: got %g, want %g", i,
                    static_cast<double>(back[i]), static_cast<double>(want));
      return -1;
    }
  }
  return static_cast<int>(cudaSuccess);
}

}  // namespace baton::cuda_detail
