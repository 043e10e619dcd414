#include "common/nccl/nccl_api.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/cuda_context.h"

#ifdef BATON_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/core/dynamic_library.h"
#ifdef BATON_HAVE_NCCL_H
#include <nccl.h>  // types and constants only: the functions come from dlsym
#endif
#endif

namespace baton {

const char* NcclResultName(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return "ncclResult(unknown)";
}

#if defined(BATON_HAVE_CUDA) && defined(BATON_HAVE_NCCL_H)

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);
static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess);
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) == ncclUnhandledCudaError);
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclResult::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclResult::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);

// Non-blocking communicators and ncclCommFinalize came with NCCL 2.14.
constexpr int kMinNcclVersion = 21400;

// The NCCL functions the transport uses, looked up by name.
struct NcclFunctions {
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
};

absl::Status CudaError(const char* call, cudaError_t e) {
  (void)cudaGetLastError();  // handled here: it must not surface from a later call's check
  return absl::InternalError(
      absl::StrCat(call, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

ncclComm_t Comm(NcclComm c) { return reinterpret_cast<ncclComm_t>(c); }
cudaStream_t Stream(CudaStream s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t Event(CudaEvent e) { return reinterpret_cast<cudaEvent_t>(e); }
NcclResult Result(ncclResult_t r) { return static_cast<NcclResult>(r); }

class RealNccl final : public NcclApi {
 public:
  RealNccl(std::string path, int version, NcclFunctions f)
      : path_(std::move(path)), version_(version), f_(f) {}

  std::string Describe() const override {
    return absl::StrCat("nccl ", version_ / 10000, ".", version_ / 100 % 100, ".", version_ % 100,
                        " (", path_, ")");
  }
  Device device() const override { return Device::kCuda; }

  NcclResult GetUniqueId(NcclUniqueId* id) override {
    ncclUniqueId u;
    const ncclResult_t r = f_.GetUniqueId(&u);
    if (r == ncclSuccess) std::memcpy(id->bytes.data(), &u, sizeof(u));
    return Result(r);
  }
  NcclResult CommInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          int cuda_device) override {
    *comm = nullptr;
    // NCCL binds the communicator to the calling thread's current device.
    if (cudaSetDevice(cuda_device) != cudaSuccess) return NcclResult::kUnhandledCudaError;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId u;
    std::memcpy(&u, id.bytes.data(), sizeof(u));
    ncclComm_t c = nullptr;
    const ncclResult_t r = f_.CommInitRankConfig(&c, nranks, u, rank, &config);
    *comm = reinterpret_cast<NcclComm>(c);
    return Result(r);
  }
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* state) override {
    ncclResult_t s = ncclSuccess;
    const ncclResult_t r = f_.CommGetAsyncError(Comm(comm), &s);
    *state = Result(s);
    return Result(r);
  }
  NcclResult Send(const void* buf, size_t bytes, int peer, NcclComm comm,
                  CudaStream stream) override {
    return Result(f_.Send(buf, bytes, ncclUint8, peer, Comm(comm), Stream(stream)));
  }
  NcclResult Recv(void* buf, size_t bytes, int peer, NcclComm comm, CudaStream stream) override {
    return Result(f_.Recv(buf, bytes, ncclUint8, peer, Comm(comm), Stream(stream)));
  }
  NcclResult AllGather(const void* send, void* recv, size_t count, NcclComm comm,
                       CudaStream stream) override {
    return Result(f_.AllGather(send, recv, count, ncclFloat32, Comm(comm), Stream(stream)));
  }
  NcclResult AllReduceSum(const void* send, void* recv, size_t count, NcclComm comm,
                          CudaStream stream) override {
    return Result(
        f_.AllReduce(send, recv, count, ncclFloat32, ncclSum, Comm(comm), Stream(stream)));
  }
  NcclResult GroupStart() override { return Result(f_.GroupStart()); }
  NcclResult GroupEnd() override { return Result(f_.GroupEnd()); }
  NcclResult CommFinalize(NcclComm comm) override { return Result(f_.CommFinalize(Comm(comm))); }
  NcclResult CommDestroy(NcclComm comm) override { return Result(f_.CommDestroy(Comm(comm))); }
  NcclResult CommAbort(NcclComm comm) override { return Result(f_.CommAbort(Comm(comm))); }
  std::string ErrorString(NcclResult r) override {
    const char* s = f_.GetErrorString(static_cast<ncclResult_t>(r));
    return s != nullptr ? s : NcclResultName(r);
  }
  std::string LastError(NcclComm comm) override {
    const char* s = f_.GetLastError(Comm(comm));
    return s != nullptr ? s : "";
  }

  absl::Status SetDevice(int cuda_device) override {
    const cudaError_t e = cudaSetDevice(cuda_device);
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaSetDevice", e);
  }
  absl::StatusOr<CudaStream> StreamCreate(int cuda_device) override {
    cudaError_t e = cudaSetDevice(cuda_device);
    if (e != cudaSuccess) return CudaError("cudaSetDevice", e);
    cudaStream_t s = nullptr;
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return CudaError("cudaStreamCreateWithFlags", e);
    return reinterpret_cast<CudaStream>(s);
  }
  absl::Status StreamDestroy(CudaStream stream) override {
    const cudaError_t e = cudaStreamDestroy(Stream(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaStreamDestroy", e);
  }
  absl::StatusOr<CudaEvent> EventCreate(int cuda_device) override {
    cudaError_t e = cudaSetDevice(cuda_device);
    if (e != cudaSuccess) return CudaError("cudaSetDevice", e);
    cudaEvent_t ev = nullptr;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return CudaError("cudaEventCreateWithFlags", e);
    return reinterpret_cast<CudaEvent>(ev);
  }
  absl::Status EventDestroy(CudaEvent event) override {
    const cudaError_t e = cudaEventDestroy(Event(event));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaEventDestroy", e);
  }
  absl::Status EventRecord(CudaEvent event, CudaStream stream) override {
    const cudaError_t e = cudaEventRecord(Event(event), Stream(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaEventRecord", e);
  }
  absl::Status StreamWaitEvent(CudaStream stream, CudaEvent event) override {
    const cudaError_t e = cudaStreamWaitEvent(Stream(stream), Event(event), 0);
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaStreamWaitEvent", e);
  }
  absl::StatusOr<bool> EventQuery(CudaEvent event) override {
    const cudaError_t e = cudaEventQuery(Event(event));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      // The runtime records "not ready" as this thread's last error, like any failure:
      // clear it, or the next kernel launch's check on this thread reports it as its own.
      (void)cudaGetLastError();
      return false;
    }
    return CudaError("cudaEventQuery", e);
  }
  absl::StatusOr<void*> DeviceAlloc(size_t bytes, int cuda_device) override {
    cudaError_t e = cudaSetDevice(cuda_device);
    if (e != cudaSuccess) return CudaError("cudaSetDevice", e);
    void* p = nullptr;
    e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return CudaError("cudaMalloc", e);
    return p;
  }
  absl::Status DeviceFree(void* p) override {
    const cudaError_t e = cudaFree(p);
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaFree", e);
  }
  absl::StatusOr<void*> DeviceAllocAsync(size_t bytes, CudaStream stream) override {
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, Stream(stream));
    if (e != cudaSuccess) return CudaError("cudaMallocAsync", e);
    return p;
  }
  absl::Status DeviceFreeAsync(void* p, CudaStream stream) override {
    const cudaError_t e = cudaFreeAsync(p, Stream(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaFreeAsync", e);
  }
  absl::StatusOr<void*> HostAlloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) return CudaError("cudaMallocHost", e);
    return p;
  }
  absl::Status HostFree(void* p) override {
    const cudaError_t e = cudaFreeHost(p);
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaFreeHost", e);
  }
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CudaStream stream) override {
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Stream(stream));
    return e == cudaSuccess ? absl::OkStatus() : CudaError("cudaMemcpyAsync", e);
  }
  absl::Status OrderedSum(float* dst, const float* src, int members, size_t count,
                          CudaStream stream) override {
    return CudaOrderedSumAsync(dst, src, members, static_cast<int64_t>(count),
                               reinterpret_cast<void*>(stream));
  }

 private:
  const std::string path_;
  const int version_;
  const NcclFunctions f_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclApi>> OpenNccl(const std::string& path) {
  std::string error;
  void* lib = OpenLibrary(path, &error);
  if (lib == nullptr) return absl::UnavailableError(error);
  NcclFunctions f;
  std::vector<std::string> missing;
  FindSymbol(lib, "ncclGetVersion", &f.GetVersion, &missing);
  FindSymbol(lib, "ncclGetUniqueId", &f.GetUniqueId, &missing);
  FindSymbol(lib, "ncclCommInitRankConfig", &f.CommInitRankConfig, &missing);
  FindSymbol(lib, "ncclCommGetAsyncError", &f.CommGetAsyncError, &missing);
  FindSymbol(lib, "ncclSend", &f.Send, &missing);
  FindSymbol(lib, "ncclRecv", &f.Recv, &missing);
  FindSymbol(lib, "ncclAllGather", &f.AllGather, &missing);
  FindSymbol(lib, "ncclAllReduce", &f.AllReduce, &missing);
  FindSymbol(lib, "ncclGroupStart", &f.GroupStart, &missing);
  FindSymbol(lib, "ncclGroupEnd", &f.GroupEnd, &missing);
  FindSymbol(lib, "ncclCommFinalize", &f.CommFinalize, &missing);
  FindSymbol(lib, "ncclCommDestroy", &f.CommDestroy, &missing);
  FindSymbol(lib, "ncclCommAbort", &f.CommAbort, &missing);
  FindSymbol(lib, "ncclGetErrorString", &f.GetErrorString, &missing);
  FindSymbol(lib, "ncclGetLastError", &f.GetLastError, &missing);
  if (!missing.empty()) {
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(path, " lacks ", absl::StrJoin(missing, ", "),
                                               " (baton needs NCCL 2.14 or later)"));
  }
  int version = 0;
  if (f.GetVersion(&version) != ncclSuccess || version < kMinNcclVersion) {
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(path, " is NCCL version code ", version,
                                               "; baton needs 2.14 (", kMinNcclVersion,
                                               ") or later"));
  }
  // The library stays loaded for the life of the process, whatever becomes of the API.
  return std::make_unique<RealNccl>(path, version, f);
}

namespace {

absl::StatusOr<NcclApi*> Load() {
  std::vector<std::string> errors;
#ifdef BATON_NCCL_LIBRARY_HINT
  const char* hint = BATON_NCCL_LIBRARY_HINT;
#else
  const char* hint = nullptr;
#endif
  for (const std::string& candidate :
       LibraryCandidates("BATON_NCCL_LIBRARY", "libnccl.so.2", hint)) {
    absl::StatusOr<std::unique_ptr<NcclApi>> api = OpenNccl(candidate);
    if (api.ok()) return api->release();  // lives as long as the process
    errors.emplace_back(api.status().message());
  }
  return absl::UnavailableError(absl::StrCat("cannot load NCCL: ", absl::StrJoin(errors, "; ")));
}

}  // namespace

absl::StatusOr<NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi*>* const loaded = new absl::StatusOr<NcclApi*>(Load());
  return *loaded;
}

#elif defined(BATON_HAVE_CUDA)

absl::StatusOr<std::unique_ptr<NcclApi>> OpenNccl(const std::string& path) {
  return absl::UnavailableError("built without NCCL: nccl.h was not found at build time");
}
absl::StatusOr<NcclApi*> LoadNccl() { return OpenNccl("").status(); }

#else

absl::StatusOr<std::unique_ptr<NcclApi>> OpenNccl(const std::string& path) {
  return absl::UnavailableError("built without CUDA");
}
absl::StatusOr<NcclApi*> LoadNccl() { return OpenNccl("").status(); }

#endif

}  // namespace baton
