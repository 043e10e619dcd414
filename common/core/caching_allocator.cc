#include "common/core/caching_allocator.h"
#include "common/core/mutex.h"

#include <algorithm>
#include <new>

namespace baton {

namespace {
// Larger requests are refused before rounding could wrap; no system has that much memory.
constexpr size_t kMaxAllocation = size_t{1} << 62;
}  // namespace

CachingAllocator::CachingAllocator(Device device, System system, size_t alignment)
    : device_(device), system_(system), alignment_(alignment) {}

size_t CachingAllocator::Round(size_t bytes) const {
  if (bytes == 0) bytes = 1;
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

void CachingAllocator::Account(size_t rounded) {
  stats_.bytes_in_use += static_cast<int64_t>(rounded);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
}

void* CachingAllocator::Allocate(size_t bytes) {
  if (bytes > kMaxAllocation) return nullptr;
  const size_t rounded = Round(bytes);
  {
    MutexLock lock(mu_);
    auto it = cache_.find(rounded);
    if (it != cache_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.bytes_cached -= static_cast<int64_t>(rounded);
      Account(rounded);
      return p;
    }
  }
  void* p = system_.alloc(rounded);
  if (p == nullptr) {
    if (system_.may_release != nullptr && !system_.may_release()) {
      MutexLock lock(mu_);
      ++stats_.cache_kept;
      return nullptr;
    }
    ReleaseCached();
    p = system_.alloc(rounded);
    if (p == nullptr) return nullptr;
  }
  MutexLock lock(mu_);
  ++stats_.system_allocations;
  Account(rounded);
  return p;
}

void CachingAllocator::Deallocate(void* p, size_t bytes) {
  if (p == nullptr) return;
  const size_t rounded = Round(bytes);
  MutexLock lock(mu_);
  stats_.bytes_in_use -= static_cast<int64_t>(rounded);
  try {
    cache_[rounded].push_back(p);
    stats_.bytes_cached += static_cast<int64_t>(rounded);
  } catch (const std::bad_alloc&) {
    // No memory left even for the cache's own bookkeeping (a job ran the process out of
    // memory and its tensors are being freed while the error unwinds): give the block
    // back instead. Deallocate runs in destructors, so it must not throw.
    system_.free(p);
  }
}

AllocatorStats CachingAllocator::Stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  MutexLock lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

void CachingAllocator::ReleaseCached() {
  if (system_.quiesce != nullptr) system_.quiesce();
  MutexLock lock(mu_);
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) system_.free(p);
  }
  cache_.clear();
  stats_.bytes_cached = 0;
}

}  // namespace baton
