#include "coordinator/effects_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/mutex.h"

namespace baton {

namespace {

std::string WorkerName(const PlacedWorker& w) {
  return absl::StrCat("worker ", w.worker_id, " (", w.address, ")");
}

}  // namespace

EffectsRunner::EffectsRunner(Options options, Callbacks callbacks)
    : options_(std::move(options)), callbacks_(std::move(callbacks)) {}

EffectsRunner::~EffectsRunner() { Close(); }

void EffectsRunner::Run(Effects effects, bool wait) {
  if (effects.empty()) return;
  if (wait || !options_.background) {
    RunNow(std::move(effects));
    return;
  }
  MutexLock lock(mu_);
  if (closed_) {
    // Stopping: no new threads; the calls still happen (they have deadlines).
    lock.unlock();
    RunNow(std::move(effects));
    return;
  }
  auto done = std::make_shared<bool>(false);
  Background bg;
  bg.done = done;
  bg.thread = std::thread([this, done, e = std::move(effects)]() mutable {
    RunNow(std::move(e));
    MutexLock l(mu_);
    *done = true;
  });
  threads_.push_back(std::move(bg));
}

void EffectsRunner::RunNow(Effects effects) {
  for (const AbortCall& a : effects.aborts) RunAbort(a);
  for (const StartCall& s : effects.starts) RunStart(s);
}

void EffectsRunner::RunAbort(const AbortCall& a) {
  std::vector<char> stopped(a.workers.size(), 0);
  FanOut(static_cast<int>(a.workers.size()), [&](int i) {
    const PlacedWorker& w = a.workers[i];
    const absl::StatusOr<AbortAnswer> answer = options_.client->AbortJob(
        {w.address, w.session}, a.job_id, a.reason, options_.abort_timeout);
    // Only a worker that says the job no longer runs there is free: one still stopping, or
    // one that did not answer, is freed later by a heartbeat reporting no job (or its
    // lease runs out).
    stopped[i] = answer.ok() && *answer == AbortAnswer::kStopped;
    if (callbacks_.log && !answer.ok()) {
      callbacks_.log(absl::StrCat("AbortJob ", a.job_id, " on ", WorkerName(w), ": ",
                                  answer.status().ToString()));
    } else if (callbacks_.log && !stopped[i]) {
      callbacks_.log(absl::StrCat("AbortJob ", a.job_id, " on ", WorkerName(w),
                                  ": still stopping; busy until its heartbeat reports it free"));
    }
  });
  if (!a.free_after) return;
  std::vector<PlacedWorker> to_free;
  for (size_t i = 0; i < a.workers.size(); ++i) {
    if (stopped[i]) to_free.push_back(a.workers[i]);
  }
  if (callbacks_.aborted) callbacks_.aborted(a, std::move(to_free));
}

void EffectsRunner::RunStart(const StartCall& s) {
  const int n = static_cast<int>(s.workers.size());
  std::vector<absl::Status> results(n);
  FanOut(n - 1,
         [&](int i) { results[i + 1] = StartOne(s.job_id, s.workers[i + 1], s.plans[i + 1]); });
  const bool others_ok =
      std::all_of(results.begin() + 1, results.end(), [](const absl::Status& r) { return r.ok(); });
  results[0] = others_ok ? StartOne(s.job_id, s.workers[0], s.plans[0])
                         : absl::CancelledError("not started: another rank's StartJob failed");
  if (callbacks_.started) callbacks_.started(s, results);
}

absl::Status EffectsRunner::StartOne(const std::string& job_id, const PlacedWorker& worker,
                                     const baton::v1::JobPlan& plan) {
  const absl::Time give_up = options_.clock() + options_.busy_retry;
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    const absl::Status s =
        options_.client->StartJob({worker.address, worker.session}, plan, options_.start_timeout);
    if (s.code() != absl::StatusCode::kFailedPrecondition || options_.clock() + backoff > give_up) {
      return s;
    }
    if (callbacks_.still_placing && !callbacks_.still_placing(job_id)) return s;
    options_.sleep(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

void EffectsRunner::FanOut(int n, const std::function<void(int)>& fn) {
  if (!options_.background || n <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (std::thread& t : threads) t.join();
}

void EffectsRunner::Reap() { ReapThreads(/*all=*/false); }

void EffectsRunner::Close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  ReapThreads(/*all=*/true);
}

void EffectsRunner::ReapThreads(bool all) {
  std::vector<std::thread> to_join;
  {
    MutexLock lock(mu_);
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (all || *it->done) {
        to_join.push_back(std::move(it->thread));
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::thread& t : to_join) t.join();
}

}  // namespace baton
