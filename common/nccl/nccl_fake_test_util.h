// FakeNccl: an NcclApi (nccl_api.h) that connects threads of one process through host
// memory, so that the NCCL transport's logic is tested without a GPU.
//
// What it models, as NCCL and CUDA behave:
//  - Communicators rendezvous by unique id in a process-wide registry: each rank (usually
//    each with its own FakeNccl, so that faults can differ per rank) calls CommInitRank,
//    which returns kInProgress; the communicator becomes kSuccess once every rank joined.
//  - A stream is an in-order work queue run by a thread of its own; an event completes when
//    its stream reaches it; StreamWaitEvent holds a stream until the event's latest record
//    (at the time of the call) completed.
//  - Send and Recv match in issue order per (communicator, source, destination); a send
//    completes only when the matching receive has copied its bytes, a receive when it has
//    them. Buffers are host memory (device() is kCpu).
//  - Collectives (AllGather, AllReduceSum) meet by their sequence number on the
//    communicator: each member's n-th call waits on its stream until every member made its
//    n-th, then writes the result. AllReduceSum sums each chunk starting at a different
//    member (as a ring does), so its bits depend on the group's size, not the members'
//    order. Fault injection counts a collective as one operation.
//  - GroupStart/GroupEnd: the Send and Recv calls between them (on one stream) are queued
//    at GroupEnd as one piece of work that finishes when all of them have: every send of
//    the group is posted before any of its receives waits, so a member may send to and
//    receive from each of its peers in one group without deadlock, as with NCCL.
//  - CommAbort makes every pending operation of the communicator finish (without its
//    data); a broken communicator's operations hang until then, as NCCL's do.
// It also checks its caller: calls on a communicator that is not ready, calls made while
// the previous one is still kInProgress, a mismatched byte count and unknown handles fail
// with kInvalidUsage / kInvalidArgument / INVALID_ARGUMENT, so that transport bugs show.
//
// Unlike CUDA, StreamDestroy drops the work still queued (CUDA would run it): the transport
// destroys a stream only once its work is done or its communicator aborted.
//
// Thread-safe: one process-wide mutex guards every fake object.
#ifndef BATON_COMMON_NCCL_NCCL_FAKE_TEST_UTIL_H_
#define BATON_COMMON_NCCL_NCCL_FAKE_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/nccl/nccl_api.h"

namespace baton {

// Fault injection. Operations are counted per communicator, from 1: each Send or Recv
// call is one (the NCCL transport's bring-up handshake is each communicator's first).
struct FakeNcclOptions {
  // CommInitRank never completes: the communicator stays kInProgress (and so do its
  // peers', which wait for it to join), like a rank that hangs in bring-up.
  bool init_never_completes = false;
  // CommInitRank fails: the communicator's state becomes kSystemError.
  bool init_fails = false;
  // CommInitRank blocks until every member of the communicator joined, as NCCL does with
  // NCCL_COMM_BLOCKING=1 in the environment (which overrides the config's non-blocking
  // flag). A real one waits forever; this one gives up after blocking_init_timeout and
  // returns kSystemError saying so.
  bool blocking_init = false;
  absl::Duration blocking_init_timeout = absl::Seconds(3);
  // From this operation on (0: never) the communicator is broken: CommGetAsyncError
  // reports `async_error`, and this and every pending or later operation on it hangs
  // until CommAbort, as NCCL does on a failed link.
  int async_error_at_op = 0;
  NcclResult async_error = NcclResult::kRemoteError;
  // From this operation on (0: never) receives are accepted but never posted: the peer's
  // matching sends never complete (a rank that stopped receiving).
  int drop_recvs_from_op = 0;
  // This operation (0: never), if a send, claims `bytes_delta` more bytes than it was
  // given (only the real bytes are ever read): the matching receive sees a byte count
  // mismatch and both communicators break with kInvalidUsage.
  int mismatch_bytes_at_op = 0;
  int64_t bytes_delta = 4;
  // Every Send and Recv returns kInProgress, and the communicator then reports kInProgress
  // for this many CommGetAsyncError polls (the work is queued at once regardless).
  int in_progress_polls = 0;
};

class FakeNccl final : public NcclApi {
 public:
  explicit FakeNccl(FakeNcclOptions options = {});
  // Aborts the communicators and stops the streams this instance still has.
  ~FakeNccl() override;
  FakeNccl(const FakeNccl&) = delete;
  FakeNccl& operator=(const FakeNccl&) = delete;

  std::string Describe() const override { return "fake nccl"; }
  Device device() const override { return Device::kCpu; }

  NcclResult GetUniqueId(NcclUniqueId* id) override;
  NcclResult CommInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          int cuda_device) override;
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* state) override;
  NcclResult Send(const void* buf, size_t bytes, int peer, NcclComm comm,
                  CudaStream stream) override;
  NcclResult Recv(void* buf, size_t bytes, int peer, NcclComm comm, CudaStream stream) override;
  NcclResult AllGather(const void* send, void* recv, size_t count, NcclComm comm,
                       CudaStream stream) override;
  NcclResult AllReduceSum(const void* send, void* recv, size_t count, NcclComm comm,
                          CudaStream stream) override;
  NcclResult GroupStart() override;
  NcclResult GroupEnd() override;
  NcclResult CommFinalize(NcclComm comm) override;
  NcclResult CommDestroy(NcclComm comm) override;
  NcclResult CommAbort(NcclComm comm) override;
  std::string ErrorString(NcclResult r) override;
  std::string LastError(NcclComm comm) override;

  absl::Status SetDevice(int cuda_device) override { return absl::OkStatus(); }
  absl::StatusOr<CudaStream> StreamCreate(int cuda_device) override;
  absl::Status StreamDestroy(CudaStream stream) override;
  absl::StatusOr<CudaEvent> EventCreate(int cuda_device) override;
  absl::Status EventDestroy(CudaEvent event) override;
  absl::Status EventRecord(CudaEvent event, CudaStream stream) override;
  absl::Status StreamWaitEvent(CudaStream stream, CudaEvent event) override;
  absl::StatusOr<bool> EventQuery(CudaEvent event) override;
  absl::StatusOr<void*> DeviceAlloc(size_t bytes, int cuda_device) override;
  absl::Status DeviceFree(void* p) override;
  absl::StatusOr<void*> DeviceAllocAsync(size_t bytes, CudaStream stream) override;
  // Frees in stream order: after the work queued on `stream` before it.
  absl::Status DeviceFreeAsync(void* p, CudaStream stream) override;
  absl::StatusOr<void*> HostAlloc(size_t bytes) override;
  absl::Status HostFree(void* p) override;
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CudaStream stream) override;
  absl::Status OrderedSum(float* dst, const float* src, int members, size_t count,
                          CudaStream stream) override;

  // Test helpers.
  // Queues `fn` on `stream` (cudaLaunchHostFunc): it runs on the stream's thread, in
  // stream order, without the fake's lock held.
  absl::Status LaunchHostFunc(CudaStream stream, std::function<void()> fn);
  // The objects this instance has handed out and not yet released.
  struct Counts {
    int comms = 0;      // live communicators
    int aborted = 0;    // communicators ended with CommAbort (ever)
    int destroyed = 0;  // ended with CommDestroy (ever)
    // Ended (either way) after a CommFinalize that had completed, nothing left pending and
    // no error (ever): a clean close rather than one that gave up on the finalize.
    int finalized = 0;
    int streams = 0;
    int events = 0;
    int buffers = 0;  // DeviceAlloc and HostAlloc blocks
    // DeviceFree calls (ever): each would wait for the whole device on a GPU.
    int device_wide_frees = 0;
  };
  Counts counts() const;

  struct Comm;
  struct Stream;
  struct Event;
  struct Group;

 private:
  void EndComm(NcclComm comm, bool abort);
  NcclResult Enqueue(bool send, void* buf, size_t bytes, int peer, NcclComm comm,
                     CudaStream stream);
  NcclResult Collective(bool gather, const void* send, void* recv, size_t count, NcclComm comm,
                        CudaStream stream);
  // With the fake mutex held: looks up a communicator and stream and checks that the
  // communicator takes an operation now; counts an operation (injecting faults).
  NcclResult Admit(NcclComm comm, CudaStream stream, Comm** c, Stream** s);
  int CountOp(Comm* c);

  const FakeNcclOptions options_;
  // Guarded by the process-wide fake mutex (nccl_fake_test_util.cc).
  absl::flat_hash_map<NcclComm, std::shared_ptr<Comm>> comms_;
  absl::flat_hash_map<CudaStream, std::shared_ptr<Stream>> streams_;
  absl::flat_hash_map<CudaEvent, std::shared_ptr<Event>> events_;
  absl::flat_hash_map<void*, size_t> buffers_;
  int aborted_ = 0;
  int destroyed_ = 0;
  int finalized_ = 0;
  int device_wide_frees_ = 0;
  // Open between GroupStart and GroupEnd (null otherwise): the operations issued so far.
  std::unique_ptr<Group> group_;
};

std::unique_ptr<FakeNccl> MakeFakeNccl(FakeNcclOptions options = {});

}  // namespace baton

#endif  // BATON_COMMON_NCCL_NCCL_FAKE_TEST_UTIL_H_
