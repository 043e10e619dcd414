#include "common/pipeline/grad_reducer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
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

namespace {

std::vector<Tensor*> Grads(const std::vector<Parameter*>& params) {
  std::vector<Tensor*> out;
  for (Parameter* p : params) out.push_back(&p->grad);
  return out;
}

}  // namespace

void GradReducer::Enqueue(const Action& action, std::vector<Parameter*> params,
                          absl::Time deadline) {
  Push(Task{action, Op::kAllReduce, Grads(params), {}, deadline});
}

void GradReducer::EnqueueReduceScatter(const Action& action, std::vector<Parameter*> params,
                                       std::vector<int64_t> counts, absl::Time deadline) {
  Push(Task{action, Op::kReduceScatter, Grads(params), std::move(counts), deadline});
}

void GradReducer::EnqueueAllGather(const Action& action, std::vector<Parameter*> params,
                                   std::vector<int64_t> counts, absl::Time deadline) {
  std::vector<Tensor*> values;
  for (Parameter* p : params) values.push_back(&p->value);
  EnqueueAllGather(action, std::move(values), std::move(counts), deadline);
}

void GradReducer::EnqueueAllGather(const Action& action, std::vector<Tensor*> tensors,
                                   std::vector<int64_t> counts, absl::Time deadline) {
  Push(Task{action, Op::kAllGather, std::move(tensors), std::move(counts), deadline});
}

void GradReducer::Push(Task task) {
  {
    MutexLock lock(mu_);
    queue_.push_back(std::move(task));
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
      s = Run(task, &t.bytes);
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
// collective after the copies into the bucket itself, so they are queued without a wait;
// the copies back are queued after the collective returned (it holds the result then),
// ahead of the optimizer's kernels on the same stream. Otherwise every copy waits for the
// stream.
absl::Status GradReducer::Run(const Task& task, int64_t* bytes) {
  if (task.op == Op::kAllReduce) return AllReduce(task.tensors, task.deadline, bytes);
  return Sharded(task, bytes);
}

absl::StatusOr<float*> GradReducer::Buffer(int64_t floats) {
  if (collective_->device() != Device::kCuda) {
    buffer_.resize(static_cast<size_t>(floats));
    return buffer_.data();
  }
  if (device_buffer_.numel() < floats) {
    device_buffer_ = Tensor();
    BATON_ASSIGN_OR_RETURN(device_buffer_,
                           Tensor::TryEmpty({floats}, DType::kFloat32, Device::kCuda));
  }
  return device_buffer_.f32();
}

absl::Status GradReducer::Move(Tensor& t, float* at, bool to_bucket) {
  if (t.dtype() == DType::kBFloat16) {
    // A weight kept as its bf16 bits (Parameter::bf16_operand) takes the owner's float32
    // value rounded; it never goes into a bucket (its owner's float32 value does).
    if (to_bucket) {
      return absl::InternalError("a tensor of bf16 bits cannot be summed or handed on");
    }
    if (collective_->device() == Device::kCuda) {  // `at` is on the GPU, as is `t`
      BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(Device::kCuda));
      be->ToBf16(t.numel(), at, t.bf16());  // on the compute stream, after the gather
      return collective_->follows_compute_stream() ? absl::OkStatus()
                                                   : DeviceSynchronize(Device::kCuda);
    }
    return CopyFromHostAsBf16(at, t);  // `at` is host memory
  }
  if (collective_->device() != Device::kCuda) {
    return to_bucket ? t.CopyToHost(at) : t.CopyFromHost(at);
  }
  if (t.device() != Device::kCuda) {
    return absl::FailedPreconditionError(
        "the data-parallel engine works on GPU memory but this rank's tensors are on the CPU");
  }
  void* dst = to_bucket ? static_cast<void*>(at) : t.raw();
  const void* src = to_bucket ? t.raw() : static_cast<const void*>(at);
  return collective_->follows_compute_stream()
             ? CudaCopyDeviceAsync(dst, src, t.nbytes())
             : CudaCopy(dst, src, t.nbytes(), CopyKind::kDeviceToDevice);
}

absl::Status GradReducer::AllReduce(const std::vector<Tensor*>& ts, absl::Time deadline,
                                    int64_t* bytes) {
  size_t i = 0;
  while (i < ts.size()) {
    size_t end = i;
    int64_t floats = 0;
    while (end < ts.size() &&
           (end == i ||
            (floats + ts[end]->numel()) * static_cast<int64_t>(sizeof(float)) <= bucket_bytes_)) {
      floats += ts[end]->numel();
      ++end;
    }
    BATON_ASSIGN_OR_RETURN(float* buf, Buffer(floats));
    int64_t at = 0;
    for (size_t k = i; k < end; ++k) {
      BATON_RETURN_IF_ERROR(Move(*ts[k], buf + at, true));
      at += ts[k]->numel();
    }
    BATON_RETURN_IF_ERROR(collective_->AllReduceSum(buf, floats, deadline));
    at = 0;
    for (size_t k = i; k < end; ++k) {
      BATON_RETURN_IF_ERROR(Move(*ts[k], buf + at, false));
      at += ts[k]->numel();
    }
    *bytes += floats * static_cast<int64_t>(sizeof(float));
    i = end;
  }
  return absl::OkStatus();
}

// One bucket: the reduce-scatter moves every gradient in and this member's run back out;
// the all-gather moves this member's run of weights in and the other runs back out.
absl::Status GradReducer::Sharded(const Task& task, int64_t* bytes) {
  const bool scatter = task.op == Op::kReduceScatter;
  int64_t floats = 0;
  for (const Tensor* t : task.tensors) floats += t->numel();
  const char* op = scatter ? "reduce-scatter" : "all-gather";
  BATON_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                         ShardOffsets(task.counts, collective_->size(), op));
  if (offsets.back() != floats) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the runs hold ", offsets.back(), " floats, the bucket ", floats));
  }
  const int me = collective_->rank();
  const int64_t from = offsets[me];
  const int64_t to = from + task.counts[me];
  BATON_ASSIGN_OR_RETURN(float* buf, Buffer(floats));
  // Runs end on parameter boundaries (optimizer_shards.h): a parameter is in this member's
  // run when it starts there.
  enum class Which { kAll, kMine, kOthers };
  auto move = [&](Which which, bool to_bucket) -> absl::Status {
    int64_t at = 0;
    for (Tensor* t : task.tensors) {
      const bool mine = at >= from && at < to;
      if (which == Which::kAll || mine == (which == Which::kMine)) {
        BATON_RETURN_IF_ERROR(Move(*t, buf + at, to_bucket));
      }
      at += t->numel();
    }
    return absl::OkStatus();
  };
  if (scatter) {
    BATON_RETURN_IF_ERROR(move(Which::kAll, /*to_bucket=*/true));
    BATON_RETURN_IF_ERROR(collective_->ReduceScatterSum(buf, task.counts, task.deadline));
    BATON_RETURN_IF_ERROR(move(Which::kMine, /*to_bucket=*/false));
  } else {
    BATON_RETURN_IF_ERROR(move(Which::kMine, /*to_bucket=*/true));
    BATON_RETURN_IF_ERROR(collective_->AllGather(buf, task.counts, task.deadline));
    BATON_RETURN_IF_ERROR(move(Which::kOthers, /*to_bucket=*/false));
  }
  *bytes += floats * static_cast<int64_t>(sizeof(float));
  return absl::OkStatus();
}

}  // namespace baton
