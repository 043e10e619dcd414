#include "common/http/http.h"

#include <zlib.h>

#include <cstdint>
#include <exception>

namespace baton::http {
namespace {

// tchar of RFC 9110 5.6.2: what a method or a field name is made of.
bool IsTokenChar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

std::string LowerCopy(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Calls fn(element) for each element of a comma-separated list (RFC 9110 5.6.1), trimmed,
// empty elements skipped.
template <typename Fn>
void ForEachListElement(std::string_view list, Fn fn) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view element = Trim(list.substr(0, comma));
    if (!element.empty()) fn(element);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

// A field value may hold visible characters, spaces, tabs and obs-text; no other control
// characters (NUL, CR, LF, DEL...).
bool IsValidFieldValue(std::string_view v) {
  for (unsigned char c : v) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

// A request target: visible ASCII and obs-text, no whitespace or control characters.
bool IsValidTarget(std::string_view t) {
  if (t.empty()) return false;
  for (unsigned char c : t) {
    if (c <= 0x20 || c == 0x7f) return false;
  }
  return true;
}

// The weight of an Accept-Encoding element's parameters: 0 when it says q=0 (0, 0.0,
// 0.00, 0.000), else 1 (any other weight accepts the coding).
bool HasZeroWeight(std::string_view params) {
  bool zero = false;
  while (!params.empty()) {
    const size_t semi = params.find(';');
    const std::string_view p = Trim(params.substr(0, semi));
    if (p.size() >= 2 && Lower(p[0]) == 'q' && p[1] == '=') {
      const std::string_view q = p.substr(2);
      zero = !q.empty() && q[0] == '0' &&
             (q.size() == 1 ||
              (q[1] == '.' && q.substr(2).find_first_not_of('0') == std::string_view::npos));
    }
    if (semi == std::string_view::npos) break;
    params.remove_prefix(semi + 1);
  }
  return zero;
}

bool AcceptsGzip(std::string_view accept_encoding) {
  bool gzip = false;
  ForEachListElement(accept_encoding, [&](std::string_view element) {
    const size_t semi = element.find(';');
    const std::string_view coding = Trim(element.substr(0, semi));
    const std::string_view params =
        semi == std::string_view::npos ? std::string_view() : element.substr(semi + 1);
    if (EqualsIgnoreCase(coding, "gzip") || EqualsIgnoreCase(coding, "x-gzip") || coding == "*") {
      gzip = !HasZeroWeight(params);
    }
  });
  return gzip;
}

// The path of a request target (see Request::path).
std::string PathOf(std::string_view target) {
  if (target.front() == '/') return std::string(target.substr(0, target.find('?')));
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() >= scheme.size() &&
        EqualsIgnoreCase(target.substr(0, scheme.size()), scheme)) {
      std::string_view rest = target.substr(scheme.size());
      const size_t slash = rest.find('/');
      if (slash == std::string_view::npos) return "/";
      rest.remove_prefix(slash);
      return std::string(rest.substr(0, rest.find('?')));
    }
  }
  return std::string(target);
}

// "HTTP/1.1" and the like: 0 and the minor version when it is 1.x, 505 for another
// major version, 400 when it is no HTTP version at all.
int ParseVersion(std::string_view v, int* minor) {
  if (v.size() != 8 || v.substr(0, 5) != "HTTP/" || v[6] != '.' || v[5] < '0' || v[5] > '9' ||
      v[7] < '0' || v[7] > '9') {
    return 400;
  }
  if (v[5] != '1') return 505;
  *minor = v[7] == '0' ? 0 : 1;
  return 0;
}

// Parses a complete head (the request line and the field lines, each without its line
// ending). Returns 0, or the status to refuse the request with.
int ParseHead(const std::vector<std::string_view>& lines, const Limits& limits, Request* req) {
  const std::string_view line = lines.front();
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return 400;  // not exactly method SP target SP version
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (!IsToken(method) || !IsValidTarget(target)) return 400;
  if (const int st = ParseVersion(line.substr(sp2 + 1), &req->minor_version); st != 0) {
    return st;
  }
  req->method = std::string(method);
  req->target = std::string(target);
  req->path = PathOf(target);

  if (lines.size() - 1 > limits.max_headers) return 431;
  bool close = req->minor_version == 0;  // HTTP/1.0 closes unless asked to keep alive
  bool keep_alive_token = false;
  bool have_length = false;
  uint64_t length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string_view field = lines[i];
    const size_t colon = field.find(':');
    // No colon, an empty name, whitespace before the colon, or a line folded onto the
    // previous one (obs-fold, starting with whitespace): all 400 (RFC 9112 5.1, 5.2).
    if (colon == std::string_view::npos || !IsToken(field.substr(0, colon))) return 400;
    const std::string_view value = Trim(field.substr(colon + 1));
    if (!IsValidFieldValue(value)) return 400;
    req->headers.emplace_back(LowerCopy(field.substr(0, colon)), std::string(value));
    const std::string& name = req->headers.back().first;
    if (name == "connection") {
      ForEachListElement(value, [&](std::string_view option) {
        if (EqualsIgnoreCase(option, "close")) close = true;
        if (EqualsIgnoreCase(option, "keep-alive")) keep_alive_token = true;
      });
    } else if (name == "content-length") {
      // Digits only, at most 18 of them; repeated fields must agree (RFC 9112 6.3).
      if (value.empty() || value.size() > 18 ||
          value.find_first_not_of("0123456789") != std::string_view::npos) {
        return 400;
      }
      uint64_t n = 0;
      for (char c : value) n = n * 10 + static_cast<uint64_t>(c - '0');
      if (have_length && n != length) return 400;
      have_length = true;
      length = n;
    } else if (name == "transfer-encoding") {
      req->has_body = true;
    } else if (name == "accept-encoding") {
      req->accepts_gzip = AcceptsGzip(value);
    }
  }
  if (length > 0) req->has_body = true;
  if (req->minor_version == 0 && keep_alive_token) close = false;
  req->keep_alive = !close;
  return 0;
}

// Status line, framing fields, `extra` fields, the empty line, and the body unless
// `head_only`.
std::string Serialize(const Response& r, bool head_only, bool close, bool http10_keep_alive) {
  std::string out;
  out.reserve(160 + r.body.size());
  out += "HTTP/1.1 ";
  out += std::to_string(r.status);
  out += ' ';
  out += ReasonPhrase(r.status);
  out += "\r\nContent-Type: ";
  out += r.content_type;
  out += "\r\nContent-Length: ";
  out += std::to_string(r.body.size());
  out += "\r\n";
  if (!r.content_encoding.empty()) {
    out += "Content-Encoding: ";
    out += r.content_encoding;
    out += "\r\n";
  }
  for (const auto& [name, value] : r.headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  if (close) {
    out += "Connection: close\r\n";
  } else if (http10_keep_alive) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  if (!head_only) out += r.body;
  return out;
}

Step Refuse(int status, std::string_view detail) {
  Step step;
  step.kind = Step::kRespond;
  step.status = status;
  step.close = true;
  step.output = ErrorResponse(status, detail);
  return step;
}

}  // namespace

const std::string* Request::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return &value;
  }
  return nullptr;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string ErrorResponse(int status, std::string_view detail) {
  Response r;
  r.status = status;
  r.body = std::string(detail);
  r.body += '\n';
  return Serialize(r, /*head_only=*/false, /*close=*/true, /*http10_keep_alive=*/false);
}

Step NextStep(std::string_view input, const Limits& limits, const Handler& handler) {
  // Split the head into lines. Empty lines before the request line are skipped (RFC 9112
  // 2.2); a bare LF ends a line like CRLF does; the first empty line after the request
  // line ends the head. Everything up to there counts against max_head_bytes.
  std::vector<std::string_view> lines;
  size_t pos = 0;
  bool complete = false;
  while (pos < input.size()) {
    const size_t nl = input.find('\n', pos);
    if (nl == std::string_view::npos) break;
    std::string_view line = input.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = nl + 1;
    if (pos > limits.max_head_bytes) {
      return Refuse(431,
                    "request head larger than " + std::to_string(limits.max_head_bytes) + " bytes");
    }
    if (line.empty()) {
      if (lines.empty()) continue;
      complete = true;
      break;
    }
    if (line.find('\r') != std::string_view::npos) return Refuse(400, "bare CR in request head");
    lines.push_back(line);
    if (lines.size() > limits.max_headers + 1) {
      return Refuse(431, "more than " + std::to_string(limits.max_headers) + " header fields");
    }
  }
  if (!complete) {
    if (input.size() > limits.max_head_bytes) {
      return Refuse(431,
                    "request head larger than " + std::to_string(limits.max_head_bytes) + " bytes");
    }
    return Step{};  // kNeedMore
  }

  Request req;
  if (const int status = ParseHead(lines, limits, &req); status != 0) {
    switch (status) {
      case 431:
        return Refuse(431, "more than " + std::to_string(limits.max_headers) + " header fields");
      case 505:
        return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served here");
      default:
        return Refuse(400, "malformed request line or header field");
    }
  }

  Response resp;
  try {
    resp = handler(req);
  } catch (const std::exception& e) {
    return Refuse(500, std::string("internal error: ") + e.what());
  } catch (...) {
    return Refuse(500, "internal error");
  }
  Step step;
  step.kind = Step::kRespond;
  step.status = resp.status;
  step.consumed = pos;
  // A body is never read: after answering, the connection cannot be reused.
  step.close = !req.keep_alive || req.has_body;
  step.output = Serialize(resp, req.method == "HEAD", step.close,
                          /*http10_keep_alive=*/req.minor_version == 0 && !step.close);
  return step;
}

std::string Gzip(std::string_view data) {
  z_stream zs{};
  // windowBits 15 + 16: a gzip wrapper rather than zlib's.
  if (deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return std::string();
  }
  std::string out(deflateBound(&zs, static_cast<uLong>(data.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return rc == Z_STREAM_END ? out : std::string();
}

}  // namespace baton::http
