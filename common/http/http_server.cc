#include "common/http/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// Bytes taken from a socket per recv().
constexpr size_t kReadChunk = 16 * 1024;
// After answering with "Connection: close", what the client still sends is read and
// dropped for at most this long and this many bytes before the socket is closed, so that
// closing with unread bytes (which makes the kernel send a reset) does not destroy the
// response before the client has read it.
constexpr absl::Duration kLinger = absl::Seconds(2);
constexpr size_t kMaxDrainBytes = 1 << 20;
// At max_connections, a connection becomes evictable once it has waited this long for a
// request; until one has, new connections wait in the kernel's accept queue, so a burst of
// real clients is served in turn instead of evicting each other.
constexpr absl::Duration kEvictionGrace = absl::Seconds(1);
// How long accepting pauses when the process is out of file descriptors.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);

struct Connection {
  enum State {
    kReading,   // waiting for (the rest of) a request head
    kIdle,      // kept alive between requests, nothing received
    kWriting,   // sending a response
    kDraining,  // response sent, write side shut: reading and dropping until EOF
  };

  explicit Connection(int f) : fd(f) {}
  ~Connection() {
    if (fd >= 0) close(fd);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd;
  State state = kReading;
  std::string in;            // received, not yet consumed
  std::string out;           // the response being sent
  size_t sent = 0;           // bytes of `out` sent
  bool close_after = false;  // close once `out` is sent
  bool peer_done = false;    // the client closed its side
  size_t drained = 0;        // bytes dropped while kDraining
  absl::Time deadline;       // when the current state times out
  absl::Time waiting_since;  // since when it waits for a request (eviction order)
  bool closed = false;       // to be removed
};

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

}  // namespace

struct HttpServer::Loop {
  int listen_fd = -1;
  int wake_fd = -1;
  http::Handler handler;
  HttpServerOptions options;
  std::atomic<int>* open_connections = nullptr;
  std::vector<std::unique_ptr<Connection>> conns;
  absl::Time accept_paused_until = absl::InfinitePast();

  ~Loop() {
    conns.clear();
    if (listen_fd >= 0) close(listen_fd);
  }

  void Run();
  void Accept(absl::Time now);
  // The connection a newcomer may replace now: one already answered and draining, else
  // the one that has waited longest for a request if that is kEvictionGrace or more; or
  // nullptr.
  Connection* Evictable(absl::Time now);
  // When some connection becomes evictable (InfinitePast if one is now, InfiniteFuture if
  // every one is sending a response).
  absl::Time NextEvictable();
  // Closes Evictable(now), if any; true if it did.
  bool EvictOne(absl::Time now);
  void Read(Connection& c, absl::Time now);
  void Answer(Connection& c, absl::Time now);
  void Flush(Connection& c, absl::Time now);
  void Expire(Connection& c);

  void Close(Connection& c) { c.closed = true; }
  void BeginRequest(Connection& c, absl::Time now) {
    c.state = Connection::kReading;
    c.deadline = now + options.request_timeout;
  }
};

void HttpServer::Loop::Run() {
  std::vector<pollfd> fds;
  for (;;) {
    const absl::Time now = absl::Now();
    fds.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    bool accepting = now >= accept_paused_until;
    absl::Time next = now + absl::Seconds(1);
    if (!accepting) next = std::min(next, accept_paused_until);
    if (accepting && static_cast<int>(conns.size()) >= options.max_connections) {
      // Full: accept only when a connection can be evicted, else look again when one can.
      const absl::Time evictable = NextEvictable();
      accepting = evictable <= now;
      if (!accepting) next = std::min(next, evictable);
    }
    fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});
    for (const auto& c : conns) {
      fds.push_back(
          {c->fd, static_cast<short>(c->state == Connection::kWriting ? POLLOUT : POLLIN), 0});
      next = std::min(next, c->deadline);
    }
    const int64_t wait_ms = std::max<int64_t>(
        0, absl::ToInt64Milliseconds(absl::Ceil(next - now, absl::Milliseconds(1))));
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (ready < 0) {
      // EINTR, or ENOMEM: try again shortly rather than stop serving.
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[0].revents != 0) return;  // stop requested

    const absl::Time t = absl::Now();
    // Connections first, while fds[2 + i] still matches conns[i].
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = *conns[i];
      const short ev = fds[2 + i].revents;
      if (ev == 0) continue;
      if (c.state == Connection::kWriting) {
        Flush(c, t);
      } else {
        Read(c, t);
      }
    }
    for (auto& c : conns) {
      if (!c->closed && t >= c->deadline) Expire(*c);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(),
                               [](const std::unique_ptr<Connection>& c) { return c->closed; }),
                conns.end());
    if (fds[1].revents != 0) Accept(t);
    open_connections->store(static_cast<int>(conns.size()));
  }
}

void HttpServer::Loop::Accept(absl::Time now) {
  // A bounded batch per round, so that a flood of connections cannot starve the open ones.
  for (int i = 0; i < 64; ++i) {
    // Full and nobody to evict yet: leave the rest in the accept queue.
    if (static_cast<int>(conns.size()) >= options.max_connections && !EvictOne(now)) return;
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: free a stale waiting connection if there is one,
        // and pause accepting so poll() does not spin on the listening socket.
        EvictOne(now);
        accept_paused_until = now + kAcceptBackoff;
      }
      return;  // EAGAIN: accepted all there were
    }
    auto c = std::make_unique<Connection>(fd);
    c->waiting_since = now;
    BeginRequest(*c, now);
    conns.push_back(std::move(c));
  }
}

Connection* HttpServer::Loop::Evictable(absl::Time now) {
  Connection* draining = nullptr;
  Connection* oldest = nullptr;
  for (auto& c : conns) {
    if (c->closed || c->state == Connection::kWriting) continue;
    if (c->state == Connection::kDraining) {
      // Answered already: the first to go.
      if (draining == nullptr || c->deadline < draining->deadline) draining = c.get();
    } else if (oldest == nullptr || c->waiting_since < oldest->waiting_since) {
      oldest = c.get();
    }
  }
  if (draining != nullptr) return draining;
  if (oldest != nullptr && now - oldest->waiting_since >= kEvictionGrace) return oldest;
  return nullptr;
}

absl::Time HttpServer::Loop::NextEvictable() {
  absl::Time t = absl::InfiniteFuture();
  for (auto& c : conns) {
    if (c->closed || c->state == Connection::kWriting) continue;
    t = std::min(t, c->state == Connection::kDraining ? absl::InfinitePast()
                                                      : c->waiting_since + kEvictionGrace);
  }
  return t;
}

bool HttpServer::Loop::EvictOne(absl::Time now) {
  Connection* victim = Evictable(now);
  if (victim == nullptr) return false;
  victim->closed = true;
  conns.erase(std::remove_if(conns.begin(), conns.end(),
                             [](const std::unique_ptr<Connection>& c) { return c->closed; }),
              conns.end());
  return true;
}

void HttpServer::Loop::Read(Connection& c, absl::Time now) {
  char buf[kReadChunk];
  for (;;) {
    const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      if (c.state == Connection::kDraining) {
        c.drained += static_cast<size_t>(n);
        if (c.drained > kMaxDrainBytes) return Close(c);
        continue;
      }
      if (c.state == Connection::kIdle) BeginRequest(c, now);
      c.in.append(buf, static_cast<size_t>(n));
      // Enough to answer the head or refuse it as too large; the rest waits in the kernel.
      if (c.in.size() > options.limits.max_head_bytes) break;
      continue;
    }
    if (n == 0) {
      c.peer_done = true;
      break;
    }
    if (errno == EINTR) continue;
    if (WouldBlock(errno)) break;
    return Close(c);  // ECONNRESET and the like
  }
  if (c.state == Connection::kDraining) {
    if (c.peer_done) Close(c);
    return;
  }
  Answer(c, now);
  // The client closed its side: a request it completed is still answered, then closed.
  if (c.peer_done && !c.closed) {
    if (c.state == Connection::kWriting) {
      c.close_after = true;
    } else {
      Close(c);
    }
  }
}

void HttpServer::Loop::Answer(Connection& c, absl::Time now) {
  if (c.in.empty()) return;
  http::Step step = http::NextStep(c.in, options.limits, handler);
  if (step.kind == http::Step::kNeedMore) return;
  c.in.erase(0, step.consumed);
  c.out = std::move(step.output);
  c.sent = 0;
  c.close_after = step.close;
  c.state = Connection::kWriting;
  c.deadline = now + options.write_timeout;
  Flush(c, now);
}

void HttpServer::Loop::Flush(Connection& c, absl::Time now) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && WouldBlock(errno)) return;  // poll() says when to go on
    return Close(c);                         // EPIPE, ECONNRESET
  }
  c.out.clear();
  c.out.shrink_to_fit();
  c.sent = 0;
  if (c.close_after) {
    if (c.peer_done) return Close(c);
    shutdown(c.fd, SHUT_WR);
    c.in.clear();
    c.state = Connection::kDraining;
    c.deadline = now + kLinger;
    return;
  }
  // Kept alive: a pipelined request may already be here.
  c.waiting_since = now;
  if (c.in.empty()) {
    c.state = Connection::kIdle;
    c.deadline = now + options.idle_timeout;
    return;
  }
  BeginRequest(c, now);
  Answer(c, now);
}

void HttpServer::Loop::Expire(Connection& c) {
  if (c.state == Connection::kReading && !c.in.empty()) {
    // A request was started and not finished in time: say so, best effort, then close.
    const std::string resp = http::ErrorResponse(408, "request not received in time");
    (void)!send(c.fd, resp.data(), resp.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  Close(c);
}

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) ||
      *port < 0 || *port > 65535 || address.substr(colon + 1).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" is not host:port (port 0..65535)"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  } else if (host->find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address \"", address, "\" is not host:port (write an IPv6 host as [addr]:port)"));
  }
  if (host->empty()) *host = "0.0.0.0";
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              http::Handler handler,
                                                              HttpServerOptions options) {
  std::string host;
  int port = 0;
  if (absl::Status st = SplitHostPort(address, &host, &port); !st.ok()) return st;
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("HttpServerOptions.max_connections must be at least 1");
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_str = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", address, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      error = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
    error = absl::StrCat("bind: ", std::strerror(errno));
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", address, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  std::unique_ptr<HttpServer> server(new HttpServer());
  if (pipe2(server->wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", address, ": pipe: ", std::strerror(errno)));
  }
  server->port_ = bound_port;
  server->loop_ = std::make_unique<Loop>();
  server->loop_->listen_fd = fd;
  server->loop_->wake_fd = server->wake_fds_[0];
  server->loop_->handler = std::move(handler);
  server->loop_->options = options;
  server->loop_->open_connections = &server->connections_;
  server->thread_ = std::thread([loop = server->loop_.get()] { loop->Run(); });
  return server;
}

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    const char byte = 1;
    (void)!write(wake_fds_[1], &byte, 1);
    thread_.join();
  }
  loop_.reset();
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

}  // namespace baton
