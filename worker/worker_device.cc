#include "worker/worker_device.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/blas_kernels.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_device.h"
#include "common/core/device_peak.h"
#include "common/core/host_info.h"
#include "common/spec/spec.h"

namespace baton {

absl::StatusOr<baton::v1::DeviceInfo> ClaimDevice(const std::string& flag) {
  Device device = Device::kCpu;
  int index = 0;
  if (flag.empty()) {
    device = CudaDeviceCount() > 0 ? Device::kCuda : Device::kCpu;
  } else if (absl::Status s = ParseDeviceName(flag, &device, &index); !s.ok()) {
    return s;
  }
  baton::v1::DeviceInfo info;
  if (device == Device::kCpu) {
    info.set_kind("cpu");
    info.set_name(CpuModelName());
    // What this process may still allocate: under an address-space, data or cgroup limit,
    // less than the host's RAM (the coordinator places only what fits).
    info.set_memory_bytes(UsableMemoryBytes());
    info.set_kernels(CurrentBlasKernels().Describe());
    info.set_threads(BlasThreads());
    // No datasheet for a CPU: its peak is measured, here, once (a few milliseconds), on
    // the kernels and threads its jobs use.
    info.set_peak_flops(MeasureCpuPeakFlops());
    info.set_peak_flops_bf16(MeasureCpuPeakFlopsBf16());
    return info;
  }
  absl::StatusOr<CudaDeviceInfo> cuda = GetCudaDeviceInfo(index);
  if (!cuda.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cuda:", index, ": ", cuda.status().message()));
  }
  if (absl::Status s = SetCudaDevice(index); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cuda:", index, ": ", s.message()));
  }
  if (absl::Status s = CudaSelfTest(index); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cuda:", index, ": ", s.message()));
  }
  info.set_kind("cuda");
  info.set_name(cuda->name);
  info.set_memory_bytes(cuda->total_memory_bytes);
  info.set_index(index);
  info.set_compute_capability(absl::StrCat(cuda->compute_major, ".", cuda->compute_minor));
  info.set_uuid(cuda->uuid);
  // fp32 with TF32 off is what baton computes on a GPU today.
  info.set_peak_flops(GpuPeakFlops(cuda->name, PeakPrecision::kFp32));
  info.set_peak_flops_bf16(GpuPeakFlops(cuda->name, PeakPrecision::kBf16));
  return info;
}

}  // namespace baton
