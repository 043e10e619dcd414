// A caching allocator over a system allocator: freed blocks are kept by their rounded size
// and handed out again for the same size, so a training step that repeats the previous
// one's shapes reaches the system allocator only in its first step
// (AllocatorStats::system_allocations tells). Shapes repeat exactly from micro-batch to
// micro-batch, so exact-size reuse is enough and never wastes memory on splitting.
//
// The CPU allocator, the CUDA device allocator and the CUDA page-locked host allocator are
// this class over malloc, cudaMalloc and cudaHostAlloc.
//
// Thread-safe: every method may be called from any thread.
#ifndef BATON_COMMON_CORE_CACHING_ALLOCATOR_H_
#define BATON_COMMON_CORE_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "common/core/tensor.h"
#include "common/core/mutex.h"

namespace baton {

class CachingAllocator final : public Allocator {
 public:
  // What the cache sits on. Alloc returns nullptr when out of memory (and never aborts);
  // Free takes back what Alloc returned; Quiesce, when given, is called before cached
  // blocks go back to the system (a device waits there for work that may still use them).
  // MayRelease, when given, says whether a failed Alloc may give the cache back and try
  // again now (a GPU's may not while NCCL kernels wait for peers: cudaFree would wait for
  // them); when it says no, Allocate fails and counts a kept cache.
  struct System {
    void* (*alloc)(size_t bytes) = nullptr;
    void (*free)(void* p) = nullptr;
    void (*quiesce)() = nullptr;
    bool (*may_release)() = nullptr;
  };

  // Blocks are `alignment`-aligned multiples of it (a power of two).
  CachingAllocator(Device device, System system, size_t alignment);

  Device device() const override { return device_; }
  // A miss that the system cannot serve gives the cache back and tries once more.
  void* Allocate(size_t bytes) override;
  void Deallocate(void* p, size_t bytes) override;
  AllocatorStats Stats() const override;
  void ResetPeak() override;
  void ReleaseCached() override;

 private:
  size_t Round(size_t bytes) const;
  void Account(size_t rounded);  // requires mu_

  const Device device_;
  const System system_;
  const size_t alignment_;
  // baton::Mutex (a std::mutex) rather than absl::Mutex: Debian's prebuilt Abseil is not instrumented for
  // ThreadSanitizer, which would then report false races on everything it guards.
  mutable Mutex mu_;
  std::map<size_t, std::vector<void*>> cache_;  // guarded by mu_
  AllocatorStats stats_;                        // guarded by mu_
};

}  // namespace baton

#endif  // BATON_COMMON_CORE_CACHING_ALLOCATOR_H_
