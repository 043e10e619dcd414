#include "common/pipeline/grad_reducer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/cuda_context.h"
#include "common/core/status.h"

namespace baton {
namespace {

int64_t NsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

GradReducer::GradReducer(Collective* collective, int64_t bucket_bytes)
    : collective_(collective), bucket_bytes_(bucket_bytes), thread_([this] { Loop(); }) {}

GradReducer::~GradReducer() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradReducer::BeginStep(std::chrono::steady_clock::time_point t0) {
  MutexLock lock(mu_);
  t0_ = t0;
  done_.clear();
  error_ = absl::OkStatus();
}

void GradReducer::Enqueue(const Action& action, std::vector<Parameter*> params,
                          absl::Time deadline) {
  {
    MutexLock lock(mu_);
    queue_.push_back(Task{action, std::move(params), deadline});
    ++pending_;
  }
  cv_.notify_all();
}

absl::Status GradReducer::WaitAll(absl::Time deadline, std::vector<ActionTiming>* timings) {
  MutexLock lock(mu_);
  const auto until = absl::ToChronoTime(deadline);
  while (pending_ > 0) {
    if (cv_.wait_until(lock.native(), until) == std::cv_status::timeout && pending_ > 0) {
      lock.unlock();
      collective_->Abort(
          absl::DeadlineExceededError("a gradient reduction did not finish by its deadline"));
      lock.lock();
      // Aborted: the running reduction returns promptly, and the rest are skipped or fail.
      cv_.wait(lock.native(),
               [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; });
      if (error_.ok()) {
        error_ = absl::DeadlineExceededError("a gradient reduction did not finish by its deadline");
      }
    }
  }
  *timings = done_;
  return error_;
}

void GradReducer::Abort(const absl::Status& why) { collective_->Abort(why); }

void GradReducer::Loop() {
  MutexLock lock(mu_);
  while (true) {
    cv_.wait(lock.native(),
             [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.ok();
    const auto t0 = t0_;
    lock.unlock();
    ActionTiming t{task.action, 0, 0, 0};
    absl::Status s;
    if (!skip) {
      t.start_ns = NsSince(t0);
      s = Reduce(task, &t.bytes);
      t.end_ns = NsSince(t0);
    }
    lock.lock();
    if (!skip) {
      done_.push_back(t);
      if (!s.ok() && error_.ok()) {
        error_ = absl::Status(s.code(), absl::StrCat(task.action.ToString(), ": ", s.message()));
      }
    }
    --pending_;
    cv_.notify_all();
  }
}

// Bucket by bucket: each bucket is gathered into one buffer, reduced, and scattered back.
// The buffer lives where the engine wants it: host memory (Gloo, in-process; device
// gradients are staged through it) or the GPU (NCCL: device-to-device copies on the compute
// stream). An engine that follows the compute stream (NCCL in a worker) orders its
// all-reduce after the copies into the bucket itself, so they are queued without a wait;
// the copies back are queued after the all-reduce returned (it holds the result then),
// ahead of the optimizer's kernels on the same stream. Otherwise every copy waits for the
// stream.
absl::Status GradReducer::Reduce(const Task& task, int64_t* bytes) {
  const bool on_device = collective_->device() == Device::kCuda;
  const bool async = on_device && collective_->follows_compute_stream();
  size_t i = 0;
  const std::vector<Parameter*>& ps = task.params;
  while (i < ps.size()) {
    size_t end = i;
    int64_t floats = 0;
    while (end < ps.size() &&
           (end == i || (floats + ps[end]->grad.numel()) * static_cast<int64_t>(sizeof(float)) <=
                            bucket_bytes_)) {
      floats += ps[end]->grad.numel();
      ++end;
    }
    float* buf = nullptr;
    if (on_device) {
      if (device_buffer_.numel() < floats) {
        device_buffer_ = Tensor();
        BATON_ASSIGN_OR_RETURN(device_buffer_,
                               Tensor::TryEmpty({floats}, DType::kFloat32, Device::kCuda));
      }
      buf = device_buffer_.f32();
    } else {
      buffer_.resize(static_cast<size_t>(floats));
      buf = buffer_.data();
    }
    // Copies one parameter's gradient into the bucket (to_bucket) or back out of it.
    auto move = [&](Tensor& grad, float* at, bool to_bucket) -> absl::Status {
      if (!on_device) return to_bucket ? grad.CopyToHost(at) : grad.CopyFromHost(at);
      if (grad.device() != Device::kCuda) {
        return absl::FailedPreconditionError(
            "the data-parallel engine sums GPU memory but this rank's gradients are on the "
            "CPU");
      }
      void* dst = to_bucket ? static_cast<void*>(at) : grad.raw();
      const void* src = to_bucket ? grad.raw() : static_cast<const void*>(at);
      return async ? CudaCopyDeviceAsync(dst, src, grad.nbytes())
                   : CudaCopy(dst, src, grad.nbytes(), CopyKind::kDeviceToDevice);
    };
    int64_t at = 0;
    for (size_t k = i; k < end; ++k) {
      BATON_RETURN_IF_ERROR(move(ps[k]->grad, buf + at, true));
      at += ps[k]->grad.numel();
    }
    BATON_RETURN_IF_ERROR(collective_->AllReduceSum(buf, floats, task.deadline));
    at = 0;
    for (size_t k = i; k < end; ++k) {
      BATON_RETURN_IF_ERROR(move(ps[k]->grad, buf + at, false));
      at += ps[k]->grad.numel();
    }
    *bytes += floats * static_cast<int64_t>(sizeof(float));
    i = end;
  }
  return absl::OkStatus();
}

}  // namespace baton
