// Mutexes the compiler checks. `ABSL_GUARDED_BY` on a std::mutex is checked by nothing: GCC
// ignores the annotations and clang's analysis needs a type it knows is a capability.
// baton::Mutex is std::mutex with that knowledge, so clang's -Wthread-safety (run by
// scripts/check-thread-safety.py, ctest's `thread_safety`) proves that every member declared
// `ABSL_GUARDED_BY(mu_)` is touched only with mu_ held and that every function declared
// `ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)` is called with it held (and `ABSL_LOCKS_EXCLUDED(mu_)`
// without).
//
//   mutable Mutex mu_;
//   int n_ ABSL_GUARDED_BY(mu_) = 0;
//   std::condition_variable changed_;
//   ...
//   MutexLock l(mu_);
//   changed_.wait(l.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ > 0; });
//
// A predicate lambda is analysed as a function of its own, so it says that it runs with the
// lock held (the condition variable calls it so).
//
// Why not absl::Mutex, which is annotated too: Debian's prebuilt Abseil is not instrumented
// for ThreadSanitizer, which then cannot see absl::Mutex's happens-before edges; a std::mutex
// underneath keeps the TSan builds meaningful.
#ifndef BATON_COMMON_CORE_MUTEX_H_
#define BATON_COMMON_CORE_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace baton {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope. It may be released and taken again inside the scope
// (unlock(), lock()), and a std::condition_variable waits on native(), which releases and
// retakes the same lock.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  // For std::condition_variable::wait*.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace baton

#endif  // BATON_COMMON_CORE_MUTEX_H_
