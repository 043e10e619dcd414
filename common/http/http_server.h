// A small HTTP/1.1 server for baton's own endpoints (the metrics port): one thread, one
// poll() loop, non-blocking sockets. Requests are answered by http::NextStep (http.h) with
// the caller's handler.
//
// Built for a port that anything on the network can reach (a browser, a load balancer's
// probe, a scanner) without that reaching the process it runs in:
//  - every path and method gets an answer from the handler or a 4xx from NextStep;
//  - a connection that sends nothing, or too slowly, costs a file descriptor and no
//    thread, and is closed when its deadline passes (request_timeout, idle_timeout,
//    write_timeout), so silent sockets never hold up a scrape;
//  - at max_connections, new connections wait in the kernel's accept queue until a
//    connection has waited a second or more for a request; the one that has waited
//    longest is then evicted for the next newcomer (a burst of real clients is served in
//    turn, silent sockets cannot hold every slot for longer than that second);
//  - reads stop while a response is being sent, so a connection holds at most one head
//    and one response in memory.
//
// Thread safety: Start and the destructor are called from one thread; port() and
// connections() from any. The handler runs on the server's thread, one request at a time.
#ifndef BATON_COMMON_HTTP_HTTP_SERVER_H_
#define BATON_COMMON_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/http.h"

namespace baton {

struct HttpServerOptions {
  http::Limits limits;
  // From a connection's accept, or the first byte of a later request on it, to that
  // request's complete head. Past it: 408 and close.
  absl::Duration request_timeout = absl::Seconds(10);
  // A kept-alive connection with no request under way is closed after this long.
  absl::Duration idle_timeout = absl::Seconds(120);
  // A response the client has not taken in full by then: the connection is closed.
  absl::Duration write_timeout = absl::Seconds(10);
  // Open connections at most (the listening socket aside); more wait to be accepted.
  int max_connections = 128;
};

class HttpServer {
 public:
  // Listens on `address` ("host:port", "[v6]:port"; an empty host is 0.0.0.0; port 0
  // picks a free one) and serves on a thread of its own. INVALID_ARGUMENT when the address
  // is not host:port, UNAVAILABLE naming it when it cannot be resolved or bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           http::Handler handler,
                                                           HttpServerOptions options = {});

  // Stops serving: closes the listening socket and every connection, joins the thread.
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port.
  int port() const { return port_; }

  // Connections open now (for tests and diagnostics).
  int connections() const { return connections_.load(); }

 private:
  struct Loop;  // the poll loop's state, owned by the server thread (http_server.cc)

  HttpServer() = default;

  int port_ = 0;
  std::atomic<int> connections_{0};
  int wake_fds_[2] = {-1, -1};  // a pipe: writing a byte wakes poll() to stop
  std::unique_ptr<Loop> loop_;  // touched only by thread_ once it started
  std::thread thread_;
};

// Splits "host:port" or "[v6]:port" into host and port; an empty host is "0.0.0.0".
// INVALID_ARGUMENT names the address when it is not of that form or the port is not in
// 0..65535.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace baton

#endif  // BATON_COMMON_HTTP_HTTP_SERVER_H_
