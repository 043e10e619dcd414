#include "common/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace {

// Larger headers are refused before parsing (the reference implementation's limit).
constexpr uint64_t kMaxHeader = 100ull << 20;
// Exact integers in a JSON number (parsed as a double).
constexpr double kMaxExact = 9007199254740992.0;  // 2^53

const char* DTypeTag(DType t) {
  switch (t) {
    case DType::kInt32:
      return "I32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat32:
      break;
  }
  return "F32";
}

// A JSON string literal.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

void PutU64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

// A non-negative integer from a JSON number.
absl::StatusOr<uint64_t> Integer(const google::protobuf::Value& v, absl::string_view what) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue) {
    return Bad(absl::StrCat(what, " is not a number"));
  }
  const double d = v.number_value();
  if (!(d >= 0) || d > kMaxExact || d != static_cast<double>(static_cast<uint64_t>(d))) {
    return Bad(absl::StrCat(what, " is not a non-negative integer"));
  }
  return static_cast<uint64_t>(d);
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  bool first = true;
  auto comma = [&] {
    if (!first) header += ",";
    first = false;
  };
  if (!metadata.empty()) {
    comma();
    header += "\"__metadata__\":{";
    bool first_key = true;
    for (const auto& [k, v] : metadata) {
      if (!first_key) header += ",";
      first_key = false;
      absl::StrAppend(&header, Quote(k), ":", Quote(v));
    }
    header += "}";
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const NamedTensor& nt : tensors) {
    if (nt.name.empty() || nt.name == "__metadata__") {
      return Bad(absl::StrCat("a tensor cannot be named \"", nt.name, "\""));
    }
    if (!names.insert(nt.name).second) return Bad(absl::StrCat("tensor ", nt.name, " twice"));
    if (nt.tensor == nullptr || !nt.tensor->defined()) {
      return Bad(absl::StrCat("tensor ", nt.name, " is undefined"));
    }
    const Tensor& t = *nt.tensor;
    comma();
    absl::StrAppend(&header, Quote(nt.name), ":{\"dtype\":\"", DTypeTag(t.dtype()),
                    "\",\"shape\":[", absl::StrJoin(t.shape(), ","), "],\"data_offsets\":[",
                    offset, ",", offset + t.nbytes(), "]}");
    offset += t.nbytes();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::string out(8 + header.size() + offset, '\0');
  PutU64(header.size(), out.data());
  std::memcpy(out.data() + 8, header.data(), header.size());
  char* data = out.data() + 8 + header.size();
  for (const NamedTensor& nt : tensors) {
    absl::Status st = nt.tensor->CopyToHost(data);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("safetensors: reading ", nt.name, ": ",
                                                  st.message()));
    }
    data += nt.tensor->nbytes();
  }
  return out;
}

absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view first8, uint64_t file_bytes) {
  if (first8.size() < 8 || file_bytes < 8) {
    return Bad(absl::StrCat("the file is ", file_bytes,
                            " bytes, shorter than its 8-byte header length"));
  }
  const uint64_t n = GetU64(first8.data());
  if (n > kMaxHeader || n > file_bytes - 8) {
    return Bad(absl::StrCat("header length ", n, " exceeds the file (", file_bytes,
                            " bytes) or the limit of ", kMaxHeader));
  }
  return n;
}

uint64_t SafetensorsDataBytes(const SafetensorsEntry& e) {
  const uint64_t elem = (e.file_dtype == "F16" || e.file_dtype == "BF16") ? 2 : DTypeSize(e.dtype);
  return static_cast<uint64_t>(NumElements(e.shape)) * elem;
}

absl::StatusOr<Safetensors> ParseSafetensors(absl::string_view file) {
  absl::StatusOr<uint64_t> n = SafetensorsHeaderLength(file.substr(0, 8), file.size());
  if (!n.ok()) return n.status();
  const absl::string_view data = file.substr(8 + *n);
  absl::StatusOr<Safetensors> out = ParseSafetensorsHeader(file.substr(8, *n), data.size());
  if (!out.ok()) return out;
  for (auto& [name, e] : out->tensors) e.data = data.substr(e.offset, SafetensorsDataBytes(e));
  return out;
}

absl::StatusOr<Safetensors> ParseSafetensorsHeader(absl::string_view json, uint64_t data_bytes) {
  google::protobuf::Struct header;
  google::protobuf::util::JsonParseOptions opts;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(std::string(json), &header, opts);
  if (!parsed.ok()) {
    return Bad(absl::StrCat("the header is not a JSON object: ", parsed.ToString()));
  }
  Safetensors out;
  // (begin, end, name) of every tensor, to check the data is covered exactly.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") {
      if (value.kind_case() != google::protobuf::Value::kStructValue) {
        return Bad("__metadata__ is not an object");
      }
      for (const auto& [k, v] : value.struct_value().fields()) {
        if (v.kind_case() != google::protobuf::Value::kStringValue) {
          return Bad(absl::StrCat("metadata ", k, " is not a string"));
        }
        out.metadata[k] = v.string_value();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor ", name);
    if (value.kind_case() != google::protobuf::Value::kStructValue) {
      return Bad(absl::StrCat(where, " is not an object"));
    }
    const auto& f = value.struct_value().fields();
    const auto dtype = f.find("dtype");
    const auto shape = f.find("shape");
    const auto offsets = f.find("data_offsets");
    if (dtype == f.end() || shape == f.end() || offsets == f.end()) {
      return Bad(absl::StrCat(where, " lacks dtype, shape or data_offsets"));
    }
    SafetensorsEntry e;
    const std::string tag = dtype->second.string_value();
    if (tag == "F32" || tag == "F16" || tag == "BF16") {
      e.dtype = DType::kFloat32;
    } else if (tag == "I32") {
      e.dtype = DType::kInt32;
    } else {
      return Bad(absl::StrCat(where, " has dtype \"", tag,
                              "\"; only F32, F16, BF16 and I32 are read"));
    }
    e.file_dtype = tag;
    if (shape->second.kind_case() != google::protobuf::Value::kListValue) {
      return Bad(absl::StrCat(where, ": shape is not a list"));
    }
    uint64_t numel = 1;
    for (const auto& d : shape->second.list_value().values()) {
      absl::StatusOr<uint64_t> dim = Integer(d, absl::StrCat(where, ": a shape dimension"));
      if (!dim.ok()) return dim.status();
      if (*dim != 0 && numel > (uint64_t{1} << 62) / *dim) {
        return Bad(absl::StrCat(where, ": shape too large"));
      }
      numel *= *dim;
      e.shape.push_back(static_cast<int64_t>(*dim));
    }
    if (offsets->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets->second.list_value().values_size() != 2) {
      return Bad(absl::StrCat(where, ": data_offsets is not [begin, end]"));
    }
    absl::StatusOr<uint64_t> begin =
        Integer(offsets->second.list_value().values(0), absl::StrCat(where, ": begin"));
    if (!begin.ok()) return begin.status();
    absl::StatusOr<uint64_t> end =
        Integer(offsets->second.list_value().values(1), absl::StrCat(where, ": end"));
    if (!end.ok()) return end.status();
    if (*end < *begin || *end > data_bytes) {
      return Bad(absl::StrCat(where, ": data_offsets [", *begin, ", ", *end,
                              "] are not within the ", data_bytes, " data bytes"));
    }
    if (*end - *begin != SafetensorsDataBytes(e)) {
      return Bad(absl::StrCat(where, ": ", tag, ShapeString(e.shape), " needs ",
                              SafetensorsDataBytes(e), " bytes, data_offsets give ",
                              *end - *begin));
    }
    e.offset = *begin;
    spans.emplace_back(*begin, *end, name);
    out.tensors.emplace(name, std::move(e));
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [begin, end, name] : spans) {
    if (begin != at) {
      return Bad(absl::StrCat("tensor ", name, " starts at ", begin, " but the data before it ends at ", at,
                              begin < at ? " (overlap)" : " (a hole)"));
    }
    at = end;
    out.order.push_back(name);
  }
  if (at != data_bytes) {
    return Bad(absl::StrCat("the tensors cover ", at, " of the ", data_bytes, " data bytes"));
  }
  return out;
}

namespace {

// float32 from IEEE half precision (exact).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // zero
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The entry's bytes as the tensor's: F16 and BF16 widened to float32, others as they are.
// Returns a view of `e.data` or of `*buffer`.
absl::string_view HostBytes(const SafetensorsEntry& e, std::string* buffer) {
  if (e.file_dtype != "F16" && e.file_dtype != "BF16") return e.data;
  const size_t n = e.data.size() / 2;
  buffer->resize(n * 4);
  const bool bf16 = e.file_dtype == "BF16";
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = static_cast<uint16_t>(static_cast<unsigned char>(e.data[2 * i]) |
                                             (static_cast<unsigned char>(e.data[2 * i + 1]) << 8));
    float f;
    if (bf16) {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&f, &bits, 4);
    } else {
      f = HalfToFloat(h);
    }
    std::memcpy(buffer->data() + 4 * i, &f, 4);
  }
  return *buffer;
}

}  // namespace

absl::StatusOr<Tensor> EntryToTensor(const SafetensorsEntry& e, Device device) {
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(e.shape, e.dtype, device);
  if (!t.ok()) return t.status();
  std::string buffer;
  absl::Status st = t->CopyFromHost(HostBytes(e, &buffer).data());
  if (!st.ok()) return st;
  return t;
}

absl::Status CopyEntryInto(const SafetensorsEntry& e, const std::string& what, Tensor* dst) {
  if (e.dtype != dst->dtype() || e.shape != dst->shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", DTypeName(e.dtype), ShapeString(e.shape), " in the checkpoint but ",
        DTypeName(dst->dtype()), ShapeString(dst->shape()), " in the model"));
  }
  std::string buffer;
  return dst->CopyFromHost(HostBytes(e, &buffer).data());
}

}  // namespace baton
