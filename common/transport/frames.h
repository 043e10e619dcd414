// The frames of baton.v1.TensorService.Push (proto/baton/v1/tensor.proto), built and read
// without copying payloads.
//
// A chunk frame is the protobuf encoding of TensorFrame{chunk: payload}: the byte 0x12
// (field 2, length-delimited), the payload length as a varint, then the payload; a header
// frame is TensorFrame{header: TensorHeader{..., payload}} with the payload field encoded
// last. The sender builds either as a gRPC byte buffer of two slices, the encoded prefix and
// a slice that points into the tensor's memory and keeps the tensor alive until gRPC lets
// go of it; the receiver finds the payload inside the received slices and copies it
// straight into the destination tensor. Abort frames are small and go through protobuf as
// usual, as does any frame that is not in these canonical forms (so any protobuf sender
// works; only its payloads take a copy more).
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
#include "common/comm/transport.h"
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

// A header frame carrying `header` (whose payload field must be empty) and, as its payload
// field, [data, data + len) under the same terms as ChunkFrame.
grpc::ByteBuffer HeaderFrame(const baton::v1::TensorHeader& header, const void* data, size_t len,
                             std::shared_ptr<void> keepalive);

// A received frame: a chunk (`frame` unset), a header (in `frame`, its payload field
// cleared) or any other frame (in `frame`). The payload of a chunk or header is bytes
// [payload_offset, payload_offset + payload_len) of `slices`.
struct ReceivedFrame {
  baton::v1::TensorFrame frame;
  bool is_chunk = false;
  std::vector<grpc::Slice> slices;  // references into gRPC's receive buffers
  size_t payload_offset = 0;
  size_t payload_len = 0;
};
absl::StatusOr<ReceivedFrame> ParseFrame(const grpc::ByteBuffer& buffer);

// Copies a frame's payload to `dst`, slice by slice.
void CopyPayload(const ReceivedFrame& frame, void* dst);

}  // namespace baton::transport_internal

#endif  // BATON_COMMON_TRANSPORT_FRAMES_H_
