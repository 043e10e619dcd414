// libFuzzer target: arbitrary bytes as what a client sends on one connection to a metrics
// port, answered by the same code the services run (http::NextStep and the metrics
// router). Besides what the sanitizers catch, it checks that every answer is one complete,
// well-framed HTTP/1.1 response and that the connection always makes progress.
//
// Built and run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined); the seed
// inputs are tests/fuzz/corpus/http.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/http/http.h"
#include "common/metrics/metrics_http.h"

namespace {

void Check(bool ok, const char* what, std::string_view output) {
  if (ok) return;
  std::fprintf(stderr, "http_fuzz: %s\n--- response ---\n%.*s\n", what,
               static_cast<int>(output.size() > 2000 ? 2000 : output.size()), output.data());
  std::abort();
}

// The Content-Length value of a response head, or -1.
long ContentLength(std::string_view head) {
  const size_t at = head.find("\r\nContent-Length: ");
  if (at == std::string_view::npos) return -1;
  return std::strtol(std::string(head.substr(at + 18, 20)).c_str(), nullptr, 10);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const baton::MetricsEndpoint* endpoint = [] {
    auto* ep = new baton::MetricsEndpoint;
    ep->service = "fuzz";
    ep->render = [] { return std::string("# TYPE x gauge\nx 1\n") + std::string(300, '#'); };
    return ep;
  }();
  baton::http::Limits limits;
  limits.max_head_bytes = 1024;  // small, so that the fuzzer reaches the limits quickly
  limits.max_headers = 8;
  const baton::http::Handler handler = [](const baton::http::Request& r) {
    return baton::ServeMetricsRequest(r, *endpoint);
  };

  std::string_view input(reinterpret_cast<const char*>(data), size);
  // Like a connection: answer requests until one closes it or more bytes are needed.
  for (int requests = 0; requests < 1000; ++requests) {
    const baton::http::Step step = baton::http::NextStep(input, limits, handler);
    if (step.kind == baton::http::Step::kNeedMore) {
      Check(input.size() <= limits.max_head_bytes, "waits for more past the head limit",
            step.output);
      break;
    }
    const std::string& out = step.output;
    Check(out.rfind("HTTP/1.1 ", 0) == 0, "no status line", out);
    Check(step.status >= 200 && step.status <= 599, "status out of range", out);
    Check(out.compare(9, 3, std::to_string(step.status)) == 0, "status differs", out);
    const size_t end = out.find("\r\n\r\n");
    Check(end != std::string::npos, "no end of head", out);
    const std::string_view head(out.data(), end + 2);
    Check(head.find('\0') == std::string_view::npos, "NUL in the response head", out);
    const long length = ContentLength(head);
    Check(length >= 0, "no Content-Length", out);
    const size_t body = out.size() - end - 4;
    const size_t first = input.find_first_not_of("\r\n");
    // A HEAD answered by the router has no body; one refused by the parser (400, 431,
    // 505) or failed (500) gets the error text, and the connection closes after it.
    const bool refused = step.status == 400 || step.status == 431 || step.status == 505 ||
                         step.status == 500;
    const bool head_request =
        first != std::string_view::npos && input.substr(first, 5) == "HEAD " && !refused;
    Check(body == (head_request ? 0 : static_cast<size_t>(length)),
          "body differs from Content-Length", out);
    Check(!step.close || head.find("\r\nConnection: close") != std::string_view::npos,
          "closes without saying so", out);
    if (step.status >= 400 && step.status != 404 && step.status != 405) {
      Check(step.close, "an error that keeps the connection", out);
    }
    if (step.close) break;
    Check(step.consumed > 0 && step.consumed <= input.size(), "no progress", out);
    input.remove_prefix(step.consumed);
  }
  return 0;
}
