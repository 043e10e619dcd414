// TensorServiceImpl: the receiving end of the gRPC tensor transport.
//
// Serves baton.v1.TensorService.Push over a TensorInbox. Each Push stream carries, per
// tensor, a header frame and then chunk frames (proto/baton/v1/tensor.proto). The handler
// checks the header (known dtype and kind, shape product x dtype size == byte_length), waits
// for room in the inbox (backpressure: while it waits it stops reading, so HTTP/2 flow
// control stops the sender), allocates the tensor and copies each chunk's payload straight
// from gRPC's receive buffers into it (no protobuf bytes field in between), and files it
// once exactly byte_length bytes arrived. An abort frame aborts the inbox's job.
//
// Errors end the stream with a status naming the source rank and the tag:
// INVALID_ARGUMENT for a malformed stream (unknown dtype, wrong size, chunks adding up to
// more or less than byte_length, a chunk without a header), and the inbox's refusals
// (FAILED_PRECONDITION for a tag of another job, ALREADY_EXISTS for a duplicate,
// RESOURCE_EXHAUSTED when the inbox stays full past space_timeout, ABORTED).
//
// The generated service's Push (which would parse every chunk into a protobuf `bytes`
// copy) is replaced by a handler on raw byte buffers; the method name and wire format are
// unchanged. Rendezvous (the NCCL transport's out-of-band setup) files small messages in
// a RendezvousBox.
#ifndef BATON_COMMON_TRANSPORT_TENSOR_SERVICE_H_
#define BATON_COMMON_TRANSPORT_TENSOR_SERVICE_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "baton/v1/tensor.grpc.pb.h"
#include "common/transport/rendezvous.h"
#include "common/transport/tensor_inbox.h"
#include "grpcpp/grpcpp.h"

namespace baton {

struct TensorServiceStats {
  int64_t streams = 0;  // Push streams accepted
  int64_t tensors = 0;  // tensors filed
  int64_t bytes = 0;    // payload bytes filed
};

class TensorServiceImpl final : public baton::v1::TensorService::Service {
 public:
  struct Options {
    // How long one tensor may wait for room in a full inbox before its stream fails.
    absl::Duration space_timeout = absl::Seconds(60);
    // Headers announcing more bytes than this are refused before allocating anything.
    int64_t max_tensor_bytes = int64_t{16} << 30;
    // Stop glibc malloc from handing freed memory back to the kernel (process-wide, on
    // the first service constructed). gRPC reads the socket into freshly malloc'ed
    // buffers of up to a few MiB and frees them once the payload is copied out; with
    // glibc's defaults the arena is trimmed (madvise) after every few such buffers, and
    // the next read page-faults and zeroes the memory all over again: a quarter of the
    // receiving CPU time at 4 MiB tensors (docs/benchmarks.md, "Tensor transport").
    bool tune_malloc = true;
    // Where Rendezvous messages go (not owned); without one, Rendezvous is UNIMPLEMENTED.
    RendezvousBox* rendezvous = nullptr;
  };

  explicit TensorServiceImpl(TensorInbox* inbox) : TensorServiceImpl(inbox, Options()) {}
  TensorServiceImpl(TensorInbox* inbox, Options options);

  TensorServiceStats Stats() const;

  // Files the message in options.rendezvous (see rendezvous.h for its refusals).
  grpc::Status Rendezvous(grpc::ServerContext* ctx, const baton::v1::RendezvousMessage* request,
                          baton::v1::RendezvousAck* response) override;

 private:
  grpc::Status PushFrames(grpc::ServerContext* ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
                          baton::v1::PushSummary* summary);

  TensorInbox* const inbox_;
  const Options options_;
  std::atomic<int64_t> streams_{0};
  std::atomic<int64_t> tensors_{0};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_TENSOR_SERVICE_H_
