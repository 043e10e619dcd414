#include "common/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/bf16.h"
#include "common/core/caching_allocator.h"
#include "common/core/check.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_device.h"

namespace baton {

const char* DeviceName(Device d) {
  switch (d) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown";
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "f32";
    case DType::kInt32:
      return "i32";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

std::string ShapeString(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

namespace {

void* CpuSystemAlloc(size_t bytes) { return std::aligned_alloc(64, bytes); }
void CpuSystemFree(void* p) { std::free(p); }

}  // namespace

Allocator* CpuAllocator() {
  static Allocator* const allocator = new CachingAllocator(
      Device::kCpu, CachingAllocator::System{CpuSystemAlloc, CpuSystemFree, nullptr}, 64);
  return allocator;
}

Allocator* AllocatorFor(Device device) {
  switch (device) {
    case Device::kCpu:
      return CpuAllocator();
    case Device::kCuda:
      return CudaAllocator();  // nullptr without CUDA or without a device
  }
  return nullptr;
}

Allocator* HostStagingAllocator() {
  Allocator* pinned = CudaPinnedHostAllocator();
  return pinned != nullptr ? pinned : CpuAllocator();
}

std::unique_ptr<DeviceTimer> NewDeviceTimer(Device device) {
  return device == Device::kCuda ? NewCudaTimer() : nullptr;
}

absl::Status DeviceSynchronize(Device device) {
  return device == Device::kCpu ? absl::OkStatus() : CudaSynchronize();
}

absl::Status CopyFromHostAsBf16(const float* src, Tensor& dst) {
  if (dst.dtype() != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("rounding to bf16 into a ", DTypeName(dst.dtype()), " tensor"));
  }
  const size_t n = static_cast<size_t>(dst.numel());
  if (dst.device() == Device::kCpu) {
    for (size_t i = 0; i < n; ++i) dst.bf16()[i] = FloatToBf16Bits(src[i]);
    return absl::OkStatus();
  }
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = FloatToBf16Bits(src[i]);
  return dst.CopyFromHost(bits.data());
}

namespace {

// Copies `bytes` from (src_device, src) to (dst_device, dst); synchronous.
absl::Status CopyBytes(Device dst_device, void* dst, Device src_device, const void* src,
                       size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device == Device::kCpu && src_device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  const CopyKind kind = src_device == Device::kCpu   ? CopyKind::kHostToDevice
                        : dst_device == Device::kCpu ? CopyKind::kDeviceToHost
                                                     : CopyKind::kDeviceToDevice;
  return CudaCopy(dst, src, bytes, kind);
}

}  // namespace

struct Tensor::Storage {
  Storage(Allocator* a, void* p, size_t n) : allocator(a), data(p), bytes(n) {}
  ~Storage() { allocator->Deallocate(data, bytes); }
  Allocator* const allocator;
  void* const data;
  const size_t bytes;
};

absl::StatusOr<Tensor> Tensor::TryEmpty(const Shape& shape, DType dtype, Device device) {
  Allocator* allocator = AllocatorFor(device);
  if (allocator == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no ", DeviceName(device), " memory: ",
        device == Device::kCuda && BuiltWithCuda() ? "no CUDA device found" : "not in this build"));
  }
  return TryEmptyWith(allocator, shape, dtype);
}

absl::StatusOr<Tensor> Tensor::TryEmptyWith(Allocator* allocator, const Shape& shape,
                                            DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape ", ShapeString(shape), " has a negative dimension"));
    }
  }
  const Device device = allocator->device();
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  void* p = allocator->Allocate(bytes);
  if (p == nullptr) {
    const AllocatorStats st = allocator->Stats();
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of ", DeviceName(device), " memory allocating ", bytes, " bytes for ",
        DTypeName(dtype), ShapeString(shape), " (", st.bytes_in_use, " bytes in use",
        st.cache_kept > 0 && st.bytes_cached > 0
            ? absl::StrCat("; ", st.bytes_cached,
                           " bytes cached were kept: giving them back would wait for the "
                           "NCCL kernels in flight")
            : std::string(),
        ")"));
  }
  Tensor t;
  t.storage_ = std::make_shared<Storage>(allocator, p, bytes);
  t.data_ = p;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  absl::StatusOr<Tensor> t = TryEmpty(shape, dtype, device);
  BATON_CHECK_OK(t.status());
  return *std::move(t);
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = Empty(shape, dtype, device);
  t.SetZero();
  return t;
}

float* Tensor::f32() {
  BATON_DCHECK(dtype_ == DType::kFloat32);
  return static_cast<float*>(data_);
}
const float* Tensor::f32() const {
  BATON_DCHECK(dtype_ == DType::kFloat32);
  return static_cast<const float*>(data_);
}
int32_t* Tensor::i32() {
  BATON_DCHECK(dtype_ == DType::kInt32);
  return static_cast<int32_t*>(data_);
}
const int32_t* Tensor::i32() const {
  BATON_DCHECK(dtype_ == DType::kInt32);
  return static_cast<const int32_t*>(data_);
}

uint16_t* Tensor::bf16() {
  BATON_DCHECK(dtype_ == DType::kBFloat16);
  return static_cast<uint16_t*>(data_);
}
const uint16_t* Tensor::bf16() const {
  BATON_DCHECK(dtype_ == DType::kBFloat16);
  return static_cast<const uint16_t*>(data_);
}

absl::StatusOr<Tensor> Tensor::Reshape(const Shape& shape) const {
  if (NumElements(shape) != numel()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", DebugString(), " to ",
                                                   ShapeString(shape)));
  }
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::Clone() const {
  absl::StatusOr<Tensor> t = CopyTo(device_);
  BATON_CHECK_OK(t.status());
  return *std::move(t);
}

absl::StatusOr<Tensor> Tensor::CopyTo(Device device) const {
  if (!defined()) return *this;  // undefined: nothing to copy
  return CopyInto(TryEmpty(shape_, dtype_, device));
}

absl::StatusOr<Tensor> Tensor::CopyInto(absl::StatusOr<Tensor> dst) const {
  if (!dst.ok()) return dst.status();
  absl::Status st = CopyBytes(dst->device_, dst->data_, device_, data_, nbytes());
  if (!st.ok()) return st;
  return dst;
}

absl::StatusOr<Tensor> Tensor::StagedOnHost() const {
  if (!defined() || device_ == Device::kCpu) return *this;
  return CopyInto(TryEmptyWith(HostStagingAllocator(), shape_, dtype_));
}

absl::StatusOr<Tensor> Tensor::On(Device device) const {
  if (!defined() || device == device_) return *this;
  return CopyTo(device);
}

absl::Status Tensor::CopyFromHost(const void* src) {
  return CopyBytes(device_, data_, Device::kCpu, src, nbytes());
}

absl::Status Tensor::CopyFromHost(const void* src, size_t offset, size_t bytes) {
  if (offset > nbytes() || bytes > nbytes() - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("bytes [", offset, ", ", offset + bytes, ") are not within ", DebugString()));
  }
  return CopyBytes(device_, static_cast<char*>(data_) + offset, Device::kCpu, src, bytes);
}

absl::Status Tensor::CopyToHost(void* dst) const {
  return CopyBytes(Device::kCpu, dst, device_, data_, nbytes());
}

void Tensor::SetZero() {
  if (!defined()) return;
  if (device_ == Device::kCpu) {
    std::memset(data_, 0, nbytes());
    return;
  }
  // Asynchronous on the device; a failure is sticky and surfaces at the next copy.
  (void)CudaZero(data_, nbytes());
}

std::string Tensor::DebugString() const {
  if (!defined()) return "undefined";
  return absl::StrCat(DTypeName(dtype_), ShapeString(shape_), "@", DeviceName(device_));
}

}  // namespace baton
