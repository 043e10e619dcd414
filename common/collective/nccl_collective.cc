#include "common/collective/nccl_collective.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/cuda_context.h"
#include "common/core/mutex.h"
#include "common/core/status.h"

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
  // The gather buffer goes back to its allocator, which may hand it to the compute stream
  // at once: only once this stream is done with it.
  if (!drained && gathered_buffer_.defined()) new Tensor(std::move(gathered_buffer_));
  if (counts_device_ != nullptr && drained) (void)api_->DeviceFreeAsync(counts_device_, stream_);
  if (counts_host_ != nullptr && drained) (void)api_->HostFree(counts_host_);
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
  return absl::UnavailableError(absl::StrCat(op_, " on replica ", rank_, " of ", size_, ": ", call,
                                             ": ", NcclResultName(r), " (", api_->ErrorString(r),
                                             ")", last.empty() ? "" : ": ", last));
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
          absl::StrCat(op_, " on replica ", rank_, " of ", size_, ": ", what,
                       " did not finish by its deadline (a member did not join in time)"));
      return true;
    }
    return false;
  });
  return result.ok() ? result : Fail(result);
}

absl::Status NcclCollective::Begin(const char* op) {
  op_ = op;
  MutexLock lock(mu_);
  if (!failed_.ok()) {
    return absl::Status(failed_.code(),
                        absl::StrCat(op, " on replica ", rank_, ": ", failed_.message()));
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::CheckDeadline(absl::Time deadline) const {
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat(op_, ": the deadline passed before it started"));
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::FollowCompute() {
  // The buffer may still be being written on the compute stream: this stream reads it after.
  if (compute_ != nullptr) {
    if (absl::Status s = api_->EventRecord(written_, compute_); !s.ok()) return Fail(s);
    if (absl::Status s = api_->StreamWaitEvent(stream_, written_); !s.ok()) return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::Issue(const char* call, NcclResult r, absl::Time deadline) {
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
    return Fail(
        absl::DeadlineExceededError(absl::StrCat(op_, " on replica ", rank_, " of ", size_, ": ",
                                                 call, " was not accepted by its deadline")));
  }
  return r == NcclResult::kSuccess ? absl::OkStatus() : Fail(NcclError(call, r));
}

absl::Status NcclCollective::EnsureGathered(int64_t floats) {
  if (floats <= gathered_capacity_) return absl::OkStatus();
  // The engine's stream is idle here (every call before this one waited for it), so the
  // smaller buffer can go back to its allocator.
  gathered_buffer_ = Tensor();
  gathered_ = nullptr;
  gathered_capacity_ = 0;
  absl::StatusOr<Tensor> t = Tensor::TryEmpty({floats}, DType::kFloat32, api_->device());
  if (!t.ok()) {
    return Fail(
        absl::Status(t.status().code(), absl::StrCat("nccl: the ", op_, "'s gather buffer of ",
                                                     floats * static_cast<int64_t>(sizeof(float)),
                                                     " bytes: ", t.status().message())));
  }
  gathered_buffer_ = *std::move(t);
  gathered_ = gathered_buffer_.f32();
  gathered_capacity_ = floats;
  return absl::OkStatus();
}

absl::Status NcclCollective::AllReduceSum(float* data, int64_t n, absl::Time deadline) {
  BATON_RETURN_IF_ERROR(Begin("all-reduce"));
  if (n == 0) return absl::OkStatus();
  BATON_RETURN_IF_ERROR(CheckDeadline(deadline));
  // A one-member group goes through NCCL too: the same calls and kernel as a real group
  // (what a test on one GPU can check), at the cost of a copy.
  const size_t count = static_cast<size_t>(n);
  if (ordered_) BATON_RETURN_IF_ERROR(EnsureGathered(n * size_));  // before FollowCompute
  BATON_RETURN_IF_ERROR(FollowCompute());
  if (!ordered_) {
    BATON_RETURN_IF_ERROR(
        Issue("ncclAllReduce", api_->AllReduceSum(data, data, count, comm_, stream_), deadline));
    return WaitStream(deadline, "ncclAllReduce");
  }
  BATON_RETURN_IF_ERROR(
      Issue("ncclAllGather", api_->AllGather(data, gathered_, count, comm_, stream_), deadline));
  if (absl::Status s = api_->OrderedSum(data, gathered_, size_, count, stream_); !s.ok()) {
    return Fail(s);
  }
  return WaitStream(deadline, "ncclAllGather");
}

absl::Status NcclCollective::AgreeOnCounts(absl::Span<const int64_t> counts, absl::Time deadline) {
  if (agreed_.Contains(counts)) return absl::OkStatus();
  const size_t table = static_cast<size_t>(size_) * size_;
  if (counts_host_ == nullptr) {
    absl::StatusOr<void*> host = api_->HostAlloc((size_ + table) * sizeof(int64_t));
    if (!host.ok()) return Fail(host.status());
    counts_host_ = static_cast<int64_t*>(*host);
    absl::StatusOr<void*> dev = api_->DeviceAllocAsync(table * sizeof(int64_t), stream_);
    if (!dev.ok()) return Fail(dev.status());
    counts_device_ = static_cast<int64_t*>(*dev);
  }
  // The stream is idle (every call waits for it), so the host side is free to write.
  std::copy(counts.begin(), counts.end(), counts_host_);
  int64_t* const mine = counts_device_ + static_cast<size_t>(rank_) * size_;
  if (absl::Status s = api_->MemcpyAsync(mine, counts_host_, size_ * sizeof(int64_t), stream_);
      !s.ok()) {
    return Fail(s);
  }
  // int64 counts travel as pairs of float32 words: an all-gather copies bits.
  BATON_RETURN_IF_ERROR(
      Issue("ncclAllGather",
            api_->AllGather(mine, counts_device_, 2 * static_cast<size_t>(size_), comm_, stream_),
            deadline));
  int64_t* const all = counts_host_ + size_;
  if (absl::Status s = api_->MemcpyAsync(all, counts_device_, table * sizeof(int64_t), stream_);
      !s.ok()) {
    return Fail(s);
  }
  BATON_RETURN_IF_ERROR(WaitStream(deadline, "ncclAllGather"));
  for (int m = 0; m < size_; ++m) {
    const absl::Span<const int64_t> theirs(all + static_cast<size_t>(m) * size_, size_);
    if (theirs != counts) {
      // Every member sees the same table, so every member fails here, naming the first.
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          op_, " on replica ", rank_, ": replica ", m, " passes shard counts {",
          absl::StrJoin(theirs, ", "), "}, this one {", absl::StrJoin(counts, ", "), "}")));
    }
  }
  agreed_.Add(counts);
  return absl::OkStatus();
}

absl::Status NcclCollective::Exchange(absl::Span<const Transfer> transfers, absl::Time deadline) {
  NcclResult r = api_->GroupStart();
  if (r != NcclResult::kSuccess) return Fail(NcclError("ncclGroupStart", r));
  NcclResult first = NcclResult::kSuccess;
  const char* failed_call = nullptr;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;  // both sides know the counts: neither posts it
    r = t.send ? api_->Send(t.buf, t.bytes, t.peer, comm_, stream_)
               : api_->Recv(t.buf, t.bytes, t.peer, comm_, stream_);
    if (r != NcclResult::kSuccess && first == NcclResult::kSuccess) {
      first = r;
      failed_call = t.send ? "ncclSend" : "ncclRecv";
    }
  }
  r = api_->GroupEnd();  // ends the group whatever happened inside it
  if (first != NcclResult::kSuccess) return Fail(NcclError(failed_call, first));
  return Issue("ncclGroupEnd", r, deadline);
}

absl::Status NcclCollective::ReduceScatterSum(float* data, absl::Span<const int64_t> counts,
                                              absl::Time deadline) {
  BATON_RETURN_IF_ERROR(Begin("reduce-scatter"));
  BATON_RETURN_IF_ERROR(CheckDeadline(deadline));
  BATON_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                         ShardOffsets(counts, size_, "reduce-scatter"));
  BATON_RETURN_IF_ERROR(AgreeOnCounts(counts, deadline));
  const int64_t mine = counts[rank_];
  if (offsets.back() == 0) return absl::OkStatus();
  if (mine > 0) BATON_RETURN_IF_ERROR(EnsureGathered(mine * size_));  // before FollowCompute
  BATON_RETURN_IF_ERROR(FollowCompute());
  const size_t bytes = static_cast<size_t>(mine) * sizeof(float);
  float* const shard = data + offsets[rank_];
  if (mine > 0) {
    // gathered_[m * mine, (m + 1) * mine) receives member m's copy of this member's shard.
    if (absl::Status s = api_->MemcpyAsync(gathered_ + rank_ * mine, shard, bytes, stream_);
        !s.ok()) {
      return Fail(s);
    }
  }
  std::vector<Transfer> transfers;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    transfers.push_back(
        {true, data + offsets[p], static_cast<size_t>(counts[p]) * sizeof(float), p});
    transfers.push_back({false, gathered_ + p * mine, bytes, p});
  }
  BATON_RETURN_IF_ERROR(Exchange(transfers, deadline));
  if (mine > 0) {
    if (absl::Status s =
            api_->OrderedSum(shard, gathered_, size_, static_cast<size_t>(mine), stream_);
        !s.ok()) {
      return Fail(s);
    }
  }
  return WaitStream(deadline, "the reduce-scatter's exchange");
}

absl::Status NcclCollective::AllGather(float* data, absl::Span<const int64_t> counts,
                                       absl::Time deadline) {
  BATON_RETURN_IF_ERROR(Begin("all-gather"));
  BATON_RETURN_IF_ERROR(CheckDeadline(deadline));
  BATON_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                         ShardOffsets(counts, size_, "all-gather"));
  BATON_RETURN_IF_ERROR(AgreeOnCounts(counts, deadline));
  if (offsets.back() == 0) return absl::OkStatus();
  BATON_RETURN_IF_ERROR(FollowCompute());
  std::vector<Transfer> transfers;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    transfers.push_back(
        {true, data + offsets[rank_], static_cast<size_t>(counts[rank_]) * sizeof(float), p});
    transfers.push_back(
        {false, data + offsets[p], static_cast<size_t>(counts[p]) * sizeof(float), p});
  }
  BATON_RETURN_IF_ERROR(Exchange(transfers, deadline));
  return WaitStream(deadline, "the all-gather's exchange");
}

}  // namespace baton
