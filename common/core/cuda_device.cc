// The absl::Status face of cuda_device.cu (built only when BATON_HAVE_CUDA is on).
#include "common/core/cuda_device.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace baton {

namespace cuda_detail {
// Defined in cuda_device.cu; keep in sync with the declarations there.
int RuntimeDeviceCount();
int RuntimeDeviceCountError();
int RuntimeVersions(int* driver, int* runtime);
int RuntimeDeviceInfo(int index, char* name, int name_capacity, int64_t* total_memory_bytes,
                      int* compute_major, int* compute_minor);
int RuntimeDeviceUuid(int index, char* uuid, int uuid_capacity);
const char* RuntimeErrorName(int error);
const char* RuntimeErrorString(int error);
int RuntimeSelfTest(int index, char* message, int message_capacity);
}  // namespace cuda_detail

int CudaDeviceCount() { return cuda_detail::RuntimeDeviceCount(); }

std::string CudaAbsenceReason() {
  if (CudaDeviceCount() > 0) return "";
  const int err = cuda_detail::RuntimeDeviceCountError();
  int driver = 0, runtime = 0;
  cuda_detail::RuntimeVersions(&driver, &runtime);
  auto version = [](int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); };
  const std::string name = cuda_detail::RuntimeErrorName(err);
  if (driver == 0) return "no NVIDIA driver (libcuda) is installed";
  if (name == "cudaErrorInsufficientDriver") {
    return absl::StrCat("the NVIDIA driver is too old: it supports CUDA ", version(driver),
                        ", this build needs CUDA ", version(runtime),
                        " (update the driver; CUDA 13 needs 580 or newer)");
  }
  if (name == "cudaErrorNoDevice" || err == 0) {
    return "the NVIDIA driver sees no CUDA device";
  }
  return absl::StrCat("the CUDA runtime finds no usable device: ", name, " (",
                      cuda_detail::RuntimeErrorString(err), ")");
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int index) {
  const int count = CudaDeviceCount();
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", index, " does not exist (", count, " devices present)"));
  }
  char name[256] = {};
  CudaDeviceInfo info;
  info.index = index;
  const int err =
      cuda_detail::RuntimeDeviceInfo(index, name, static_cast<int>(sizeof(name)),
                                     &info.total_memory_bytes, &info.compute_major,
                                     &info.compute_minor);
  if (err != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cudaGetDeviceProperties(", index, "): ", cuda_detail::RuntimeErrorString(err), " (",
        cuda_detail::RuntimeErrorName(err), ")"));
  }
  info.name = name;
  char uuid[64] = {};
  if (cuda_detail::RuntimeDeviceUuid(index, uuid, static_cast<int>(sizeof(uuid))) == 0) {
    info.uuid = uuid;
  }
  return info;
}

absl::Status CudaSelfTest(int index) {
  const int count = CudaDeviceCount();
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", index, " does not exist (", count, " devices present)"));
  }
  char message[512] = {};
  const int err = cuda_detail::RuntimeSelfTest(index, message, static_cast<int>(sizeof(message)));
  if (err != 0) {
    return absl::InternalError(
        absl::StrCat("CUDA self-test on device ", index, " failed: ", message));
  }
  return absl::OkStatus();
}

}  // namespace baton
