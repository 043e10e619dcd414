// HTTP/1.1 for baton's small HTTP endpoints (the metrics port): request parsing and
// response writing, without sockets. Bytes in, bytes out; http_server.h owns the sockets.
//
// Only what such an endpoint needs (RFC 9110/9112): a request head, never a body (a request
// that carries one is answered and its connection closed), keep-alive, HEAD, and gzip
// bodies. Every function here is a pure function of its arguments and thread-safe;
// libFuzzer drives NextStep with arbitrary bytes (tests/fuzz/http_fuzz.cc).
//
// Depends on the C++ standard library and zlib only, so the fuzzer builds it with clang
// alone.
#ifndef BATON_COMMON_HTTP_HTTP_H_
#define BATON_COMMON_HTTP_HTTP_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace baton::http {

struct Limits {
  // Request line plus header fields, the empty line included. Longer: 431.
  size_t max_head_bytes = 16 * 1024;
  // Header fields in one request. More: 431.
  size_t max_headers = 100;
};

struct Request {
  std::string method;  // as sent; methods are case-sensitive (RFC 9110 9.1)
  std::string target;  // as sent
  // The target's path: the origin-form without its query ("/metrics" for
  // "/metrics?x=1"); the path of an absolute-form target ("http://h/metrics" gives
  // "/metrics", "http://h" gives "/"); "*" or an authority-form target as sent.
  std::string path;
  int minor_version = 1;  // HTTP/1.minor; 1.x with x > 1 is taken as 1.1
  // Header fields in order, names lower-cased, values without surrounding whitespace.
  std::vector<std::pair<std::string, std::string>> headers;
  bool keep_alive = true;     // another request may follow on this connection
  bool has_body = false;      // Content-Length > 0, or any Transfer-Encoding
  bool accepts_gzip = false;  // Accept-Encoding names gzip (or *) with a nonzero q

  // The first field named `lower_name`, or nullptr.
  const std::string* Header(std::string_view lower_name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string content_encoding;  // e.g. "gzip" when `body` is compressed; empty: none
  std::string body;              // sent for every method but HEAD
  // Further fields (Allow, Vary...). Content-Type, Content-Length, Content-Encoding and
  // Connection are written by NextStep and must not be given here.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Answers one parsed request. Called on the server's I/O thread; must not block long.
using Handler = std::function<Response(const Request&)>;

// One step of a connection: what to do with the bytes received so far.
struct Step {
  enum Kind {
    kNeedMore,  // no complete request head yet, and within the limits: read more
    kRespond,   // send `output`, drop `consumed` bytes of input, then close if `close`
  };
  Kind kind = kNeedMore;
  size_t consumed = 0;
  std::string output;
  bool close = false;
  int status = 0;  // the response's status code (kRespond)
};

// Answers the first request in `input` (the bytes received and not yet consumed on one
// connection). A head that is malformed (400), too large (431) or of another HTTP major
// version (505) is answered with a short error and `close`; so is a request with a body,
// after `handler` answered it (its body is never read). A handler that throws is answered
// with 500. The response to HEAD carries GET's headers and no body.
Step NextStep(std::string_view input, const Limits& limits, const Handler& handler);

// A complete response with status `status`, `detail` and a newline as its text body, and
// "Connection: close". For errors found outside NextStep (a request timeout: 408).
std::string ErrorResponse(int status, std::string_view detail);

// "OK", "Not Found", ...; "Unknown" for codes baton does not send.
std::string_view ReasonPhrase(int status);

// `data` compressed as one gzip member (RFC 1952) at zlib's fastest level; empty when zlib
// fails (out of memory), for the caller to send `data` uncompressed.
std::string Gzip(std::string_view data);

}  // namespace baton::http

#endif  // BATON_COMMON_HTTP_HTTP_H_
