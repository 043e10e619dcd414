// The process's CUDA device: what the CUDA backend, the CUDA allocator and device copies
// share.
//
// One GPU per process (a worker owns one; `batonctl train-local --device cuda:N` picks
// one), chosen once with SetCudaDevice before the first CUDA tensor. Every kernel, cuBLAS
// call and copy runs on one stream of that device, in the order the host issues them, so
// work issued by different host threads (the stage threads of an in-process pipeline) is
// ordered by issue, and memory a freed tensor gave back can be reused at once by the next
// allocation (stream order keeps the earlier kernels first). Host code reads device bytes
// only through CudaCopy/CudaSynchronize, which wait for the stream.
//
// Errors: a failed CUDA call returns INTERNAL naming the call and the CUDA error; a kernel
// fault is sticky in CUDA and surfaces at the next synchronising call. Out of device memory
// is not an error here: the allocator returns nullptr and Tensor::TryEmpty turns it into
// RESOURCE_EXHAUSTED naming the bytes and the device.
//
// In a build without CUDA (BATON_HAVE_CUDA undefined) the functions below are inline
// fallbacks: no allocator, no backend, UNAVAILABLE.
//
// Thread safety: every function may be called from any thread.
// The locks behind them (cuda_kernels.cu) are baton::Mutex with their members annotated,
// but clang's thread-safety analysis (scripts/check-thread-safety.py) does not reach them:
// nvcc compiles that file with GCC as its host compiler, which ignores the annotations, and
// Debian's clang 14 cannot parse CUDA 13's headers. Host state that needs more locking than
// the context's start and the cuBLAS handle belongs in a .cc file, where the analysis runs.
#ifndef BATON_COMMON_CORE_CUDA_CONTEXT_H_
#define BATON_COMMON_CORE_CUDA_CONTEXT_H_

#include <cstddef>

#include <memory>

#include "absl/status/status.h"
#include "common/core/device_timer.h"
#include "common/core/tensor.h"

namespace baton {

class Backend;

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

#ifdef BATON_HAVE_CUDA

// Selects the CUDA device this process computes on (default 0). INVALID_ARGUMENT when it
// does not exist; FAILED_PRECONDITION once CUDA memory was allocated on another device.
absl::Status SetCudaDevice(int index);
// The device chosen (0 unless SetCudaDevice said otherwise).
int CurrentCudaDevice();

// NCCL communicators of this process that may have kernels waiting for a peer on the
// device: the NCCL transport and engine add theirs when they come up (+1) and take them
// away once they are gone (-1). While any is live the device and pinned allocators keep
// their caches when an allocation fails, and the allocation fails (RESOURCE_EXHAUSTED,
// saying so): giving the cache back (cudaFree) would wait for the whole device, so for
// those kernels, whose peers may be waiting for this process.
void AddLiveNcclCommunicators(int delta);
int LiveNcclCommunicators();

// The caching allocator of the current device's memory, or nullptr when no CUDA device is
// present. Like the CPU allocator it caches freed blocks by size; ReleaseCached frees them.
Allocator* CudaAllocator();
// Page-locked host memory, cached like the device allocator (tensors on Device::kCpu), for
// staging device tensors on the host: copies from and to it run at full PCIe speed.
// nullptr until this process has allocated device memory (a CPU process never pins).
Allocator* CudaPinnedHostAllocator();

// The CUDA backend (backend.h) on the current device, or nullptr when no device is present.
Backend* CudaBackend();

// Copies `bytes` on the process stream and waits for it (and so for all work issued before).
absl::Status CudaCopy(void* dst, const void* src, size_t bytes, CopyKind kind);
// Copies `bytes` of device memory on the process stream, in stream order (does not wait:
// the host must not read either side before a synchronising call).
absl::Status CudaCopyDeviceAsync(void* dst, const void* src, size_t bytes);
// Sets `bytes` of device memory to zero, in stream order (does not wait).
absl::Status CudaZero(void* p, size_t bytes);
// Waits for all work issued so far; returns the first error this thread's calls and
// launches hit since its last call (and forgets it), or the device fault, if any.
absl::Status CudaSynchronize();
// OK, or the fault that broke this process's CUDA context (an illegal address, a failed
// launch, an uncorrectable ECC error...): from then on nothing can run on the GPU in this
// process, which should leave (a worker exits so that its supervisor restarts it).
absl::Status CudaDeviceFault();

// The process's compute stream, as an opaque cudaStream_t (for code that orders its own
// streams after it, like the NCCL transport); nullptr when it cannot be created.
void* CudaComputeStream();

// A DeviceTimer on the compute stream (CUDA events), or nullptr when no device is present.
std::unique_ptr<DeviceTimer> NewCudaTimer();

// Queues dst[i] = ((src[i] + src[n + i]) + ...) over `members` blocks of n floats, in block
// order, on `stream` (an opaque cudaStream_t of this process's device, SetCudaDevice);
// device pointers. It makes that device current on the calling thread first, whatever
// device was current there. The data-parallel ordered sum on a GPU (common/collective).
// INTERNAL when the launch fails or the CUDA context cannot start.
absl::Status CudaOrderedSumAsync(float* dst, const float* src, int members, int64_t n,
                                 void* stream);

#else  // !BATON_HAVE_CUDA
inline absl::Status CudaDeviceFault() { return absl::OkStatus(); }

inline void AddLiveNcclCommunicators(int /*delta*/) {}
inline int LiveNcclCommunicators() { return 0; }

inline absl::Status SetCudaDevice(int /*index*/) {
  return absl::UnavailableError("built without CUDA");
}
inline int CurrentCudaDevice() { return 0; }
inline Allocator* CudaAllocator() { return nullptr; }
inline Allocator* CudaPinnedHostAllocator() { return nullptr; }
inline Backend* CudaBackend() { return nullptr; }
inline absl::Status CudaCopy(void*, const void*, size_t, CopyKind) {
  return absl::UnavailableError("built without CUDA");
}
inline absl::Status CudaCopyDeviceAsync(void*, const void*, size_t) {
  return absl::UnavailableError("built without CUDA");
}
inline absl::Status CudaZero(void*, size_t) { return absl::UnavailableError("built without CUDA"); }
inline absl::Status CudaSynchronize() { return absl::UnavailableError("built without CUDA"); }
inline void* CudaComputeStream() { return nullptr; }
inline std::unique_ptr<DeviceTimer> NewCudaTimer() { return nullptr; }
inline absl::Status CudaOrderedSumAsync(float*, const float*, int, int64_t, void*) {
  return absl::UnavailableError("built without CUDA");
}

#endif  // BATON_HAVE_CUDA

}  // namespace baton

#endif  // BATON_COMMON_CORE_CUDA_CONTEXT_H_
