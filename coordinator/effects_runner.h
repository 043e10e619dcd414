// Carries out what the coordinator decided under its lock: the StartJob and AbortJob calls
// to workers, made with no coordinator lock held.
//
// The coordinator collects Effects while it holds its mutex, releases it, and hands them
// to Run. The runner makes the calls (in parallel where they may be), then reports back
// through its Callbacks, which take the coordinator's mutex themselves: which workers an
// abort reached (to free them) and how a placement's StartJob calls were answered (to
// count them). Calls run on the caller's thread (Run with wait, or every call when
// Options.background is false: tests) or on a tracked short-lived thread that Close joins.
#ifndef BATON_COORDINATOR_EFFECTS_RUNNER_H_
#define BATON_COORDINATOR_EFFECTS_RUNNER_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/v1/worker.pb.h"
#include "coordinator/placement.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"
#include "common/core/mutex.h"

namespace baton {

// Start a placement: one plan per rank, plans[r] for workers[r].
struct StartCall {
  std::string job_id;
  std::vector<PlacedWorker> workers;
  std::vector<baton::v1::JobPlan> plans;
};

// Stop a job on some workers.
struct AbortCall {
  std::string job_id;
  std::string reason;
  std::vector<PlacedWorker> workers;
  // Report the workers the calls reached (Callbacks::aborted), for them to be freed.
  bool free_after = true;
  // Counted in the job's pending aborts (a recovering job waits for it).
  bool counted = false;
};

// What one decision asks of the workers; aborts are made before starts.
struct Effects {
  std::vector<StartCall> starts;
  std::vector<AbortCall> aborts;
  bool empty() const { return starts.empty() && aborts.empty(); }
};

class EffectsRunner {
 public:
  struct Options {
    std::shared_ptr<WorkerClient> client;  // required
    absl::Duration start_timeout = absl::Seconds(5);
    absl::Duration abort_timeout = absl::Seconds(2);
    // A StartJob answered FAILED_PRECONDITION (the worker still winds down its previous
    // job) is retried, with backoff from 20 ms to 200 ms, for this long.
    absl::Duration busy_retry = absl::Seconds(3);
    ClockFn clock;                              // required
    std::function<void(absl::Duration)> sleep;  // required: the waits between retries
    // false: no threads at all; every call runs on the thread that called Run.
    bool background = true;
  };
  // What the runner reports back. Each is called on the thread that made the calls, with
  // no lock of the runner's held; each may take the coordinator's lock, and `started` may
  // call RunNow for what its answers lead to.
  struct Callbacks {
    // An AbortCall with free_after has returned: `stopped` are its workers that answered
    // that no thread of the job runs there any more (AbortAnswer::kStopped), in call order.
    // The others (still stopping, an error, unreachable) stay busy.
    std::function<void(const AbortCall& call, std::vector<PlacedWorker> stopped)> aborted;
    // A StartCall's answers, one per rank; a rank not called (rank 0 when another rank's
    // call failed) is CANCELLED.
    std::function<void(const StartCall& call, const std::vector<absl::Status>& results)> started;
    // Whether a StartJob refused as busy is still worth retrying (the job is still PLACING).
    std::function<bool(const std::string& job_id)> still_placing;
    // A failed call, worth a line in the log.
    std::function<void(const std::string& message)> log;
  };

  EffectsRunner(Options options, Callbacks callbacks);
  ~EffectsRunner();  // Close()
  EffectsRunner(const EffectsRunner&) = delete;
  EffectsRunner& operator=(const EffectsRunner&) = delete;

  // Carries out `effects`: now, on this thread, when `wait` (or without background);
  // otherwise on a tracked background thread (on this thread once Close was called: the
  // calls have deadlines). Call with no coordinator lock held.
  void Run(Effects effects, bool wait);
  // Carries out `effects` on this thread: every abort (each call's workers in parallel),
  // then every start: ranks 1..S-1 in parallel, and rank 0 only once all of them accepted
  // (every tensor of a step originates in rank 0's first forward, so no rank receives
  // anything before it accepted its plan).
  void RunNow(Effects effects);
  // Joins the background threads that have finished.
  void Reap();
  // No more background threads; joins every one. Idempotent.
  void Close();

 private:
  struct Background {
    std::thread thread;
    std::shared_ptr<bool> done;  // guarded by mu_
  };

  void RunAbort(const AbortCall& call);
  void RunStart(const StartCall& call);
  // One StartJob, retried while the worker is busy (see Options.busy_retry).
  absl::Status StartOne(const std::string& job_id, const PlacedWorker& worker,
                        const baton::v1::JobPlan& plan);
  // fn(0..n-1), in parallel with background, else in order.
  void FanOut(int n, const std::function<void(int)>& fn);
  void ReapThreads(bool all);

  const Options options_;
  const Callbacks callbacks_;

  Mutex mu_;
  std::vector<Background> threads_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_EFFECTS_RUNNER_H_
