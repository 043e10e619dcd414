// Device time of work issued to a device's stream.
//
// On a GPU the host only issues work: the wall time around an action is its issue time, not
// its kernel time. A DeviceTimer marks points in the stream's order while the host issues
// work (CUDA events); once the stream has passed them, the device time between two marks
// can be read. The stage executor marks each compute action and the optimizer step and
// reads them when the step ends (ActionTiming::device_ns).
//
// Thread safety: one timer belongs to one thread (an executor's).
#ifndef BATON_COMMON_CORE_DEVICE_TIMER_H_
#define BATON_COMMON_CORE_DEVICE_TIMER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/core/tensor.h"

namespace baton {

class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  // Forgets every mark (the start of a step); their resources are reused.
  virtual void Reset() = 0;
  // Records a point in the stream's order. Returns its index (0, 1, ... since Reset), or -1
  // when it could not (the caller then has no device time for that interval).
  virtual int Mark() = 0;
  // Device nanoseconds from mark `from` to mark `to`; waits for the stream to reach `to`.
  // INVALID_ARGUMENT for an index not marked since Reset.
  virtual absl::StatusOr<int64_t> ElapsedNs(int from, int to) = 0;
};

// A timer on `device`'s stream, or nullptr where there is nothing to add to wall time (the
// CPU computes synchronously) or no device to time.
std::unique_ptr<DeviceTimer> NewDeviceTimer(Device device);

}  // namespace baton

#endif  // BATON_COMMON_CORE_DEVICE_TIMER_H_
