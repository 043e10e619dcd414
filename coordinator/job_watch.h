// A job's event log (state changes and steps, as WatchJob streams them) and the
// subscriptions that read it.
//
// The coordinator appends to a job's JobEventLog under its own lock (lock order: the
// coordinator's mu_ before a log's mutex) and closes it at the job's terminal state; each
// WatchJob stream owns a JobWatch that waits on the log's mutex alone, never on the
// coordinator's. Tests: job_watch_test.cc, without a coordinator.
#ifndef BATON_COORDINATOR_JOB_WATCH_H_
#define BATON_COORDINATOR_JOB_WATCH_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/jobs.pb.h"
#include "common/core/mutex.h"

namespace baton {

// One job's events, oldest first, shared by the coordinator (which appends) and the job's
// watchers (which read). Thread-safe: every member takes the log's own mutex.
class JobEventLog {
 public:
  // The most events kept: a watcher that falls further behind skips the oldest.
  static constexpr size_t kMaxBufferedEvents = 4096;

  // Appends `event` (dropping the oldest beyond kMaxBufferedEvents) and wakes the watchers.
  void Append(baton::v1::JobEvent event);
  // The terminal event is in: watchers return what is left and are done.
  void Close();
  // The coordinator stops: a watcher with nothing left to return gets UNAVAILABLE.
  void Stop();
  // The cursor just after the newest event: a watch from here sees only what follows.
  int64_t End();

 private:
  friend class JobWatch;

  Mutex mu_;
  std::condition_variable cv_;
  std::deque<baton::v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  int64_t first_ ABSL_GUARDED_BY(mu_) = 0;     // index of events_.front() in the job's history
  bool closed_ ABSL_GUARDED_BY(mu_) = false;   // the terminal event is in (or was)
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the coordinator stopped
};

// A WatchJob subscription. Not thread-safe (one stream handler owns it).
class JobWatch {
 public:
  using EventLog = JobEventLog;
  // Returns `first` (the job's current state), then the log's events from `cursor` on.
  JobWatch(std::shared_ptr<EventLog> log, int64_t cursor, baton::v1::JobEvent first);
  ~JobWatch();

  // The next events: first the job's current state (as a StateChange), then every state
  // change and step as it happens. Waits up to `timeout` when there is nothing new
  // (returning an empty list then). *done is set once the terminal state change has been
  // returned: nothing follows. UNAVAILABLE when the coordinator stops first. A watcher too
  // slow to keep up with a job's steps skips the oldest steps it missed (state changes
  // are never dropped between watch and terminal state unless thousands of steps pass).
  absl::StatusOr<std::vector<baton::v1::JobEvent>> Next(absl::Duration timeout, bool* done);

 private:
  std::shared_ptr<EventLog> log_;
  int64_t cursor_;
  std::vector<baton::v1::JobEvent> pending_;
  bool done_ = false;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_WATCH_H_
