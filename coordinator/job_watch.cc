#include "coordinator/job_watch.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "coordinator/job_lifecycle.h"
#include "common/core/mutex.h"

namespace baton {

using baton::v1::JobEvent;

void JobEventLog::Append(JobEvent event) {
  MutexLock lock(mu_);
  events_.push_back(std::move(event));
  while (events_.size() > kMaxBufferedEvents) {
    events_.pop_front();
    ++first_;
  }
  cv_.notify_all();
}

void JobEventLog::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

void JobEventLog::Stop() {
  MutexLock lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

int64_t JobEventLog::End() {
  MutexLock lock(mu_);
  return first_ + static_cast<int64_t>(events_.size());
}

JobWatch::JobWatch(std::shared_ptr<EventLog> log, int64_t cursor, JobEvent first)
    : log_(std::move(log)), cursor_(cursor) {
  pending_.push_back(std::move(first));
}

JobWatch::~JobWatch() = default;

absl::StatusOr<std::vector<JobEvent>> JobWatch::Next(absl::Duration timeout, bool* done) {
  std::vector<JobEvent> out;
  auto note_terminal = [this](const std::vector<JobEvent>& events) {
    for (const JobEvent& e : events) {
      if (e.has_state_change() && IsTerminalState(e.state_change().state())) done_ = true;
    }
  };
  if (done_) {
    *done = true;
    return out;
  }
  if (!pending_.empty()) {
    out.swap(pending_);
    note_terminal(out);
    *done = done_;
    return out;
  }
  EventLog& log = *log_;
  MutexLock lock(log.mu_);
  log.cv_.wait_for(lock.native(), std::chrono::nanoseconds(absl::ToInt64Nanoseconds(timeout)),
                   [this, &log]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log.mu_) {
                     return log.first_ + static_cast<int64_t>(log.events_.size()) > cursor_ ||
                            log.closed_ || log.stopped_;
                   });
  if (cursor_ < log.first_) cursor_ = log.first_;  // too slow: the oldest were dropped
  const int64_t end = log.first_ + static_cast<int64_t>(log.events_.size());
  for (int64_t i = cursor_; i < end; ++i) out.push_back(log.events_[i - log.first_]);
  cursor_ = end;
  note_terminal(out);
  if (log.closed_) done_ = true;  // everything up to the terminal event has been returned
  if (!done_ && out.empty() && log.stopped_) {
    return absl::UnavailableError("the coordinator is shutting down");
  }
  *done = done_;
  return out;
}

}  // namespace baton
