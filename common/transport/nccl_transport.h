// NcclTransport: the Transport (common/comm/transport.h) between GPUs, over NCCL's
// point-to-point operations, reached through NcclApi (nccl_api.h) so that the same code
// runs against the real library and against the fake (common/nccl/nccl_fake_test_util.h) in tests.
//
// Communicators: one two-rank NCCL communicator per pipeline edge, an edge being one
// direction between this rank and a peer (this rank -> P carries its sends to P, P -> this
// rank its receives from P), each keyed by (job key, attempt, source, destination) so
// that one edge can fail, or later fall back, without the others. One per direction, not
// one per pair: NCCL runs the operations of a communicator in issue order, so with one
// communicator per pair two ranks that both send before they receive (which validated
// schedules allow: sends never block, validate.h check 6) would each wait for a receive
// queued behind the other's send. Per direction, validate.h's check 5 (per ordered pair of
// ranks, the receiver receives in the order the sender sends) is all NCCL needs.
//
// Bring-up (Create): the LOWER rank of each pair creates the unique ids of both directions
// and publishes them through an NcclIdExchange; the higher rank fetches them. Every
// communicator is initialised non-blocking, all at once, polled until ready, and then
// proves itself with a handshake (a small hello each way naming job key, attempt and rank;
// also NCCL's first transfer on it, which sets up its connection). All of this must finish
// within options.init_timeout; a communicator that has not is aborted. Create fails naming
// every edge that failed (DEADLINE_EXCEEDED when one did not come up in time, UNAVAILABLE
// when NCCL failed, ...) and lists their peers, so that the caller can fall back to the
// gRPC transport. Both ranks of a pair must list each other as peers.
//
// On the wire, per tensor: a fixed 128-byte header (magic, version, tag, source rank,
// dtype, shape, payload size, checksum; nccl_internal below), then the payload as raw
// bytes (nothing for an empty or undefined tensor). The receiver learns the shape from
// the header and checks the tag.
//
// Streams and ordering. Tensors live on the compute stream (options.compute_stream: every
// kernel and copy of the process runs there, in issue order, cuda_context.h). Each edge
// has a communication stream of its own. A send records an event on the compute stream
// when Send is called and its comm stream waits for that event before reading the tensor,
// so the bytes sent are those of every kernel issued before Send. A receive allocates its
// tensor (Tensor::TryEmpty: the caching allocator hands out memory in compute-stream
// order), makes the comm stream wait for the compute stream before writing into it, and,
// once the bytes are in, makes the compute stream wait for the comm stream, so kernels
// issued after Recv returns see the data.
//
// Send(peer, tag, t): returns at once. The tensor must be on api->device() (CUDA with the
// real library, CPU with the fake) and must not be modified until the SendWork completes;
// the transport keeps it alive until then, also when the SendWork is dropped. A sender
// thread per edge enqueues header and payload in Send-call order. IsCompleted() never
// blocks; Wait(deadline) polls completion, the communicator's asynchronous error and the
// deadline. A send completes when the peer's receive has the bytes (NCCL sends are not
// buffered): its Wait blocks until the peer receives it. At most
// options.max_sends_in_flight sends per peer are enqueued at a time; later ones queue.
//
// Recv(peer, tag, deadline): receives the next header from `peer`, which must name exactly
// `tag` (else FAILED_PRECONDITION naming the expected tag, the one that arrived and the
// peer; a tensor is never delivered under another tag), allocates the tensor on
// api->device() (RESOURCE_EXHAUSTED passes through), receives the payload, and returns
// once it is in. Receives from one peer run one at a time (a second waits for the first,
// within its own deadline).
// CONTRACT: NCCL matches in order, so the caller must issue the receives from a peer in
// the order that peer issued the sends (the executor issues them in clock order, and
// validated schedules guarantee the two orders agree). Unlike tag-matching transports,
// this transport detects a violation instead of waiting for the right tag.
//
// Errors. Failures name the peer and the tag: "rank R: sending <tag> to rank P: ..." and
// "rank R: receiving <tag> from rank P: ...". An edge whose operation failed (deadline,
// mismatched tag, corrupt header, allocation failure, NCCL or CUDA error) has its
// communicator aborted, since NCCL cannot withdraw an operation it has started, and stays
// failed: its pending and later operations fail with the first reason. A deadline
// (DEADLINE_EXCEEDED naming peer and tag) fails only its edge; an NCCL asynchronous error
// (ncclCommGetAsyncError, polled while waiting) or a CUDA error also aborts the whole
// transport with a reason naming the peer. Memory that an aborted operation may still
// touch (its tensor, the staging buffers) is kept until the streams have drained.
//
// Abort(reason) aborts every communicator and fails every pending and later Send, Wait and
// Recv with ABORTED "rank R aborted: <reason>". It cannot tell the peers (their
// communicators with this rank then fail or time out): the caller must propagate the abort
// out of band (the worker through the coordinator).
//
// Destruction: when no operation is pending, each communicator is finalized (bounded by
// options.shutdown_timeout) and then released; with operations pending, the transport is
// aborted first. It never blocks longer than a few shutdown_timeouts. SendWorks may
// outlive the transport: they then report their final status. No other method may run
// concurrently with the destructor.
//
// Thread safety: every method may be called from any thread.
#ifndef BATON_COMMON_TRANSPORT_NCCL_TRANSPORT_H_
#define BATON_COMMON_TRANSPORT_NCCL_TRANSPORT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/comm/transport.h"
#include "common/nccl/nccl_api.h"
#include "common/core/mutex.h"

namespace baton {

// Hands NCCL unique ids from the rank that creates a communicator to the other ranks, out
// of band. In the cluster it goes over baton's gRPC services; in tests and single-process
// runs InMemoryNcclIdExchange does. Keys are unique per communicator (EdgeKey below).
// Thread-safe.
class NcclIdExchange {
 public:
  virtual ~NcclIdExchange() = default;
  // Makes `id` available under `key`.
  virtual absl::Status Publish(const std::string& key, const NcclUniqueId& id) = 0;
  // The id published under `key`, waiting for it until `deadline` (DEADLINE_EXCEEDED).
  virtual absl::StatusOr<NcclUniqueId> Fetch(const std::string& key, absl::Time deadline) = 0;
};

// An NcclIdExchange for ranks that are threads of one process. Publishing a key twice with
// different ids is ALREADY_EXISTS.
class InMemoryNcclIdExchange final : public NcclIdExchange {
 public:
  absl::Status Publish(const std::string& key, const NcclUniqueId& id) override;
  absl::StatusOr<NcclUniqueId> Fetch(const std::string& key, absl::Time deadline) override;

 private:
  Mutex mu_;
  std::condition_variable published_;
  std::map<std::string, NcclUniqueId> ids_ ABSL_GUARDED_BY(mu_);
};

class NcclTransport final : public Transport {
 public:
  struct Options {
    int rank = 0;
    int num_ranks = 0;
    uint64_t job_key = 0;  // every tag sent must carry it (tag.job); part of the id keys
    int64_t attempt = 0;   // a job's retry gets communicators of its own
    // The ranks this rank sends to or receives from (both directions are set up with each).
    std::vector<int> peers;
    // Every communicator must be up, handshake done, within this of Create's call.
    absl::Duration init_timeout = absl::Seconds(60);
    // The cudaStream_t of the process's compute stream (cuda_context.h), where the tensors
    // sent are written and the tensors received are read; with the fake, a stream it made.
    // Required: the legacy default stream will not do, since the compute stream does not
    // synchronise with it. The worker passes the compute stream's handle.
    void* compute_stream = nullptr;
    int cuda_device = 0;            // the device the communicators and streams are made on
    NcclApi* api = nullptr;         // not owned; outlives the transport
    NcclIdExchange* ids = nullptr;  // not owned; used only during Create
    // Sends per peer enqueued and not yet complete before the next waits (each holds a
    // 128-byte staging slot).
    int max_sends_in_flight = 64;
    // Waits poll completion at most this far apart (sooner at first).
    absl::Duration max_poll_interval = absl::Microseconds(200);
    // Bounds each phase of destruction (finalizing communicators, draining streams).
    absl::Duration shutdown_timeout = absl::Seconds(5);
  };

  // Brings up every edge's communicator (see above). INVALID_ARGUMENT for bad options;
  // otherwise the first failure's code with every failed edge named, and the failed peers
  // in `failed_peers` (sorted, when not null).
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      Options options, std::vector<int>* failed_peers = nullptr);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  const char* backend() const override { return "nccl"; }
  int rank() const override { return options_.rank; }

  std::unique_ptr<SendWork> Send(int peer, const TensorTag& tag, const Tensor& t) override;
  absl::StatusOr<Tensor> Recv(int peer, const TensorTag& tag, absl::Time deadline) override;
  void Abort(const absl::Status& reason) override;

 private:
  struct Edge;
  struct SendState;
  struct SendItem;
  class Work;

  explicit NcclTransport(Options options);
  absl::Status BringUp(std::vector<int>* failed_peers);
  void SenderLoop(Edge* e);
  absl::Status SendOne(Edge& e, SendItem& item);

  // Issues one NCCL call on `e`'s communicator and waits until NCCL has enqueued it (no
  // longer kInProgress): true once it has, false when `deadline` passed first (the caller
  // decides what that means); an error on abort, edge failure or an NCCL error (fatal).
  absl::StatusOr<bool> Issue(Edge& e, const std::string& what, const char* call,
                             const std::function<NcclResult(NcclComm)>& op, absl::Time deadline);
  // Polls `done` until it is true (true) or `deadline` passes (false); an error on abort,
  // edge failure, asynchronous NCCL error or a CUDA error (the last two are fatal).
  absl::StatusOr<bool> Await(Edge& e, const std::string& what, absl::Time deadline,
                             const std::function<absl::StatusOr<bool>()>& done);
  // OK while the transport and `e` are healthy, else "<what>: <why>". Polls the
  // communicator's asynchronous error; one fails the edge and aborts the transport.
  absl::Status CheckEdge(Edge& e, const std::string& what);
  // The same without asking NCCL: the abort and the edge's failure.
  absl::Status Flags(const Edge& e, const std::string& what);
  // Sleeps up to `d` (yields for zero), waking early on Abort or an edge failure.
  void Nap(absl::Duration d);

  // Sends: completion is seen by querying the event recorded after the payload.
  bool PollSend(Edge& e, SendState& st);
  absl::Status WaitSend(Edge& e, SendState& st, absl::Time deadline);
  // Finishes `st` unless finished; a failed send's tensor goes to its edge's quarantine.
  void FinishSend(SendState& st, const absl::Status& status);

  // Fails the edge (the first reason stays), fails its pending sends with
  // "<what>: <reason>", then aborts its communicator. Fatal also aborts the transport.
  void FailEdge(Edge& e, absl::StatusCode code, const std::string& reason);
  void Fatal(Edge& e, absl::StatusCode code, const std::string& reason);
  void AbortComm(Edge& e);
  // Finalizes a healthy communicator (until `deadline`), then releases it.
  void CloseComm(Edge& e, absl::Time deadline);
  std::string NcclReason(Edge& e, NcclResult r, NcclComm comm);

  absl::StatusOr<CudaEvent> AcquireEvent();
  void ReleaseEvent(CudaEvent ev);

  Edge* SendEdge(int peer) const;
  Edge* RecvEdge(int peer) const;

  const Options options_;
  NcclApi* const api_;
  CudaStream const compute_;
  // Two per peer (send, receive); fixed after construction.
  std::vector<std::unique_ptr<Edge>> edges_;

  // baton::Mutex (a std::mutex) rather than absl::Mutex: Debian's prebuilt Abseil is not instrumented for
  // ThreadSanitizer. Lock order: Edge::recv_mu (held across a Recv) before everything;
  // mu_ before SendState::mu; Edge::comm_mu (held only around NCCL calls) is never held
  // with mu_ or SendState::mu.
  mutable Mutex mu_;
  std::condition_variable changed_;            // Abort, edge failures, stopping
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);  // OK until Abort
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<CudaEvent> free_events_ ABSL_GUARDED_BY(mu_);
  std::vector<CudaEvent> all_events_ ABSL_GUARDED_BY(mu_);
};

namespace nccl_internal {

// The fixed-size header that precedes every tensor on an edge, and the bring-up hello.
inline constexpr size_t kHeaderBytes = 128;
inline constexpr int kMaxDims = 8;

struct Header {
  bool hello = false;  // the bring-up handshake: tag.job = job key, tag.step = attempt
  TensorTag tag;
  int32_t source_rank = 0;
  bool defined = true;  // false for an undefined Tensor()
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t nbytes = 0;  // payload bytes that follow
};

Header TensorHeader(int source_rank, const TensorTag& tag, const Tensor& t);
// Writes kHeaderBytes to `out`; `h.shape` must have at most kMaxDims dims.
void EncodeHeader(const Header& h, void* out);
// DATA_LOSS for anything but a well-formed header: magic, version, checksum, kind, dtype,
// dims, and a payload size that matches dtype and shape.
absl::StatusOr<Header> DecodeHeader(const void* in);

// The id-exchange key of the communicator carrying src -> dst.
std::string EdgeKey(uint64_t job_key, int64_t attempt, int src, int dst);

}  // namespace nccl_internal

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_NCCL_TRANSPORT_H_
