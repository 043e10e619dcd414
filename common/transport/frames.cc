#include "common/transport/frames.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace baton::transport_internal {

namespace {
constexpr uint8_t kChunkKey = (2 << 3) | 2;  // field 2, wire type 2 (length-delimited)

void ReleaseKeepalive(void* p) { delete static_cast<std::shared_ptr<void>*>(p); }
}  // namespace

baton::v1::DType ToProtoDType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return baton::v1::DTYPE_FLOAT32;
    case DType::kInt32:
      return baton::v1::DTYPE_INT32;
  }
  return baton::v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> FromProtoDType(baton::v1::DType d) {
  switch (d) {
    case baton::v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case baton::v1::DTYPE_INT32:
      return DType::kInt32;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(d)));
}

baton::v1::TensorKind ToProtoKind(TensorKind k) {
  return k == TensorKind::kActivation ? baton::v1::TENSOR_KIND_ACTIVATION
                                      : baton::v1::TENSOR_KIND_GRADIENT;
}

absl::StatusOr<TensorKind> FromProtoKind(baton::v1::TensorKind k) {
  switch (k) {
    case baton::v1::TENSOR_KIND_ACTIVATION:
      return TensorKind::kActivation;
    case baton::v1::TENSOR_KIND_GRADIENT:
      return TensorKind::kGradient;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown tensor kind ", static_cast<int>(k)));
}

baton::v1::TensorHeader MakeHeader(int source_rank, const TensorTag& tag, const Tensor& t) {
  baton::v1::TensorHeader h;
  h.set_job_key(tag.job);
  h.set_step(tag.step);
  h.set_microbatch(tag.microbatch);
  h.set_stage(tag.stage);
  h.set_kind(ToProtoKind(tag.kind));
  h.set_dtype(ToProtoDType(t.dtype()));
  for (int64_t d : t.shape()) h.add_shape(d);
  h.set_byte_length(static_cast<int64_t>(t.nbytes()));
  h.set_source_rank(source_rank);
  return h;
}

TensorTag TagOf(const baton::v1::TensorHeader& h) {
  TensorTag tag;
  tag.job = h.job_key();
  tag.step = h.step();
  tag.microbatch = h.microbatch();
  tag.stage = h.stage();
  tag.kind = h.kind() == baton::v1::TENSOR_KIND_GRADIENT ? TensorKind::kGradient
                                                          : TensorKind::kActivation;
  return tag;
}

grpc::ByteBuffer SerializeFrame(const baton::v1::TensorFrame& frame) {
  const std::string bytes = frame.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());  // small: header and abort frames only
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer ChunkFrame(const void* data, size_t len, std::shared_ptr<void> keepalive) {
  uint8_t prefix[1 + 10];
  size_t n = 0;
  prefix[n++] = kChunkKey;
  uint64_t v = len;
  while (v >= 0x80) {
    prefix[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  prefix[n++] = static_cast<uint8_t>(v);
  grpc::Slice slices[2] = {
      grpc::Slice(prefix, n),
      grpc::Slice(grpc_slice_new_with_user_data(const_cast<void*>(data), len, ReleaseKeepalive,
                                                new std::shared_ptr<void>(std::move(keepalive))),
                  grpc::Slice::STEAL_REF),
  };
  return grpc::ByteBuffer(slices, len == 0 ? 1 : 2);
}

absl::StatusOr<ReceivedFrame> ParseFrame(const grpc::ByteBuffer& buffer) {
  ReceivedFrame out;
  grpc::Status dumped = buffer.Dump(&out.slices);
  if (!dumped.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unreadable frame: ", dumped.error_message()));
  }
  size_t total = 0;
  for (const grpc::Slice& s : out.slices) total += s.size();
  // The canonical chunk form: key byte, varint length, payload to the end.
  uint8_t head[11];
  size_t have = 0;
  for (const grpc::Slice& s : out.slices) {
    const size_t take = std::min(sizeof(head) - have, s.size());
    std::memcpy(head + have, s.begin(), take);
    have += take;
    if (have == sizeof(head)) break;
  }
  if (have >= 2 && head[0] == kChunkKey) {
    uint64_t len = 0;
    size_t i = 1;
    int shift = 0;
    while (i < have && shift < 64) {
      len |= static_cast<uint64_t>(head[i] & 0x7f) << shift;
      shift += 7;
      if ((head[i++] & 0x80) == 0) {
        if (len == total - i) {
          out.is_chunk = true;
          out.payload_offset = i;
          out.payload_len = len;
          return out;
        }
        break;
      }
    }
  }
  // Anything else: parse as a message (a chunk not in canonical form ends up here too).
  grpc::ByteBuffer copy(buffer);
  grpc::ProtoBufferReader reader(&copy);
  if (!out.frame.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame of ", total, " bytes is not a baton.v1.TensorFrame"));
  }
  if (out.frame.frame_case() == baton::v1::TensorFrame::kChunk) {
    // Non-canonical chunk (e.g. with unknown fields): serve it from the parsed copy.
    const std::string& c = out.frame.chunk();
    out.slices.clear();
    out.slices.emplace_back(c.data(), c.size());
    out.is_chunk = true;
    out.payload_offset = 0;
    out.payload_len = c.size();
  }
  out.slices.shrink_to_fit();
  return out;
}

void CopyPayload(const ReceivedFrame& chunk, void* dst) {
  char* out = static_cast<char*>(dst);
  size_t skip = chunk.payload_offset;
  size_t left = chunk.payload_len;
  for (const grpc::Slice& s : chunk.slices) {
    if (left == 0) break;
    if (skip >= s.size()) {
      skip -= s.size();
      continue;
    }
    const size_t n = std::min(s.size() - skip, left);
    std::memcpy(out, s.begin() + skip, n);
    out += n;
    left -= n;
    skip = 0;
  }
}

}  // namespace baton::transport_internal
