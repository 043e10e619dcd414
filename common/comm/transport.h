// Transport: tagged point-to-point tensor exchange between pipeline ranks.
//
// One interface, several backends: the in-process transport (inproc_transport.h) connects
// ranks that are threads of one process; the gRPC and NCCL transports connect processes
// and GPUs. An operation a backend cannot do fails with a status naming the backend.
//
// Semantics every backend keeps:
//  - Send is asynchronous: it returns a SendWork at once. The sender must not modify the
//    tensor until the work completes; the receiver gets its own tensor (never aliasing the
//    sender's storage).
//  - Recv(peer, tag) returns the tensor `peer` sent with exactly `tag`, whatever order
//    tensors arrive in; tags are unique within a job. Every wait has a deadline:
//    DEADLINE_EXCEEDED names the peer and tag when it passes.
//  - Abort(reason) fails every pending and later Send/Recv/Wait of this transport with
//    ABORTED carrying the reason, and tells the peers it can reach, so that one failing rank
//    ends the step on every rank instead of leaving them waiting.
// Cross-rank invariant: schedules are validated so that, per pair of ranks, sends and
// receives happen in the same order (transports that match in order, like NCCL, rely on
// this; tag-matching transports do not need it).
//
// Thread safety: all methods may be called from any thread.
#ifndef BATON_COMMON_COMM_TRANSPORT_H_
#define BATON_COMMON_COMM_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/core/tensor.h"

namespace baton {

enum class TensorKind : uint8_t {
  kActivation = 0,  // forward: output of `stage`, input of stage + 1
  kGradient = 1,    // backward: gradient of `stage`'s input, sent to stage - 1
  kTiedGradient = 2,  // TIE_GRAD: `stage`'s part of the tied embedding's gradient, to the
                      // other end (microbatch 0)
  kGradNorm = 3,      // CLIP_GRAD: the gradient norm's chain between adjacent ranks; `stage`
                      // is the sending RANK; microbatch 0 carries the blocks' squared norms
                      // forward (rank r to r + 1), microbatch 1 the total back (r + 1 to r)
};

// Names one tensor of one job uniquely.
struct TensorTag {
  uint64_t job = 0;
  int64_t step = 0;
  int32_t microbatch = 0;
  int32_t stage = 0;  // the sending stage
  TensorKind kind = TensorKind::kActivation;

  // "step 3 microbatch 1 stage 2 activation": never the job key (a secret: see tensor.proto).
  std::string ToString() const;

  friend bool operator==(const TensorTag& a, const TensorTag& b) {
    return a.job == b.job && a.step == b.step && a.microbatch == b.microbatch &&
           a.stage == b.stage && a.kind == b.kind;
  }
  template <typename H>
  friend H AbslHashValue(H h, const TensorTag& t) {
    return H::combine(std::move(h), t.job, t.step, t.microbatch, t.stage, t.kind);
  }
};

// Handle of an asynchronous send.
class SendWork {
 public:
  virtual ~SendWork() = default;
  // Blocks until the tensor has left the sender's hands (buffered by the transport or
  // delivered) or the deadline passes (DEADLINE_EXCEEDED). Returns the send's error, if any.
  virtual absl::Status Wait(absl::Time deadline) = 0;
  virtual bool IsCompleted() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* backend() const = 0;  // "inproc", "grpc", "nccl"
  virtual int rank() const = 0;

  virtual std::unique_ptr<SendWork> Send(int peer, const TensorTag& tag, const Tensor& t) = 0;
  virtual absl::StatusOr<Tensor> Recv(int peer, const TensorTag& tag, absl::Time deadline) = 0;
  virtual void Abort(const absl::Status& reason) = 0;
};

// A SendWork that is already complete with `status`.
std::unique_ptr<SendWork> CompletedSend(absl::Status status);

}  // namespace baton

#endif  // BATON_COMMON_COMM_TRANSPORT_H_
