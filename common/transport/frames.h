// The frames of baton.v1.TensorService.Push (proto/baton/v1/tensor.proto), built and read
// without copying payloads.
//
// A chunk frame is the protobuf encoding of TensorFrame{chunk: payload}: the byte 0x12
// (field 2, length-delimited), the payload length as a varint, then the payload. The sender
// builds it as a gRPC byte buffer of two slices, the few prefix bytes and a slice that
// points into the tensor's memory and keeps the tensor alive until gRPC lets go of it; the
// receiver finds the payload inside the received slices and copies it straight into the
// destination tensor. Header and abort frames are small and go through protobuf as usual,
// as does any frame that is not in the canonical chunk form (so any protobuf sender works).
#ifndef BATON_COMMON_TRANSPORT_FRAMES_H_
#define BATON_COMMON_TRANSPORT_FRAMES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/tensor.pb.h"
#include "common/core/tensor.h"
#include "common/pipeline/transport.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace baton::transport_internal {

// The method the transport calls, as the generated code names it.
inline constexpr char kPushMethod[] = "/baton.v1.TensorService/Push";

baton::v1::DType ToProtoDType(DType d);
absl::StatusOr<DType> FromProtoDType(baton::v1::DType d);
baton::v1::TensorKind ToProtoKind(TensorKind k);
absl::StatusOr<TensorKind> FromProtoKind(baton::v1::TensorKind k);

baton::v1::TensorHeader MakeHeader(int source_rank, const TensorTag& tag, const Tensor& t);
TensorTag TagOf(const baton::v1::TensorHeader& h);

grpc::ByteBuffer SerializeFrame(const baton::v1::TensorFrame& frame);

// A chunk frame over [data, data + len), which must stay valid and unchanged until
// `keepalive` is destroyed; gRPC holds a reference to it for as long as it needs the bytes.
grpc::ByteBuffer ChunkFrame(const void* data, size_t len, std::shared_ptr<void> keepalive);

// A received frame: a chunk (its payload is bytes [payload_offset, payload_offset +
// payload_len) of `slices`, `frame` is unset) or any other frame, parsed into `frame`.
struct ReceivedFrame {
  bool is_chunk = false;
  std::vector<grpc::Slice> slices;  // references into gRPC's receive buffers
  size_t payload_offset = 0;
  size_t payload_len = 0;
  baton::v1::TensorFrame frame;
};
absl::StatusOr<ReceivedFrame> ParseFrame(const grpc::ByteBuffer& buffer);

// Copies a chunk's payload to `dst`, slice by slice.
void CopyPayload(const ReceivedFrame& chunk, void* dst);

}  // namespace baton::transport_internal

#endif  // BATON_COMMON_TRANSPORT_FRAMES_H_
