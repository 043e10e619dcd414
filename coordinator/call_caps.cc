#include "coordinator/call_caps.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton {

CallCaps::CallCaps(std::string what, int total, int per_caller)
    : what_(std::move(what)), total_(std::max(total, 1)), per_caller_(std::max(per_caller, 1)) {}

absl::StatusOr<CallCaps::Slot> CallCaps::Acquire(const std::string& caller) {
  MutexLock lock(mu_);
  if (in_use_ >= total_) {
    return absl::ResourceExhaustedError(absl::StrCat("too many ", what_, " at once (", in_use_,
                                                     "; the limit is ", total_,
                                                     "): retry later"));
  }
  const auto it = by_caller_.find(caller);
  if (it != by_caller_.end() && it->second >= per_caller_) {
    return absl::ResourceExhaustedError(absl::StrCat("too many ", what_, " for ", caller, " (",
                                                     it->second,
                                                     " at once; the limit per caller is ",
                                                     per_caller_, "): retry later"));
  }
  ++by_caller_[caller];
  ++in_use_;
  return Slot(this, caller);
}

int CallCaps::in_use() const {
  MutexLock lock(mu_);
  return in_use_;
}

CallCaps::Slot::Slot(Slot&& other) noexcept
    : caps_(std::exchange(other.caps_, nullptr)), caller_(std::move(other.caller_)) {}

CallCaps::Slot& CallCaps::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    caps_ = std::exchange(other.caps_, nullptr);
    caller_ = std::move(other.caller_);
  }
  return *this;
}

CallCaps::Slot::~Slot() { Release(); }

void CallCaps::Slot::Release() {
  if (caps_ == nullptr) return;
  MutexLock lock(caps_->mu_);
  --caps_->in_use_;
  if (--caps_->by_caller_[caller_] == 0) caps_->by_caller_.erase(caller_);
  caps_ = nullptr;
}

}  // namespace baton
