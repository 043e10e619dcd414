#include "common/collective/nccl_collective.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/cuda_context.h"
#include "common/core/status.h"
#include "common/core/mutex.h"

namespace baton {

namespace {

// Polls `ready` until it says done, backing off from 20 us to 1 ms between polls.
template <typename F>
void Poll(F ready) {
  auto pause = std::chrono::microseconds(20);
  while (!ready()) {
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

}  // namespace

NcclCollective::NcclCollective(NcclApi* api, int rank, int size, bool ordered, int cuda_device,
                               CudaStream compute, NcclComm comm)
    : api_(api),
      rank_(rank),
      size_(size),
      ordered_(ordered),
      cuda_device_(cuda_device),
      comm_(comm),
      compute_(compute) {
  AddLiveNcclCommunicators(1);  // until the destructor has ended it (cuda_context.h)
}

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Connect(
    int rank, int size, const NcclCollectiveOptions& options) {
  if (options.api == nullptr) return absl::InvalidArgumentError("nccl collective: no NCCL API");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: member ", rank, " of a group of ", size));
  }
  NcclApi* api = options.api;
  NcclComm comm = nullptr;
  NcclResult r = api->CommInitRank(&comm, size, options.id, rank, options.cuda_device);
  // The engine owns the communicator from here: its destructor aborts one that failed.
  std::unique_ptr<NcclCollective> c(
      new NcclCollective(api, rank, size, options.ordered, options.cuda_device,
                         static_cast<CudaStream>(options.compute_stream), comm));
  const absl::Time deadline = absl::Now() + options.init_timeout;
  if (r == NcclResult::kInProgress || r == NcclResult::kSuccess) r = c->Settle(deadline);
  if (r == NcclResult::kInProgress) {
    return c->Fail(absl::DeadlineExceededError(
        absl::StrCat("nccl: member ", rank, " of ", size, ": the group did not come up within ",
                     absl::FormatDuration(options.init_timeout))));
  }
  if (r != NcclResult::kSuccess) {
    return c->Fail(absl::UnavailableError(absl::StrCat(
        "nccl: member ", rank, " of ", size, " could not join its group: ", NcclResultName(r),
        " (", api->ErrorString(r), ") ", api->LastError(comm))));
  }
  absl::StatusOr<CudaStream> stream = api->StreamCreate(options.cuda_device);
  if (!stream.ok()) return c->Fail(stream.status());
  c->stream_ = *stream;
  absl::StatusOr<CudaEvent> event = api->EventCreate(options.cuda_device);
  if (!event.ok()) return c->Fail(event.status());
  c->event_ = *event;
  if (c->compute_ != nullptr) {
    absl::StatusOr<CudaEvent> written = api->EventCreate(options.cuda_device);
    if (!written.ok()) return c->Fail(written.status());
    c->written_ = *written;
  }
  return c;
}

NcclCollective::~NcclCollective() {
  bool broken;
  {
    MutexLock lock(mu_);
    broken = !failed_.ok() || abort_requested_.load();
  }
  if (comm_ != nullptr) {
    bool finalized = false;
    if (!broken && api_->CommFinalize(comm_) != NcclResult::kInvalidUsage) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      finalized = Settle(deadline) == NcclResult::kSuccess;
    }
    if (finalized) {
      (void)api_->CommDestroy(comm_);
    } else {
      (void)api_->CommAbort(comm_);
    }
    comm_ = nullptr;
  }
  // The communicator is gone, so nothing on the stream waits for a peer any more: drain it
  // before the buffer goes. A stream that does not drain keeps its buffer (leaked, never
  // reused: freeing memory a kernel may still write is worse).
  bool drained = stream_ == nullptr;
  if (stream_ != nullptr && event_ != nullptr && api_->EventRecord(event_, stream_).ok()) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    Poll([&] {
      absl::StatusOr<bool> done = api_->EventQuery(event_);
      drained = !done.ok() || *done;
      return drained || absl::Now() > until;
    });
  }
  if (gathered_ != nullptr && drained) (void)api_->DeviceFreeAsync(gathered_, stream_);
  if (event_ != nullptr) (void)api_->EventDestroy(event_);
  if (written_ != nullptr) (void)api_->EventDestroy(written_);
  if (stream_ != nullptr && drained) (void)api_->StreamDestroy(stream_);
  AddLiveNcclCommunicators(-1);
}

void NcclCollective::Abort(const absl::Status& why) {
  MutexLock lock(mu_);
  if (failed_.ok()) {
    failed_ = why.ok() ? absl::AbortedError("the data-parallel group was aborted") : why;
  }
  abort_requested_.store(true);  // a call in flight notices at its next poll
}

absl::Status NcclCollective::Fail(const absl::Status& s) {
  if (comm_ != nullptr) {
    (void)api_->CommAbort(comm_);
    comm_ = nullptr;
  }
  MutexLock lock(mu_);
  if (failed_.ok()) failed_ = s;
  return s;
}

absl::Status NcclCollective::NcclError(const char* call, NcclResult r) {
  const std::string last = comm_ != nullptr ? api_->LastError(comm_) : "";
  return absl::UnavailableError(absl::StrCat("all-reduce on replica ", rank_, " of ", size_, ": ",
                                             call, ": ", NcclResultName(r), " (",
                                             api_->ErrorString(r), ")",
                                             last.empty() ? "" : ": ", last));
}

NcclResult NcclCollective::Settle(absl::Time deadline) {
  NcclResult state = NcclResult::kInProgress;
  Poll([&] {
    const NcclResult r = api_->CommGetAsyncError(comm_, &state);
    if (r != NcclResult::kSuccess) state = r;
    return state != NcclResult::kInProgress || abort_requested_.load() || absl::Now() > deadline;
  });
  return state;
}

absl::Status NcclCollective::WaitStream(absl::Time deadline, const char* what) {
  if (absl::Status s = api_->EventRecord(event_, stream_); !s.ok()) return Fail(s);
  absl::Status result;
  Poll([&] {
    absl::StatusOr<bool> done = api_->EventQuery(event_);
    if (!done.ok()) {
      result = done.status();
      return true;
    }
    if (*done) return true;
    NcclResult state = NcclResult::kSuccess;
    const NcclResult r = api_->CommGetAsyncError(comm_, &state);
    if (r != NcclResult::kSuccess || (state != NcclResult::kSuccess &&
                                      state != NcclResult::kInProgress)) {
      result = NcclError(what, r != NcclResult::kSuccess ? r : state);
      return true;
    }
    if (abort_requested_.load()) {
      MutexLock lock(mu_);
      result = failed_;
      return true;
    }
    if (absl::Now() > deadline) {
      result = absl::DeadlineExceededError(
          absl::StrCat("all-reduce on replica ", rank_, " of ", size_, ": ", what,
                       " did not finish by its deadline (a member did not join in time)"));
      return true;
    }
    return false;
  });
  return result.ok() ? result : Fail(result);
}

absl::Status NcclCollective::AllReduceSum(float* data, int64_t n, absl::Time deadline) {
  {
    MutexLock lock(mu_);
    if (!failed_.ok()) {
      return absl::Status(failed_.code(), absl::StrCat("all-reduce on replica ", rank_, ": ",
                                                       failed_.message()));
    }
  }
  if (n == 0) return absl::OkStatus();
  // A one-member group goes through NCCL too: the same calls and kernel as a real group
  // (what a test on one GPU can check), at the cost of a copy.
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError("all-reduce: the deadline passed before it started");
  }
  const size_t count = static_cast<size_t>(n);
  // The buffer may still be being written on the compute stream: this stream reads it after.
  if (compute_ != nullptr) {
    if (absl::Status s = api_->EventRecord(written_, compute_); !s.ok()) return Fail(s);
    if (absl::Status s = api_->StreamWaitEvent(stream_, written_); !s.ok()) return Fail(s);
  }
  // Enqueues one NCCL call and waits for the communicator to take it.
  auto issue = [&](const char* call, NcclResult r) -> absl::Status {
    if (r == NcclResult::kInProgress) r = Settle(deadline);
    if (r == NcclResult::kInProgress && abort_requested_.load()) {
      absl::Status why;
      {
        MutexLock lock(mu_);
        why = failed_;
      }
      return Fail(why);
    }
    if (r == NcclResult::kInProgress) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat("all-reduce on replica ", rank_, " of ", size_, ": ", call,
                       " was not accepted by its deadline")));
    }
    return r == NcclResult::kSuccess ? absl::OkStatus() : Fail(NcclError(call, r));
  };
  if (!ordered_) {
    BATON_RETURN_IF_ERROR(
        issue("ncclAllReduce", api_->AllReduceSum(data, data, count, comm_, stream_)));
    return WaitStream(deadline, "ncclAllReduce");
  }
  if (n > capacity_) {
    // In this stream's order, never cudaFree: it would wait for the whole device, so for the
    // pipeline's NCCL kernels too, which may wait for a peer that waits for this replica.
    if (gathered_ != nullptr) {
      if (absl::Status s = api_->DeviceFreeAsync(gathered_, stream_); !s.ok()) return Fail(s);
      gathered_ = nullptr;
      capacity_ = 0;
    }
    absl::StatusOr<void*> p =
        api_->DeviceAllocAsync(count * static_cast<size_t>(size_) * sizeof(float), stream_);
    if (!p.ok()) return Fail(p.status());
    gathered_ = static_cast<float*>(*p);
    capacity_ = n;
  }
  BATON_RETURN_IF_ERROR(
      issue("ncclAllGather", api_->AllGather(data, gathered_, count, comm_, stream_)));
  if (absl::Status s = api_->OrderedSum(data, gathered_, size_, count, stream_); !s.ok()) {
    return Fail(s);
  }
  return WaitStream(deadline, "ncclAllGather");
}

}  // namespace baton
