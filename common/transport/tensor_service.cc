#include "common/transport/tensor_service.h"

#include <malloc.h>

#include <limits>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/rpc.h"
#include "common/transport/frames.h"

namespace baton {

using transport_internal::CopyPayload;
using transport_internal::FromProtoDType;
using transport_internal::FromProtoKind;
using transport_internal::ParseFrame;
using transport_internal::ReceivedFrame;
using transport_internal::TagOf;

namespace {
void TuneMalloc() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Fixed thresholds also turn off glibc's dynamic adjustment of both.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);   // the largest glibc allows: big reads stay in arenas
    mallopt(M_TRIM_THRESHOLD, 512 << 20);  // keep up to this much free memory mapped
  });
}
}  // namespace

grpc::Status TensorServiceImpl::Rendezvous(grpc::ServerContext* ctx,
                                           const baton::v1::RendezvousMessage* request,
                                           baton::v1::RendezvousAck* /*response*/) {
  if (options_.rendezvous == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this worker takes no rendezvous");
  }
  return ToGrpcStatus(
      options_.rendezvous->Put(request->key(), request->value(), PeerIdentity(*ctx)));
}

TensorServiceImpl::TensorServiceImpl(TensorInbox* inbox, Options options)
    : inbox_(inbox), options_(options) {
  if (options_.tune_malloc) TuneMalloc();
  // Same method, raw frames: the request type is a byte buffer instead of TensorFrame, so
  // that chunk payloads are copied once, from gRPC's buffers into the tensor.
  MarkMethodStreamed(
      0, new grpc::internal::ClientStreamingHandler<TensorServiceImpl, grpc::ByteBuffer,
                                                    baton::v1::PushSummary>(
             [](TensorServiceImpl* self, grpc::ServerContext* ctx,
                grpc::ServerReader<grpc::ByteBuffer>* reader,
                baton::v1::PushSummary* summary) { return self->PushFrames(ctx, reader, summary); },
             this));
}

TensorServiceStats TensorServiceImpl::Stats() const {
  return {streams_.load(), tensors_.load(), bytes_.load()};
}

namespace {

// The tensor being received on one stream.
struct Incoming {
  int source_rank = 0;
  TensorTag tag;
  int64_t byte_length = 0;
  int64_t received = 0;
  Tensor tensor;
  TensorInbox::Reservation reservation;
};

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

std::string Describe(const Incoming& in) {
  return absl::StrCat("tensor ", in.tag.ToString(), " from rank ", in.source_rank);
}

}  // namespace

grpc::Status TensorServiceImpl::PushFrames(grpc::ServerContext* ctx,
                                           grpc::ServerReader<grpc::ByteBuffer>* reader,
                                           baton::v1::PushSummary* summary) {
  ++streams_;
  std::optional<Incoming> in;
  int last_source = -1;  // for messages about frames that carry no rank
  auto from = [&] {
    return last_source < 0 ? absl::StrCat("the stream from ", ctx->peer())
                           : absl::StrCat("the stream from rank ", last_source);
  };
  auto cancelled = [ctx] { return ctx->IsCancelled(); };
  int64_t tensors = 0;
  int64_t bytes = 0;
  auto file = [&]() -> grpc::Status {
    absl::Status s = in->reservation.Commit(std::move(in->tensor));
    if (!s.ok()) return ToGrpcStatus(s);
    ++tensors;
    bytes += in->byte_length;
    ++tensors_;
    bytes_ += in->byte_length;
    in.reset();
    return grpc::Status::OK;
  };

  // Answer the stream's headers at once: a client with gRPC retries enabled keeps a
  // reference to every message it wrote until the call commits, which headers do.
  // The sender's verified certificate name (mutual TLS), checked against the plan's.
  const std::string identity = PeerIdentity(*ctx);
  reader->SendInitialMetadata();
  grpc::ByteBuffer buffer;
  while (reader->Read(&buffer)) {
    absl::StatusOr<ReceivedFrame> frame = ParseFrame(buffer);
    if (!frame.ok()) {
      return Invalid(absl::StrCat(from(), ": ", frame.status().message(),
                                  in ? absl::StrCat(" (receiving ", Describe(*in), ")") : ""));
    }
    if (frame->is_chunk) {
      if (!in) {
        return Invalid(absl::StrCat(from(), ": a chunk of ", frame->payload_len,
                                    " bytes without a tensor header"));
      }
      const int64_t len = static_cast<int64_t>(frame->payload_len);
      if (len > in->byte_length - in->received) {
        return Invalid(absl::StrCat(Describe(*in), ": chunks add up to more than the header's ",
                                    in->byte_length, " bytes (", in->received, " + ", len, ")"));
      }
      CopyPayload(*frame, static_cast<char*>(in->tensor.raw()) + in->received);
      in->received += len;
      if (in->received == in->byte_length) {
        if (grpc::Status s = file(); !s.ok()) return s;
      }
      continue;
    }
    switch (frame->frame.frame_case()) {
      case baton::v1::TensorFrame::kHeader: {
        const baton::v1::TensorHeader& h = frame->frame.header();
        if (in) {
          return Invalid(absl::StrCat(Describe(*in), ": the header of ", TagOf(h).ToString(),
                                      " came after ", in->received, " of ", in->byte_length,
                                      " bytes"));
        }
        Incoming next;
        next.source_rank = h.source_rank();
        next.tag = TagOf(h);
        next.byte_length = h.byte_length();
        last_source = next.source_rank;
        // Who may send this, before anything else is looked at or allocated.
        if (absl::Status who = inbox_->CheckSender(next.source_rank, next.tag, identity);
            !who.ok()) {
          return ToGrpcStatus(who);
        }
        absl::StatusOr<DType> dtype = FromProtoDType(h.dtype());
        absl::StatusOr<TensorKind> kind = FromProtoKind(h.kind());
        if (!dtype.ok() || !kind.ok()) {
          return Invalid(absl::StrCat(Describe(next), ": ",
                                      (dtype.ok() ? kind.status() : dtype.status()).message()));
        }
        Shape shape;
        int64_t numel = 1;
        const int64_t max_numel =
            options_.max_tensor_bytes / static_cast<int64_t>(DTypeSize(*dtype));
        for (int64_t d : h.shape()) {
          if (d < 0 || (d > 0 && numel > max_numel / d)) {
            return Invalid(absl::StrCat(Describe(next), ": bad shape [",
                                        absl::StrJoin(h.shape(), ","), "] (at most ",
                                        options_.max_tensor_bytes, " bytes)"));
          }
          numel *= d;
          shape.push_back(d);
        }
        const int64_t expected = numel * static_cast<int64_t>(DTypeSize(*dtype));
        if (expected != h.byte_length()) {
          return Invalid(absl::StrCat(Describe(next), ": shape ", ShapeString(shape), " of ",
                                      DTypeName(*dtype), " is ", expected,
                                      " bytes but the header says ", h.byte_length()));
        }
        absl::StatusOr<TensorInbox::Reservation> r = inbox_->Reserve(
            next.source_rank, next.tag, expected, absl::Now() + options_.space_timeout, cancelled);
        if (!r.ok()) return ToGrpcStatus(r.status());
        next.reservation = *std::move(r);
        // Lands in staging memory: page-locked when this worker computes on a GPU, so the
        // executor's copy to the device runs at full speed.
        absl::StatusOr<Tensor> t = Tensor::TryEmptyWith(HostStagingAllocator(), shape, *dtype);
        if (!t.ok()) {
          return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat(Describe(next), ": ", t.status().message()));
        }
        next.tensor = *std::move(t);
        in.emplace(std::move(next));
        // The first chunk of the payload may travel in the header.
        const int64_t len = static_cast<int64_t>(frame->payload_len);
        if (len > in->byte_length) {
          return Invalid(absl::StrCat(Describe(*in), ": the header carries ", len,
                                      " payload bytes, more than its byte_length ",
                                      in->byte_length));
        }
        CopyPayload(*frame, in->tensor.raw());
        in->received = len;
        if (in->received == in->byte_length) {
          if (grpc::Status s = file(); !s.ok()) return s;
        }
        break;
      }
      case baton::v1::TensorFrame::kAbort: {
        const baton::v1::AbortNotice& a = frame->frame.abort();
        inbox_->AbortJob(a.job_key(),
                         absl::AbortedError(a.reason().empty()
                                                ? absl::StrCat("rank ", a.source_rank(), " aborted")
                                                : a.reason()),
                         identity);
        in.reset();  // a tensor cut short by the abort is dropped
        break;
      }
      default:
        return Invalid(absl::StrCat(from(), ": an empty frame"));
    }
  }
  if (ctx->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        absl::StrCat(from(), " was cancelled",
                                     in ? absl::StrCat(" while receiving ", Describe(*in)) : ""));
  }
  if (in) {
    return Invalid(absl::StrCat(Describe(*in), ": the stream ended after ", in->received, " of ",
                                in->byte_length, " bytes"));
  }
  summary->set_tensors(tensors);
  summary->set_bytes(bytes);
  return grpc::Status::OK;
}

}  // namespace baton
