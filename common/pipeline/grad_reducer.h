// The communication thread of a data-parallel rank: sums gradients over the replica group
// (a Collective) while the rank's own thread keeps computing.
//
// The stage executor hands over each bucket of final gradients as its weight gradients
// finish (Enqueue) and waits for all of them before it reads the sums (WaitAll): at
// TIE_GRAD, CLIP_GRAD and STEP. Reductions run one at a time, in the order they were
// queued; every replica queues the same reductions in the same order (they run the same
// clock), so the group's collectives line up.
//
// Threading: one thread (the executor's) calls BeginStep, Enqueue and WaitAll; Abort may
// be called from any thread. The gradients of a queued reduction belong to the
// communication thread until WaitAll has returned: the caller neither reads nor writes
// them before.
//
// Errors: the first failed reduction of a step is the step's error; the rest of the step's
// queue is then skipped (not run, not timed) and WaitAll returns that error, prefixed with
// the failed reduction's action.
#ifndef BATON_COMMON_PIPELINE_GRAD_REDUCER_H_
#define BATON_COMMON_PIPELINE_GRAD_REDUCER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/comm/collective.h"
#include "common/core/mutex.h"
#include "common/core/tensor.h"
#include "common/nn/module.h"
#include "common/pipeline/action_timing.h"
#include "common/schedule/action.h"

namespace baton {

class GradReducer {
 public:
  // `collective` (not owned) is the rank's data-parallel group; it must outlive the
  // reducer. A reduction sums its gradients in buckets of at most `bucket_bytes` of floats
  // (a parameter larger than that is a bucket of its own); bucketing changes no bit of the
  // result. Starts the communication thread.
  GradReducer(Collective* collective, int64_t bucket_bytes);
  // Stops the thread once the reduction it is running, if any, returns; what is still
  // queued is dropped.
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Starts a step whose timings count from `t0`: clears the previous step's timings and
  // error. Only with nothing queued (after WaitAll).
  void BeginStep(std::chrono::steady_clock::time_point t0) ABSL_LOCKS_EXCLUDED(mu_);

  // Queues the sum over the group of `params`' gradients, recorded as `action`; returns at
  // once. `deadline` bounds the reduction's collective calls (AllReduceSum).
  void Enqueue(const Action& action, std::vector<Parameter*> params, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sharded optimizer (optimizer_shards.h): `params` are one bucket, laid out in order, and
  // member r owns the run of counts[r] floats that starts where the runs before it end.
  // EnqueueReduceScatter sums the bucket's gradients over the group (ReduceScatterSum):
  // afterwards the gradients this member owns hold the group's sums, the same bits
  // AllReduceSum would give them, and the others' gradients are undefined.
  // EnqueueAllGather hands the weights on (AllGather): afterwards every member holds every
  // owner's values. Both return at once and run in queue order with the reductions.
  void EnqueueReduceScatter(const Action& action, std::vector<Parameter*> params,
                            std::vector<int64_t> counts, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void EnqueueAllGather(const Action& action, std::vector<Parameter*> params,
                        std::vector<int64_t> counts, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // The same over any tensors of float32 laid out as a bucket (a checkpoint gathers the
  // optimizer's state this way); they belong to the communication thread until WaitAll.
  void EnqueueAllGather(const Action& action, std::vector<Tensor*> tensors,
                        std::vector<int64_t> counts, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every queued reduction has run. `*timings` receives the step's reductions
  // that ran so far (each its action, start and end since BeginStep's t0, and the gradient
  // bytes summed), in queue order; the return is the step's first error, or OK. At
  // `deadline` the group is aborted with DEADLINE_EXCEEDED, so the running reduction
  // returns promptly (failing as the engine fails an aborted call, which becomes the
  // step's error), every peer's fails too, and the rest of the queue is skipped; the wait
  // reports DEADLINE_EXCEEDED when no reduction failed. May be called several times in a
  // step.
  absl::Status WaitAll(absl::Time deadline, std::vector<ActionTiming>* timings)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Fails the group with `why` (Collective::Abort), so no peer waits for this rank: the
  // running reduction and the queued ones fail, and WaitAll returns promptly. Thread-safe.
  void Abort(const absl::Status& why);

 private:
  enum class Op { kAllReduce, kReduceScatter, kAllGather };
  struct Task {
    Action action;
    Op op = Op::kAllReduce;
    std::vector<Tensor*> tensors;  // gradients (the reductions) or weights (all-gather)
    std::vector<int64_t> counts;   // the sharded ops' runs, per member
    absl::Time deadline;
  };

  void Push(Task task) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs one task (on the communication thread, without mu_); adds the bytes it summed or
  // gathered.
  absl::Status Run(const Task& task, int64_t* bytes);
  // The all-reduce of `ps` in buckets of at most bucket_bytes_; the sharded ops on `ps` as
  // one bucket.
  absl::Status AllReduce(const std::vector<Tensor*>& ts, absl::Time deadline, int64_t* bytes);
  absl::Status Sharded(const Task& task, int64_t* bytes);
  // The bucket buffer for `floats` floats, where the engine wants it (see Run).
  absl::StatusOr<float*> Buffer(int64_t floats);
  // Copies `t` into the bucket at `at` (to_bucket) or back out of it.
  absl::Status Move(Tensor& t, float* at, bool to_bucket);

  Collective* const collective_;
  const int64_t bucket_bytes_;
  std::vector<float> buffer_;  // the bucket in host memory; the communication thread's only
  Tensor device_buffer_;       // the same on the GPU, for an engine that sums device memory
  Mutex mu_;
  std::condition_variable cv_;  // signals a queued task, a finished one, and stop_
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;                           // queued or running
  std::vector<ActionTiming> done_ ABSL_GUARDED_BY(mu_);            // this step's, in queue order
  absl::Status error_ ABSL_GUARDED_BY(mu_);                        // this step's first
  std::chrono::steady_clock::time_point t0_ ABSL_GUARDED_BY(mu_);  // the step's start
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_GRAD_REDUCER_H_
