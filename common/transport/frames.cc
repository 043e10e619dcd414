#include "common/transport/frames.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/slice.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace baton::transport_internal {

namespace {
// Keys (field number << 3 | wire type 2, length-delimited) of the fields a payload is in.
constexpr uint8_t kHeaderKey = (1 << 3) | 2;    // TensorFrame.header
constexpr uint8_t kChunkKey = (2 << 3) | 2;     // TensorFrame.chunk
constexpr uint8_t kPayloadKey = (10 << 3) | 2;  // TensorHeader.payload

void ReleaseKeepalive(void* p) { delete static_cast<std::shared_ptr<void>*>(p); }
}  // namespace

baton::v1::DType ToProtoDType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return baton::v1::DTYPE_FLOAT32;
    case DType::kInt32:
      return baton::v1::DTYPE_INT32;
    case DType::kBFloat16:
      return baton::v1::DTYPE_BFLOAT16;
  }
  return baton::v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> FromProtoDType(baton::v1::DType d) {
  switch (d) {
    case baton::v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case baton::v1::DTYPE_INT32:
      return DType::kInt32;
    case baton::v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(d)));
}

baton::v1::TensorKind ToProtoKind(TensorKind k) {
  switch (k) {
    case TensorKind::kActivation:
      return baton::v1::TENSOR_KIND_ACTIVATION;
    case TensorKind::kGradient:
      return baton::v1::TENSOR_KIND_GRADIENT;
    case TensorKind::kTiedGradient:
      return baton::v1::TENSOR_KIND_TIED_GRADIENT;
    case TensorKind::kGradNorm:
      return baton::v1::TENSOR_KIND_GRAD_NORM;
  }
  return baton::v1::TENSOR_KIND_UNSPECIFIED;
}

absl::StatusOr<TensorKind> FromProtoKind(baton::v1::TensorKind k) {
  switch (k) {
    case baton::v1::TENSOR_KIND_ACTIVATION:
      return TensorKind::kActivation;
    case baton::v1::TENSOR_KIND_GRADIENT:
      return TensorKind::kGradient;
    case baton::v1::TENSOR_KIND_TIED_GRADIENT:
      return TensorKind::kTiedGradient;
    case baton::v1::TENSOR_KIND_GRAD_NORM:
      return TensorKind::kGradNorm;
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
  // Callers check the kind with FromProtoKind first; anything else reads as an activation.
  tag.kind = FromProtoKind(h.kind()).value_or(TensorKind::kActivation);
  return tag;
}

grpc::ByteBuffer SerializeFrame(const baton::v1::TensorFrame& frame) {
  const std::string bytes = frame.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());  // small: header and abort frames only
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads a varint from [p, end); returns the position after it, or nullptr.
const uint8_t* GetVarint(const uint8_t* p, const uint8_t* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; p < end && shift < 64; shift += 7) {
    const uint8_t b = *p++;
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return p;
  }
  return nullptr;
}

grpc::ByteBuffer PrefixAndPayload(const std::string& prefix, const void* data, size_t len,
                                  std::shared_ptr<void> keepalive) {
  grpc::Slice slices[2] = {
      grpc::Slice(prefix),
      grpc::Slice(grpc_slice_new_with_user_data(const_cast<void*>(data), len, ReleaseKeepalive,
                                                new std::shared_ptr<void>(std::move(keepalive))),
                  grpc::Slice::STEAL_REF),
  };
  return grpc::ByteBuffer(slices, len == 0 ? 1 : 2);
}

}  // namespace

grpc::ByteBuffer ChunkFrame(const void* data, size_t len, std::shared_ptr<void> keepalive) {
  std::string prefix(1, static_cast<char>(kChunkKey));
  PutVarint(&prefix, len);
  return PrefixAndPayload(prefix, data, len, std::move(keepalive));
}

grpc::ByteBuffer HeaderFrame(const baton::v1::TensorHeader& header, const void* data, size_t len,
                             std::shared_ptr<void> keepalive) {
  const std::string fields = header.SerializeAsString();  // without the payload field
  std::string payload_key;
  if (len > 0) {
    payload_key.push_back(static_cast<char>(kPayloadKey));
    PutVarint(&payload_key, len);
  }
  std::string prefix(1, static_cast<char>(kHeaderKey));
  PutVarint(&prefix, fields.size() + payload_key.size() + len);
  prefix += fields;
  prefix += payload_key;
  return PrefixAndPayload(prefix, data, len, std::move(keepalive));
}

absl::StatusOr<ReceivedFrame> ParseFrame(const grpc::ByteBuffer& buffer) {
  ReceivedFrame out;
  grpc::Status dumped = buffer.Dump(&out.slices);
  if (!dumped.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unreadable frame: ", dumped.error_message()));
  }
  size_t total = 0;
  for (const grpc::Slice& s : out.slices) total += s.size();
  // The first bytes, contiguous: enough for the chunk key and length, or for a header's
  // fields up to its payload.
  uint8_t head[512];
  size_t have = 0;
  for (const grpc::Slice& s : out.slices) {
    const size_t take = std::min(sizeof(head) - have, s.size());
    std::memcpy(head + have, s.begin(), take);
    have += take;
    if (have == sizeof(head)) break;
  }
  const uint8_t* const end = head + have;
  uint64_t len = 0;
  const uint8_t* body = have > 0 ? GetVarint(head + 1, end, &len) : nullptr;
  if (body != nullptr && len == total - static_cast<size_t>(body - head)) {
    if (head[0] == kChunkKey) {
      out.is_chunk = true;
      out.payload_offset = static_cast<size_t>(body - head);
      out.payload_len = len;
      return out;
    }
    if (head[0] == kHeaderKey) {
      // Walk the header's fields to its payload field, which must end the frame.
      const uint8_t* p = body;
      while (p < end) {
        const uint8_t* field = p;
        uint64_t key = 0;
        p = GetVarint(p, end, &key);
        if (p == nullptr) break;
        const uint64_t wire_type = key & 7;
        uint64_t v = 0;
        if (wire_type == 0) {
          p = GetVarint(p, end, &v);
        } else if (wire_type == 2) {
          p = GetVarint(p, end, &v);
          if (p == nullptr) break;
          if ((key >> 3) == 10) {  // TensorHeader.payload
            const size_t offset = static_cast<size_t>(p - head);
            if (offset + v != total) break;
            if (!out.frame.mutable_header()->ParseFromArray(body, static_cast<int>(field - body))) {
              break;
            }
            out.payload_offset = offset;
            out.payload_len = v;
            return out;
          }
          p = (v <= static_cast<uint64_t>(end - p)) ? p + v : nullptr;
        } else if (wire_type == 1 || wire_type == 5) {
          p = (end - p >= (wire_type == 1 ? 8 : 4)) ? p + (wire_type == 1 ? 8 : 4) : nullptr;
        } else {
          p = nullptr;
        }
        if (p == nullptr) break;
      }
      // No payload field (an empty tensor, or a sender that puts every byte in chunks),
      // or anything unusual: the general path below.
    }
  }
  // Anything else: parse as a message.
  grpc::ByteBuffer copy(buffer);
  grpc::ProtoBufferReader reader(&copy);
  if (!out.frame.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a frame of ", total, " bytes is not a baton.v1.TensorFrame"));
  }
  out.slices.clear();
  std::string* payload = nullptr;
  if (out.frame.frame_case() == baton::v1::TensorFrame::kChunk) {
    payload = out.frame.mutable_chunk();
    out.is_chunk = true;
  } else if (out.frame.frame_case() == baton::v1::TensorFrame::kHeader) {
    payload = out.frame.mutable_header()->mutable_payload();
  }
  if (payload != nullptr && !payload->empty()) {
    out.slices.emplace_back(*payload);  // one copy more, on this rare path only
    out.payload_len = payload->size();
    payload->clear();
  }
  if (out.frame.frame_case() == baton::v1::TensorFrame::kChunk) out.frame.Clear();
  return out;
}

void CopyPayload(const ReceivedFrame& frame, void* dst) {
  char* out = static_cast<char*>(dst);
  size_t skip = frame.payload_offset;
  size_t left = frame.payload_len;
  for (const grpc::Slice& s : frame.slices) {
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
