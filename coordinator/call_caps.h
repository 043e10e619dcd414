// Caps on calls that hold a server thread and a client's attention for long (watch streams,
// exports): at most so many at once in all and per caller, and the next refused at once
// with RESOURCE_EXHAUSTED naming the cap that is full. One busy caller then cannot take
// every server thread, nor lock out the others.
//
// Thread-safe: a mutex of its own, held only to count (never across a call).
#ifndef BATON_COORDINATOR_CALL_CAPS_H_
#define BATON_COORDINATOR_CALL_CAPS_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/core/mutex.h"

namespace baton {

class CallCaps {
 public:
  // `what` names the calls in refusals ("watch streams", "exports"). Caps below 1 are
  // taken as 1.
  CallCaps(std::string what, int total, int per_caller);
  CallCaps(const CallCaps&) = delete;
  CallCaps& operator=(const CallCaps&) = delete;

  // A call's place under the caps, given back when the Slot is destroyed (however the call
  // ends). Move-only; the CallCaps must outlive it. A default-constructed one holds nothing.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    ~Slot();

   private:
    friend class CallCaps;
    Slot(CallCaps* caps, std::string caller) : caps_(caps), caller_(std::move(caller)) {}
    void Release();
    CallCaps* caps_ = nullptr;
    std::string caller_;
  };

  // A place for one more call of `caller` (a name that tells callers apart: "caller alice",
  // "client host ipv4:10.0.0.7"), or RESOURCE_EXHAUSTED saying which cap is full, how many
  // calls hold it, and to retry later.
  absl::StatusOr<Slot> Acquire(const std::string& caller);

  // Calls holding a place now.
  int in_use() const;

 private:
  const std::string what_;
  const int total_;
  const int per_caller_;
  mutable Mutex mu_;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> by_caller_ ABSL_GUARDED_BY(mu_);  // callers holding any
};

}  // namespace baton

#endif  // BATON_COORDINATOR_CALL_CAPS_H_
