// Tensors: a shape, a dtype, a device, and shared storage.
//
// A Tensor is a cheap handle (copying it shares the storage, like a shared_ptr). Memory
// comes from the Allocator of the tensor's device; the CPU allocator caches freed blocks by
// size, so a training loop that allocates the same shapes every micro-batch stops calling
// malloc after its first step (AllocatorStats::system_allocations tells).
//
// Devices: Device::kCpu always has an allocator and a Backend (backend.h); Device::kCuda has
// them in a CUDA build on a machine with a GPU (cuda_context.h: the process computes on one
// GPU, chosen once). Code above this layer never touches device memory except through a
// Backend, and reads or writes it from the host only through CopyTo / CopyFromHost /
// CopyToHost.
//
// Thread safety: a Tensor handle is not synchronised; distinct handles (even to the same
// storage) may be used from different threads if the data itself is not raced on.
// Allocators are thread-safe.
#ifndef BATON_COMMON_CORE_TENSOR_H_
#define BATON_COMMON_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"

namespace baton {

enum class Device : uint8_t { kCpu = 0, kCuda = 1 };
// kBFloat16 is storage only (common/core/bf16.h): kernels compute in float32, and bf16
// tensors exist to carry bf16 values between stages and in checkpoints' exports.
enum class DType : uint8_t { kFloat32 = 0, kInt32 = 1, kBFloat16 = 2 };

const char* DeviceName(Device d);
const char* DTypeName(DType t);
size_t DTypeSize(DType t);

using Shape = absl::InlinedVector<int64_t, 4>;
std::string ShapeString(const Shape& s);
int64_t NumElements(const Shape& s);

struct AllocatorStats {
  int64_t bytes_in_use = 0;        // held by live tensors
  int64_t peak_bytes_in_use = 0;   // high-water mark of bytes_in_use
  int64_t bytes_cached = 0;        // freed by tensors, kept for reuse
  int64_t system_allocations = 0;  // calls that reached the system allocator
  // Failed allocations that could not give the cache back first (CachingAllocator's
  // MayRelease said no: NCCL communicators were live on the GPU).
  int64_t cache_kept = 0;
};

// Hands out device memory aligned to 64 bytes. Thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns nullptr only when the device is out of memory.
  virtual void* Allocate(size_t bytes) = 0;
  // `bytes` must be the size passed to the Allocate call that returned `p`.
  virtual void Deallocate(void* p, size_t bytes) = 0;
  virtual AllocatorStats Stats() const = 0;
  // Restarts the high-water mark from what is in use now (to measure one step's peak).
  virtual void ResetPeak() = 0;
  // Returns cached blocks to the system.
  virtual void ReleaseCached() = 0;
};

// Waits for the work issued on `device` and returns the first error it hit since the last
// call (OK for the CPU, whose work is synchronous).
absl::Status DeviceSynchronize(Device device);

class Tensor;
// Writes dst.numel() host floats from `src`, each rounded to its bf16 bits (round to
// nearest even, common/core/bf16.h), into the kBFloat16 tensor `dst` on any device (a
// device's through host memory). INVALID_ARGUMENT when `dst` is not bf16.
absl::Status CopyFromHostAsBf16(const float* src, Tensor& dst);

// The process-wide caching CPU allocator.
Allocator* CpuAllocator();
// The allocator of `device`, or nullptr when this build or machine has none for it.
Allocator* AllocatorFor(Device device);
// Host memory for staging device tensors (transport buffers): page-locked once this process
// computes on CUDA, else CpuAllocator(). Tensors from it are Device::kCpu tensors.
Allocator* HostStagingAllocator();

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage, numel() == 0

  // Uninitialised contents. Aborts if the device has no allocator or is out of memory;
  // use TryEmpty where that must be reported instead.
  static Tensor Empty(const Shape& shape, DType dtype = DType::kFloat32,
                      Device device = Device::kCpu);
  static absl::StatusOr<Tensor> TryEmpty(const Shape& shape, DType dtype = DType::kFloat32,
                                         Device device = Device::kCpu);
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kFloat32,
                      Device device = Device::kCpu);
  // TryEmpty from a given allocator, on its device.
  static absl::StatusOr<Tensor> TryEmptyWith(Allocator* allocator, const Shape& shape,
                                             DType dtype = DType::kFloat32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return defined() ? NumElements(shape_) : 0; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // Typed access to the first element. The dtype must match (checked in debug builds).
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;
  uint16_t* bf16();  // the raw bf16 bits
  const uint16_t* bf16() const;
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // Same storage, new shape with the same element count.
  absl::StatusOr<Tensor> Reshape(const Shape& shape) const;
  // A deep copy on the same device. Aborts where TryEmpty would fail; use CopyTo(device())
  // where that must be reported instead.
  Tensor Clone() const;
  // A deep copy on `device` (on the same device too: never shares storage). An undefined
  // tensor gives an undefined one. RESOURCE_EXHAUSTED when `device` is out of memory.
  absl::StatusOr<Tensor> CopyTo(Device device) const;
  // This tensor if it already lives on `device`, else CopyTo(device).
  absl::StatusOr<Tensor> On(Device device) const;
  // This tensor if it lives on the host, else a copy in HostStagingAllocator() memory.
  absl::StatusOr<Tensor> StagedOnHost() const;
  // Copies nbytes() from / to host memory (the tensor on any device).
  absl::Status CopyFromHost(const void* src);
  absl::Status CopyToHost(void* dst) const;
  // Copies `bytes` from host memory into this tensor's bytes [offset, offset + bytes);
  // OUT_OF_RANGE when that range is not within nbytes().
  absl::Status CopyFromHost(const void* src, size_t offset, size_t bytes);
  // Sets every byte to zero (on a device, in its stream order).
  void SetZero();

  std::string DebugString() const;  // "f32[2,3]@cpu"

 private:
  struct Storage;
  // Copies this tensor's bytes into `dst` (a fresh tensor of the same shape, or an error).
  absl::StatusOr<Tensor> CopyInto(absl::StatusOr<Tensor> dst) const;

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::kCpu;
};

}  // namespace baton

#endif  // BATON_COMMON_CORE_TENSOR_H_
