// NcclApi: the few NCCL and CUDA runtime calls the NCCL transport (nccl_transport.h) makes,
// behind one interface, so that the transport's logic runs unchanged against a fake.
//
// Two implementations:
//  - LoadNccl(): the real one. NCCL is loaded at run time with dlopen("libnccl.so.2") and
//    its functions looked up with dlsym (as xgboost's nccl_stub does), so one binary runs
//    on hosts without NCCL and reports UNAVAILABLE naming what is missing; the stream,
//    event and memory calls go to the CUDA runtime the binary links. A build without CUDA
//    (BATON_HAVE_CUDA undefined) has no real implementation: LoadNccl is UNAVAILABLE
//    "built without CUDA".
//  - MakeFakeNccl() (nccl_fake_test_util.h, linked by tests only): threads of one process talking through host memory,
//    with fault injection, for tests.
//
// The interface mirrors the C calls one to one (names drop the nccl/cuda prefix), with
// opaque handles so that this header includes no CUDA or NCCL header:
//  - NCCL calls return NcclResult, NCCL's own result codes; ErrorString and LastError give
//    the words. Communicators are NON-BLOCKING (ncclConfig_t.blocking = 0): any call on one
//    may return kInProgress, after which the caller must poll CommGetAsyncError until it is
//    no longer kInProgress before the next call on that communicator (and before relying
//    on the operation being on its stream). The result then is the operation's.
//  - CUDA calls return absl::Status: INTERNAL naming the call and the CUDA error.
//
// Thread safety: an implementation is safe to call from any thread, but NCCL's own rule
// holds: calls on one communicator must not overlap, except CommGetAsyncError and
// CommAbort, which may be called while another thread is between calls on it. A stream or
// event may be used from several threads as CUDA allows.
#ifndef BATON_COMMON_NCCL_NCCL_API_H_
#define BATON_COMMON_NCCL_NCCL_API_H_

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/core/tensor.h"

namespace baton {

// ncclResult_t's values (checked against nccl.h where the real implementation is built).
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};
// "ncclSuccess", "ncclRemoteError", ...; "ncclResult(N)" for a value NCCL may add later.
const char* NcclResultName(NcclResult r);

// ncclUniqueId: 128 opaque bytes naming one communicator, created by one rank and handed
// to the others out of band.
inline constexpr size_t kNcclUniqueIdBytes = 128;
struct NcclUniqueId {
  std::array<char, kNcclUniqueIdBytes> bytes{};
  friend bool operator==(const NcclUniqueId& a, const NcclUniqueId& b) {
    return a.bytes == b.bytes;
  }
};

// Opaque handles: ncclComm_t, cudaStream_t and cudaEvent_t in the real implementation,
// the fake's own objects in the fake. Null is never a valid handle.
struct NcclCommHandle;
struct CudaStreamHandle;
struct CudaEventHandle;
using NcclComm = NcclCommHandle*;
using CudaStream = CudaStreamHandle*;
using CudaEvent = CudaEventHandle*;

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // "nccl 2.28.9 (libnccl.so.2)" or "fake nccl"; for messages and logs.
  virtual std::string Describe() const = 0;
  // Where the buffers passed to Send/Recv live: kCuda for the real library, kCpu for the
  // fake. The transport sends and receives tensors on this device only.
  virtual Device device() const = 0;

  // --- NCCL ---
  virtual NcclResult GetUniqueId(NcclUniqueId* id) = 0;
  // ncclCommInitRankConfig with blocking = 0 on CUDA device `cuda_device`: returns at
  // once, normally kInProgress; poll CommGetAsyncError until kSuccess (ready) or an error.
  // On kInProgress and kSuccess *comm is set and must eventually be given to CommAbort or
  // CommDestroy; on an error it may be set too (then it must be aborted).
  virtual NcclResult CommInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                                  int cuda_device) = 0;
  // The communicator's state: kInProgress while an init or enqueue is under way, kSuccess,
  // or the asynchronous error that broke it (then only CommAbort is useful).
  virtual NcclResult CommGetAsyncError(NcclComm comm, NcclResult* state) = 0;
  // Point-to-point transfers of `bytes` bytes (ncclUint8) on `stream`. A send completes
  // once the peer's matching receive has the bytes; sends and receives between two ranks
  // of one communicator match in issue order.
  virtual NcclResult Send(const void* buf, size_t bytes, int peer, NcclComm comm,
                          CudaStream stream) = 0;
  virtual NcclResult Recv(void* buf, size_t bytes, int peer, NcclComm comm, CudaStream stream) = 0;
  // Collectives on `count` float32 elements (ncclFloat32), every member of `comm` calling
  // the same ones in the same order. AllGather leaves member m's `count` elements at
  // recv[m * count, (m + 1) * count) on every member. AllReduceSum (ncclAllReduce with
  // ncclSum) leaves the sum in recv on every member, summed in the library's own order
  // (a ring or tree: not the members' order, and not fixed across sizes or versions).
  // send may equal recv (AllGather: send == recv + rank * count).
  virtual NcclResult AllGather(const void* send, void* recv, size_t count, NcclComm comm,
                               CudaStream stream) = 0;
  virtual NcclResult AllReduceSum(const void* send, void* recv, size_t count, NcclComm comm,
                                  CudaStream stream) = 0;
  // ncclGroupStart/End: operations between them are issued together (a send to and a
  // receive from the same rank need a group so that neither waits for the other).
  virtual NcclResult GroupStart() = 0;
  virtual NcclResult GroupEnd() = 0;
  // Graceful shutdown: CommFinalize (may return kInProgress: poll CommGetAsyncError until
  // kSuccess), then CommDestroy. CommAbort ends the communicator at once, making pending
  // operations on its streams finish without their data; it is the only safe way out of
  // an error or a hang. After CommDestroy or CommAbort the handle is gone.
  virtual NcclResult CommFinalize(NcclComm comm) = 0;
  virtual NcclResult CommDestroy(NcclComm comm) = 0;
  virtual NcclResult CommAbort(NcclComm comm) = 0;
  // ncclGetErrorString: the words for a result.
  virtual std::string ErrorString(NcclResult r) = 0;
  // ncclGetLastError: NCCL's own description of the last error on `comm` (or in the
  // process for null); may be empty.
  virtual std::string LastError(NcclComm comm) = 0;

  // --- CUDA ---
  // Makes `cuda_device` current for the calling thread (cudaSetDevice).
  virtual absl::Status SetDevice(int cuda_device) = 0;
  // A stream that does not synchronise with the legacy default stream
  // (cudaStreamNonBlocking), on `cuda_device`.
  virtual absl::StatusOr<CudaStream> StreamCreate(int cuda_device) = 0;
  // Work already queued still runs; the handle is gone.
  virtual absl::Status StreamDestroy(CudaStream stream) = 0;
  // An event without timing (cudaEventDisableTiming), on `cuda_device`.
  virtual absl::StatusOr<CudaEvent> EventCreate(int cuda_device) = 0;
  virtual absl::Status EventDestroy(CudaEvent event) = 0;
  // The event completes when `stream` reaches this point.
  virtual absl::Status EventRecord(CudaEvent event, CudaStream stream) = 0;
  // Work queued on `stream` after this call waits for the event's latest record at the
  // time of the call (later records do not matter).
  virtual absl::Status StreamWaitEvent(CudaStream stream, CudaEvent event) = 0;
  // Without blocking: true when the event's latest record completed (or it was never
  // recorded), false while pending; an error from the work before it.
  virtual absl::StatusOr<bool> EventQuery(CudaEvent event) = 0;
  // Device memory (cudaMalloc) for the transport's small staging buffers. DeviceFree
  // (cudaFree) waits for the whole device: never call it while a communicator of this
  // process may have a kernel waiting for a peer (that kernel may wait for this process).
  virtual absl::StatusOr<void*> DeviceAlloc(size_t bytes, int cuda_device) = 0;
  virtual absl::Status DeviceFree(void* p) = 0;
  // Stream-ordered device memory (cudaMallocAsync, cudaFreeAsync on `stream`): usable by
  // work queued on `stream` after the call, given back after the work queued before the
  // free. Neither waits for the device, so both are safe while communicators are live.
  virtual absl::StatusOr<void*> DeviceAllocAsync(size_t bytes, CudaStream stream) = 0;
  virtual absl::Status DeviceFreeAsync(void* p, CudaStream stream) = 0;
  // Page-locked host memory (cudaMallocHost), which asynchronous copies need.
  virtual absl::StatusOr<void*> HostAlloc(size_t bytes) = 0;
  virtual absl::Status HostFree(void* p) = 0;
  // cudaMemcpyAsync(..., cudaMemcpyDefault, stream): host memory must be HostAlloc's.
  virtual absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CudaStream stream) = 0;

  // --- baton's one kernel on a communication stream ---
  // dst[i] = ((src[i] + src[count + i]) + src[2 * count + i]) + ... over `members` blocks of
  // `count` floats, in block order, queued on `stream`: the ordered sum of a gathered
  // buffer (collective.h's contract). Plain float additions, no contraction.
  virtual absl::Status OrderedSum(float* dst, const float* src, int members, size_t count,
                                  CudaStream stream) = 0;
};

// The real NCCL, loaded once per process (the first call's result, success or failure,
// is kept; the library is never unloaded). Tries "libnccl.so.2" in the loader's search
// path, then the copy found at build time beside the CUDA toolkit, if any. UNAVAILABLE
// naming what is missing: the library (with dlerror's words), a function (NCCL older than
// 2.14, which lacks non-blocking communicators), or CUDA in this build.
absl::StatusOr<NcclApi*> LoadNccl();

// The NCCL library at `path` (a file name the loader searches for, or a path), loaded
// afresh: what LoadNccl does for each candidate, uncached, for tests and tools. The
// library is never unloaded. UNAVAILABLE as LoadNccl.
absl::StatusOr<std::unique_ptr<NcclApi>> OpenNccl(const std::string& path);

}  // namespace baton

#endif  // BATON_COMMON_NCCL_NCCL_API_H_
