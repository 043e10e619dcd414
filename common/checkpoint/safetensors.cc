#include "common/checkpoint/safetensors.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/log_text.h"

namespace baton {
namespace {

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

// Reads the header's JSON in one pass, building nothing but the result, so parsing takes
// memory proportional to the header (a generic JSON tree, protobuf's Struct, took about 33
// times the header's size). Strict JSON (RFC 8259) in valid UTF-8; errors give the byte
// offset and show the bytes there escaped and bounded (EchoInput).
class HeaderReader {
 public:
  explicit HeaderReader(absl::string_view json) : s_(json) {}

  bool AtEnd() {
    SkipSpace();
    return pos_ == s_.size();
  }
  // The next significant character (0 at the end), not consumed.
  char Peek() {
    SkipSpace();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  absl::Status Expect(char c) {
    if (Consume(c)) return absl::OkStatus();
    return Syntax(absl::StrCat("want '", std::string(1, c), "'"));
  }
  // The header is not JSON: `what` at the current position.
  absl::Status Syntax(absl::string_view what) const {
    return Bad(absl::StrCat(
        "the header is not a JSON object: ", what, " at byte ", pos_,
        pos_ < s_.size() ? absl::StrCat(" ('", EchoInput(s_.substr(pos_, 24), 48), "')")
                         : std::string(" (its end)")));
  }

  // A string, its escapes decoded.
  absl::StatusOr<std::string> String() {
    if (Peek() != '"') return Syntax("want a string");
    ++pos_;
    std::string out;
    while (true) {
      const size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\' &&
             static_cast<unsigned char>(s_[pos_]) >= 0x20 &&
             static_cast<unsigned char>(s_[pos_]) < 0x80) {
        ++pos_;
      }
      out.append(s_.data() + start, pos_ - start);
      if (pos_ >= s_.size()) return Syntax("an unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) return Syntax("a control character in a string");
      if (c >= 0x80) {
        const size_t n = log_text_internal::Utf8SequenceLength(s_.substr(pos_));
        if (n == 0) return Syntax("a byte that is not UTF-8");
        out.append(s_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      ++pos_;  // the backslash
      if (pos_ >= s_.size()) return Syntax("an unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          absl::StatusOr<uint32_t> cp = CodePoint();
          if (!cp.ok()) return cp.status();
          AppendUtf8(*cp, &out);
          break;
        }
        default:
          --pos_;
          return Syntax("an unknown escape");
      }
    }
  }

  // A non-negative integer (a JSON number with an integral value of at most 2^53; 4.0 and
  // 4e0 are 4); `what` names it in errors.
  absl::StatusOr<uint64_t> Integer(absl::string_view what) {
    absl::StatusOr<absl::string_view> token = Number(what);
    if (!token.ok()) return token.status();
    const absl::Status not_integer = Bad(absl::StrCat(what, " is not a non-negative integer"));
    if (token->size() > 64) return not_integer;
    char buffer[65];
    std::memcpy(buffer, token->data(), token->size());
    buffer[token->size()] = '\0';
    const double d = std::strtod(buffer, nullptr);
    if (!(d >= 0) || d > kMaxExact || d != static_cast<double>(static_cast<uint64_t>(d))) {
      return not_integer;
    }
    return static_cast<uint64_t>(d);
  }

  // Skips one value of any kind (a key this reader does not use).
  absl::Status SkipValue(int depth = 0) {
    if (depth > 64) return Syntax("values nested too deeply");
    const char c = Peek();
    if (c == '"') return String().status();
    if (c == '{' || c == '[') {
      ++pos_;
      const char close = c == '{' ? '}' : ']';
      if (Consume(close)) return absl::OkStatus();
      do {
        if (c == '{') {
          if (absl::Status st = String().status(); !st.ok()) return st;
          if (absl::Status st = Expect(':'); !st.ok()) return st;
        }
        if (absl::Status st = SkipValue(depth + 1); !st.ok()) return st;
      } while (Consume(','));
      return Expect(close);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return Number("a value").status();
    for (const absl::string_view word : {"true", "false", "null"}) {
      if (s_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return absl::OkStatus();
      }
    }
    return Syntax("want a value");
  }

 private:
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  // The text of a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  absl::StatusOr<absl::string_view> Number(absl::string_view what) {
    const char first = Peek();
    if (first != '-' && !(first >= '0' && first <= '9')) {
      return Bad(absl::StrCat(what, " is not a number"));
    }
    const size_t start = pos_;
    if (first == '-') ++pos_;
    const size_t int_start = pos_;
    const size_t int_digits = Digits();
    if (int_digits == 0 || (s_[int_start] == '0' && int_digits > 1)) {
      return Syntax("a malformed number");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (Digits() == 0) return Syntax("a malformed number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (Digits() == 0) return Syntax("a malformed number");
    }
    return s_.substr(start, pos_ - start);
  }
  size_t Digits() {
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    return pos_ - start;
  }
  absl::StatusOr<uint32_t> Hex4() {
    if (s_.size() - pos_ < 4) return Syntax("a short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v |= h - 'A' + 10;
      } else {
        return Syntax("a malformed \\u escape");
      }
      ++pos_;
    }
    return v;
  }
  // After "\u": the code point, a surrogate pair joined.
  absl::StatusOr<uint32_t> CodePoint() {
    absl::StatusOr<uint32_t> hi = Hex4();
    if (!hi.ok() || *hi < 0xd800 || *hi > 0xdfff) return hi;
    if (*hi > 0xdbff || s_.substr(pos_, 2) != "\\u") return Syntax("a lone surrogate");
    pos_ += 2;
    absl::StatusOr<uint32_t> lo = Hex4();
    if (!lo.ok()) return lo;
    if (*lo < 0xdc00 || *lo > 0xdfff) return Syntax("a lone surrogate");
    return 0x10000 + ((*hi - 0xd800) << 10) + (*lo - 0xdc00);
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  const absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<TensorLayout>& tensors, const std::map<std::string, std::string>& metadata) {
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
  for (const TensorLayout& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return Bad(absl::StrCat("a tensor cannot be named \"", t.name, "\""));
    }
    if (!names.insert(t.name).second) return Bad(absl::StrCat("tensor ", t.name, " twice"));
    const uint64_t bytes = static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
    comma();
    absl::StrAppend(&header, Quote(t.name), ":{\"dtype\":\"", DTypeTag(t.dtype),
                    "\",\"shape\":[", absl::StrJoin(t.shape, ","), "],\"data_offsets\":[",
                    offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::string out(8 + header.size(), '\0');
  PutU64(header.size(), out.data());
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorLayout> layout;
  size_t data_bytes = 0;
  for (const NamedTensor& nt : tensors) {
    if (nt.tensor == nullptr || !nt.tensor->defined()) {
      return Bad(absl::StrCat("tensor ", nt.name, " is undefined"));
    }
    layout.push_back({nt.name, nt.tensor->dtype(), nt.tensor->shape()});
    data_bytes += nt.tensor->nbytes();
  }
  absl::StatusOr<std::string> out = EncodeSafetensorsHeader(layout, metadata);
  if (!out.ok()) return out;
  const size_t header_bytes = out->size();
  out->resize(header_bytes + data_bytes);
  char* data = out->data() + header_bytes;
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
  if (n > kMaxSafetensorsHeaderBytes) {
    return Bad(absl::StrCat("the header is too large: its length field says ", n,
                            " bytes, over the format's limit of ", kMaxSafetensorsHeaderBytes));
  }
  if (n > file_bytes - 8) {
    return Bad(absl::StrCat("header length ", n, " exceeds the file (", file_bytes, " bytes)"));
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

namespace {

// The "__metadata__" object, string to string (a repeated key: the last wins).
absl::Status ReadMetadata(HeaderReader* r, std::map<std::string, std::string>* out) {
  if (!r->Consume('{')) return Bad("__metadata__ is not an object");
  if (r->Consume('}')) return absl::OkStatus();
  do {
    absl::StatusOr<std::string> key = r->String();
    if (!key.ok()) return key.status();
    if (absl::Status st = r->Expect(':'); !st.ok()) return st;
    if (r->Peek() != '"') {
      return Bad(absl::StrCat("metadata ", EchoInput(*key), " is not a string"));
    }
    absl::StatusOr<std::string> value = r->String();
    if (!value.ok()) return value.status();
    (*out)[*std::move(key)] = *std::move(value);
  } while (r->Consume(','));
  return r->Expect('}');
}

// [begin, end] of a tensor's data_offsets.
absl::Status ReadOffsets(HeaderReader* r, const std::string& where, uint64_t* begin,
                         uint64_t* end) {
  const absl::Status not_pair = Bad(absl::StrCat(where, ": data_offsets is not [begin, end]"));
  if (!r->Consume('[') || r->Peek() == ']') return not_pair;
  absl::StatusOr<uint64_t> b = r->Integer(absl::StrCat(where, ": begin"));
  if (!b.ok()) return b.status();
  if (!r->Consume(',') || r->Peek() == ']') return not_pair;
  absl::StatusOr<uint64_t> e = r->Integer(absl::StrCat(where, ": end"));
  if (!e.ok()) return e.status();
  if (!r->Consume(']')) return not_pair;
  *begin = *b;
  *end = *e;
  return absl::OkStatus();
}

// One tensor's object ({"dtype", "shape", "data_offsets"}; other keys are skipped), checked
// against a data section of `data_bytes` bytes. `where` names the tensor in errors.
absl::Status ReadEntry(HeaderReader* r, const std::string& where, uint64_t data_bytes,
                       SafetensorsEntry* e) {
  if (!r->Consume('{')) return Bad(absl::StrCat(where, " is not an object"));
  bool has_dtype = false, has_shape = false, has_offsets = false;
  uint64_t begin = 0, end = 0;
  if (!r->Consume('}')) {
    do {
      absl::StatusOr<std::string> key = r->String();
      if (!key.ok()) return key.status();
      if (absl::Status st = r->Expect(':'); !st.ok()) return st;
      absl::Status st;
      if (*key == "dtype") {
        if (r->Peek() != '"') return Bad(absl::StrCat(where, ": dtype is not a string"));
        absl::StatusOr<std::string> tag = r->String();
        if (!tag.ok()) return tag.status();
        e->file_dtype = *std::move(tag);
        has_dtype = true;
      } else if (*key == "shape") {
        if (!r->Consume('[')) return Bad(absl::StrCat(where, ": shape is not a list"));
        e->shape.clear();
        if (!r->Consume(']')) {
          do {
            absl::StatusOr<uint64_t> dim =
                r->Integer(absl::StrCat(where, ": a shape dimension"));
            if (!dim.ok()) return dim.status();
            e->shape.push_back(static_cast<int64_t>(*dim));
          } while (r->Consume(','));
          st = r->Expect(']');
        }
        has_shape = true;
      } else if (*key == "data_offsets") {
        st = ReadOffsets(r, where, &begin, &end);
        has_offsets = true;
      } else {
        st = r->SkipValue();
      }
      if (!st.ok()) return st;
    } while (r->Consume(','));
    if (absl::Status st = r->Expect('}'); !st.ok()) return st;
  }
  if (!has_dtype || !has_shape || !has_offsets) {
    return Bad(absl::StrCat(where, " lacks dtype, shape or data_offsets"));
  }
  const std::string& tag = e->file_dtype;
  if (tag == "F32" || tag == "F16" || tag == "BF16") {
    e->dtype = DType::kFloat32;
  } else if (tag == "I32") {
    e->dtype = DType::kInt32;
  } else {
    return Bad(absl::StrCat(where, " has dtype \"", EchoInput(tag),
                            "\"; only F32, F16, BF16 and I32 are read"));
  }
  uint64_t numel = 1;
  for (const int64_t d : e->shape) {
    const uint64_t dim = static_cast<uint64_t>(d);
    if (dim != 0 && numel > (uint64_t{1} << 62) / dim) {
      return Bad(absl::StrCat(where, ": shape too large"));
    }
    numel *= dim;
  }
  // An end past the data is a truncated file, said once every tensor is read
  // (ParseSafetensorsHeader), naming the first such tensor in the file's layout.
  if (end < begin) {
    return Bad(
        absl::StrCat(where, ": data_offsets [", begin, ", ", end, "] end before they begin"));
  }
  if (end - begin != SafetensorsDataBytes(*e)) {
    return Bad(absl::StrCat(where, ": ", tag, ShapeString(e->shape), " needs ",
                            SafetensorsDataBytes(*e), " bytes, data_offsets give ", end - begin));
  }
  e->offset = begin;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Safetensors> ParseSafetensorsHeader(absl::string_view json, uint64_t data_bytes) {
  HeaderReader r(json);
  Safetensors out;
  // Every tensor by where its data begins, to check the data is covered exactly.
  using Tensors = std::map<std::string, SafetensorsEntry>;
  std::vector<std::pair<uint64_t, const Tensors::value_type*>> starts;
  if (absl::Status st = r.Expect('{'); !st.ok()) return st;
  if (!r.Consume('}')) {
    do {
      absl::StatusOr<std::string> name = r.String();
      if (!name.ok()) return name.status();
      if (absl::Status st = r.Expect(':'); !st.ok()) return st;
      if (*name == "__metadata__") {
        if (absl::Status st = ReadMetadata(&r, &out.metadata); !st.ok()) return st;
        continue;
      }
      const std::string where = absl::StrCat("tensor ", EchoInput(*name));
      SafetensorsEntry e;
      if (absl::Status st = ReadEntry(&r, where, data_bytes, &e); !st.ok()) return st;
      const auto [it, added] = out.tensors.emplace(*std::move(name), std::move(e));
      if (!added) return Bad(absl::StrCat(where, " is named twice"));
      starts.emplace_back(it->second.offset, &*it);
    } while (r.Consume(','));
    if (absl::Status st = r.Expect('}'); !st.ok()) return st;
  }
  if (!r.AtEnd()) return r.Syntax("more after the object");
  // A tensor whose data lies past the file's end: the file was cut short (a copy or
  // download that stopped). Named by the layout (the lowest offset), not the header's order.
  const Tensors::value_type* past = nullptr;
  for (const auto& [begin, tensor] : starts) {
    const uint64_t end = begin + SafetensorsDataBytes(tensor->second);
    if (end <= data_bytes) continue;
    if (past == nullptr ||
        std::tie(begin, tensor->first) < std::tie(past->second.offset, past->first)) {
      past = tensor;
    }
  }
  if (past != nullptr) {
    uint64_t need = 0;
    for (const auto& [begin, tensor] : starts) {
      need = std::max(need, begin + SafetensorsDataBytes(tensor->second));
    }
    return Bad(absl::StrCat(
        "the file is truncated: it holds ", data_bytes, " data bytes but its header places ",
        starts.size(), " tensors in ", need, " bytes; tensor ", EchoInput(past->first),
        " (data_offsets [", past->second.offset, ", ",
        past->second.offset + SafetensorsDataBytes(past->second), "]) is the first past the end"));
  }
  // By begin, then end, then name: the file's layout (empty tensors by name).
  std::sort(starts.begin(), starts.end(), [](const auto& a, const auto& b) {
    const uint64_t a_end = a.first + SafetensorsDataBytes(a.second->second);
    const uint64_t b_end = b.first + SafetensorsDataBytes(b.second->second);
    return std::tie(a.first, a_end, a.second->first) < std::tie(b.first, b_end, b.second->first);
  });
  out.order.reserve(starts.size());
  uint64_t at = 0;
  for (const auto& [begin, tensor] : starts) {
    if (begin != at) {
      return Bad(absl::StrCat("tensor ", EchoInput(tensor->first), " starts at ", begin,
                              " but the data before it ends at ", at,
                              begin < at ? " (overlap)" : " (a hole)"));
    }
    at = begin + SafetensorsDataBytes(tensor->second);
    out.order.push_back(tensor->first);
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
