// A clock for the coordinator's tests (CoordinatorOptions::clock, the registry's leases),
// moved only by the test.
#ifndef BATON_COORDINATOR_FAKE_CLOCK_TEST_UTIL_H_
#define BATON_COORDINATOR_FAKE_CLOCK_TEST_UTIL_H_

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/core/mutex.h"
#include "coordinator/worker_registry.h"

namespace baton {
namespace testing_util {

// Thread-safe: the coordinator's threads read it while the test moves it.
class FakeClock {
 public:
  ClockFn fn() {
    return [this] {
      MutexLock lock(mu_);
      return now_;
    };
  }
  void Advance(absl::Duration d) {
    MutexLock lock(mu_);
    now_ += d;
  }

 private:
  Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
};

}  // namespace testing_util
}  // namespace baton

#endif  // BATON_COORDINATOR_FAKE_CLOCK_TEST_UTIL_H_
