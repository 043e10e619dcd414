// The CUDA seam: which CUDA devices this process can use.
//
// Every function here is safe to call in any build and on any machine. A build without CUDA
// (BATON_HAVE_CUDA undefined) gets the inline fallbacks below: no devices, and
// GetCudaDeviceInfo/CudaSelfTest say UNAVAILABLE. A CUDA build on a machine with no driver
// or no device also reports zero devices rather than an error, so callers (and tests) branch
// on CudaDeviceCount() alone.
//
// The device code lives in cuda_device.cu, compiled by nvcc as C++17 with no Abseil
// headers; cuda_device.cc wraps it in this Abseil-based API.
#ifndef BATON_COMMON_CORE_CUDA_DEVICE_H_
#define BATON_COMMON_CORE_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int64_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and DCGM spell it.
  std::string uuid;
};

#ifdef BATON_HAVE_CUDA

// Whether this binary was built with the CUDA pieces.
inline constexpr bool BuiltWithCuda() { return true; }
// Number of usable CUDA devices; 0 when this build has no CUDA, no driver is loaded, or no
// device is present (never an error).
int CudaDeviceCount();
// Why CudaDeviceCount() is 0, in words ("the NVIDIA driver is too old: it supports CUDA
// 12.4, this build needs CUDA 13.0 ..."), or "" when there is a device.
std::string CudaAbsenceReason();
// Properties of device `index`: INVALID_ARGUMENT for an index outside
// [0, CudaDeviceCount()), UNAVAILABLE when the runtime fails.
absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int index);
// A smoke test of device `index`: copies a small buffer host -> device, runs a kernel on it,
// copies it back and checks the values. INTERNAL with the CUDA error on failure. Leaves
// `index` the calling thread's current device (and touches no other device).
absl::Status CudaSelfTest(int index = 0);

#else  // !BATON_HAVE_CUDA

inline constexpr bool BuiltWithCuda() { return false; }
inline int CudaDeviceCount() { return 0; }
inline std::string CudaAbsenceReason() { return "this build has no CUDA"; }
inline absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int /*index*/) {
  return absl::UnavailableError("built without CUDA");
}
inline absl::Status CudaSelfTest(int /*index*/ = 0) {
  return absl::UnavailableError("built without CUDA");
}

#endif  // BATON_HAVE_CUDA

}  // namespace baton

#endif  // BATON_COMMON_CORE_CUDA_DEVICE_H_
