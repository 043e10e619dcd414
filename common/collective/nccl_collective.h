// The NCCL engine: a Collective whose members are the GPUs of a data-parallel group, on a
// communicator of their own (not the pipeline transport's), reached through NcclApi
// (common/nccl/nccl_api.h) so that the fake runs its logic on any machine.
//
// AllReduceSum in the default (ordered) mode keeps collective.h's contract with
// ncclAllGather into a device buffer of size * n floats, then one kernel that sums the
// gathered copies in member order (NcclApi::OrderedSum), on the engine's own stream: the
// same bits as the Gloo and in-process engines and the reference trainer. Fast mode
// (options.ordered false) is one ncclAllReduce(ncclSum): less traffic, NCCL's summation
// order.
//
// The sharded operations first all-gather every member's counts (size * size integers,
// through host memory: one more round trip; a member whose counts differ fails every
// member with INVALID_ARGUMENT naming it), then, in either mode, exchange shards with
// grouped ncclSend/ncclRecv: ReduceScatterSum sends member m its copy of shard m and
// receives the others' copies of its own ((size - 1) * counts[rank] floats; (size - 1) /
// size of the data on average, against AllReduceSum's size - 1 times it), then sums them
// in member order with OrderedSum, so its shard has AllReduceSum's ordered bits.
// AllGather sends its shard to every member and receives theirs (n - counts[rank] floats).
//
// Data: device() is the API's (kCuda for the real library, kCpu for the fake); the buffer
// passed to AllReduceSum must be memory of that device, and holds the result when the call
// returns (the engine's stream has finished with it). With options.compute_stream the
// buffer may still be being written by work queued on that stream: each call records an
// event there and the engine's stream waits for it (follows_compute_stream()). Without
// one, the caller must have synchronised the writes.
//
// Deadlines and failures: every wait polls the stream's event and the communicator's
// asynchronous error. At the deadline, on an NCCL error, or when Abort was called, the
// communicator is aborted (ncclCommAbort: the stream's pending work ends) and this and
// every later call fails, naming the cause. Other members notice at their own deadline or
// through their own abort (NCCL tells no one), as with Gloo.
//
// Thread safety: one collective call at a time (collective.h); Abort from any thread.
#ifndef BATON_COMMON_COLLECTIVE_NCCL_COLLECTIVE_H_
#define BATON_COMMON_COLLECTIVE_NCCL_COLLECTIVE_H_

#include <atomic>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/comm/collective.h"
#include "common/core/mutex.h"
#include "common/core/tensor.h"
#include "common/nccl/nccl_api.h"

namespace baton {

struct NcclCollectiveOptions {
  NcclApi* api = nullptr;  // not owned; outlives the engine
  // The group's communicator: member 0 makes it (NcclApi::GetUniqueId) and every member
  // passes the same id (the worker hands it over its rendezvous).
  NcclUniqueId id;
  int cuda_device = 0;
  bool ordered = true;  // false: ncclAllReduce (REDUCE_MODE_FAST)
  // How long the members have to join (ncclCommInitRank completing).
  absl::Duration init_timeout = absl::Seconds(60);
  // The stream that writes AllReduceSum's buffers (the process's compute stream, as an
  // opaque cudaStream_t; a stream of the fake in tests), or nullptr (above).
  void* compute_stream = nullptr;
};

class NcclCollective final : public Collective {
 public:
  // Joins the group as member `rank` of `size`. DEADLINE_EXCEEDED when the others do not
  // join within options.init_timeout; UNAVAILABLE with NCCL's words when it fails.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Connect(
      int rank, int size, const NcclCollectiveOptions& options);
  // Finalises the communicator (aborts it after a failure), waits for the stream, frees.
  ~NcclCollective() override;
  NcclCollective(const NcclCollective&) = delete;
  NcclCollective& operator=(const NcclCollective&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return api_->device(); }
  bool ordered() const override { return ordered_; }
  bool follows_compute_stream() const override { return compute_ != nullptr; }
  const char* engine() const override { return "nccl"; }
  absl::Status AllReduceSum(float* data, int64_t n, absl::Time deadline) override;
  absl::Status ReduceScatterSum(float* data, absl::Span<const int64_t> counts,
                                absl::Time deadline) override;
  absl::Status AllGather(float* data, absl::Span<const int64_t> counts,
                         absl::Time deadline) override;
  void Abort(const absl::Status& why) override;

 private:
  // One point-to-point transfer of a grouped exchange.
  struct Transfer {
    bool send;
    void* buf;
    size_t bytes;
    int peer;
  };

  // Starts a call named `op` (for messages): fails if the engine failed.
  absl::Status Begin(const char* op);
  // DEADLINE_EXCEEDED once `deadline` has passed.
  absl::Status CheckDeadline(absl::Time deadline) const;
  // Orders this stream after the compute stream's writes so far (with a compute stream).
  absl::Status FollowCompute();
  // Waits for the communicator to take one NCCL call (result `r`).
  absl::Status Issue(const char* call, NcclResult r, absl::Time deadline);
  // gathered_ holds at least `floats` floats. The buffer comes from device()'s allocator
  // (Tensor::TryEmpty: on a GPU the caching allocator the compute stream's tensors come
  // from), not from a stream-ordered pool beside it: it reuses the blocks that allocator
  // has cached (which it cannot give back to CUDA while communicators are live), so a GPU
  // whose memory the job's tensors have cached can still hold it, and the allocator's
  // statistics count it. That allocator may hand out a block that work still queued on the
  // compute stream was using before it was freed, so callers call this before
  // FollowCompute, whose event then covers that work.
  absl::Status EnsureGathered(int64_t floats);
  // Fails (and aborts) unless every member passes these counts.
  absl::Status AgreeOnCounts(absl::Span<const int64_t> counts, absl::Time deadline);
  // The transfers (those of 0 bytes skipped) as one NCCL group.
  absl::Status Exchange(absl::Span<const Transfer> transfers, absl::Time deadline);

  NcclCollective(NcclApi* api, int rank, int size, bool ordered, int cuda_device,
                 CudaStream compute, NcclComm comm);

  // Waits until the communicator's last call is no longer in progress; its result.
  NcclResult Settle(absl::Time deadline);
  // Waits for the stream to pass `event_` (recorded last); fails on an NCCL error, at the
  // deadline or on Abort.
  absl::Status WaitStream(absl::Time deadline, const char* what);
  // Aborts the communicator (once) and records `s` as the reason later calls fail with.
  absl::Status Fail(const absl::Status& s);
  absl::Status NcclError(const char* call, NcclResult r);

  NcclApi* const api_;
  const int rank_;
  const int size_;
  const bool ordered_;
  const int cuda_device_;
  NcclComm comm_ = nullptr;      // null once aborted
  CudaStream stream_ = nullptr;  // the engine's own
  CudaEvent event_ = nullptr;
  CudaStream const compute_;      // options.compute_stream; not owned
  CudaEvent written_ = nullptr;   // recorded on compute_ by each call (when compute_ is set)
  Tensor gathered_buffer_;        // EnsureGathered's; leaked if the stream never drained
  float* gathered_ = nullptr;     // gathered_capacity_ floats on device(): the ordered paths'
  int64_t gathered_capacity_ = 0;
  int64_t* counts_device_ = nullptr;  // size_ * size_ counts on device(): AgreeOnCounts's
  int64_t* counts_host_ = nullptr;    // size_ + size_ * size_ counts in HostAlloc's memory
  AgreedCounts agreed_;               // AgreeOnCounts's; one call at a time
  const char* op_ = "all-reduce";     // the call under way, for messages
  Mutex mu_;
  absl::Status failed_;                 // guarded by mu_: why calls fail from now on
  std::atomic<bool> abort_requested_{false};
};

}  // namespace baton

#endif  // BATON_COMMON_COLLECTIVE_NCCL_COLLECTIVE_H_
