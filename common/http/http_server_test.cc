#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

http::Response Hello(const http::Request& r) {
  http::Response resp;
  resp.body = "hello " + r.path;
  return resp;
}

// Bounds only a hang: every read and close the tests wait for is expected to come.
constexpr absl::Duration kHangBound = absl::Seconds(60);

// A blocking client socket with a receive deadline.
class Client {
 public:
  explicit Client(int port, absl::Duration recv_timeout = kHangBound) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    const timeval tv = absl::ToTimeval(recv_timeout);
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { close(fd_); }

  bool connected() const { return connected_; }

  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads one response framed by Content-Length (the tests' responses always have one);
  // "" on EOF, timeout or error before it is complete.
  std::string ReadResponse(bool head = false) {
    for (;;) {
      const size_t end = buf_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const size_t cl = buf_.find("Content-Length: ");
        const size_t len = cl < end ? std::stoul(buf_.substr(cl + 16)) : 0;
        const size_t total = end + 4 + (head ? 0 : len);
        if (buf_.size() >= total) {
          std::string out = buf_.substr(0, total);
          buf_.erase(0, total);
          return out;
        }
      }
      if (!Fill()) return "";
    }
  }

  // True when the server closed the connection (EOF or reset) before `within` passed,
  // discarding whatever it sent first.
  bool ClosedWithin(absl::Duration within) {
    const absl::Time until = absl::Now() + within;
    while (absl::Now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) == 1) {
        char b[4096];
        const ssize_t n = recv(fd_, b, sizeof(b), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
        if (n > 0) buf_.append(b, static_cast<size_t>(n));
      }
    }
    return false;
  }

  const std::string& received() const { return buf_; }

  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }

 private:
  bool Fill() {
    char b[4096];
    const ssize_t n = recv(fd_, b, sizeof(b), 0);
    if (n <= 0) return false;
    buf_.append(b, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

// Waits until the server holds `n` connections; false if it does not within kHangBound.
bool WaitForConnections(const HttpServer& server, int n) {
  const absl::Time deadline = absl::Now() + kHangBound;
  while (server.connections() != n) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

std::unique_ptr<HttpServer> StartOrDie(HttpServerOptions options = {}) {
  auto server = HttpServer::Start("127.0.0.1:0", Hello, options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(HttpServer, KeepsAliveAndAnswersPipelinedRequests) {
  auto server = StartOrDie();
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /a"));
  ASSERT_TRUE(c.Send("GET /b HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\nHEAD /d HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /b"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /c"));
  EXPECT_THAT(c.ReadResponse(/*head=*/true), EndsWith("\r\n\r\n"));
  ASSERT_TRUE(c.Send("GET /e HTTP/1.1\r\nConnection: close\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /e"));
  EXPECT_TRUE(c.ClosedWithin(kHangBound));
}

// The silent ones would only give way at their request timeout, set here beyond the
// client's receive deadline: an answer shows they never held it up.
TEST(HttpServer, SilentConnectionsDoNotHoldUpOthers) {
  HttpServerOptions o;
  o.request_timeout = absl::Minutes(10);
  auto server = StartOrDie(o);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<Client>> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(std::make_unique<Client>(server->port()));
  Client c(server->port());
  ASSERT_TRUE(c.Send("GET /x HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /x"));
}

TEST(HttpServer, ASlowRequestTimesOutWith408) {
  HttpServerOptions o;
  o.request_timeout = absl::Milliseconds(300);
  auto server = StartOrDie(o);
  ASSERT_NE(server, nullptr);
  Client slow(server->port());
  Client silent(server->port());
  ASSERT_TRUE(slow.Send("GET /slo"));
  EXPECT_TRUE(slow.ClosedWithin(kHangBound));
  EXPECT_THAT(slow.received(), StartsWith("HTTP/1.1 408 Request Timeout\r\n"));
  EXPECT_TRUE(silent.ClosedWithin(kHangBound));
  EXPECT_EQ(silent.received(), "");  // nothing was asked: closed without a word
}

TEST(HttpServer, IdleKeptAliveConnectionsAreClosed) {
  HttpServerOptions o;
  o.idle_timeout = absl::Milliseconds(200);
  auto server = StartOrDie(o);
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /a"));
  EXPECT_TRUE(c.ClosedWithin(kHangBound));
}

TEST(HttpServer, AtTheLimitANewConnectionEvictsTheLongestWaiting) {
  HttpServerOptions o;
  o.max_connections = 3;
  auto server = StartOrDie(o);
  ASSERT_NE(server, nullptr);
  Client first(server->port());
  ASSERT_TRUE(WaitForConnections(*server, 1));  // accepted: its wait has begun
  absl::SleepFor(absl::Milliseconds(1200));     // past the eviction grace of a second
  Client second(server->port());
  Client third(server->port());
  Client fourth(server->port());
  ASSERT_TRUE(fourth.Send("GET /4 HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(fourth.ReadResponse(), EndsWith("hello /4"));
  EXPECT_TRUE(first.ClosedWithin(kHangBound));
  EXPECT_LE(server->connections(), 3);
  ASSERT_TRUE(third.Send("GET /3 HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(third.ReadResponse(), EndsWith("hello /3"));
}

TEST(HttpServer, ABurstBeyondTheLimitIsServedInTurn) {
  HttpServerOptions o;
  o.max_connections = 3;
  auto server = StartOrDie(o);
  ASSERT_NE(server, nullptr);
  // All connect at once; the server holds 3, the rest wait in the accept queue, and
  // nobody is evicted for a client that has not had a second to speak.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 12; ++i) clients.push_back(std::make_unique<Client>(server->port()));
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(clients[i]->Send("GET /" + std::to_string(i) + " HTTP/1.0\r\n\r\n"));
  }
  for (int i = 0; i < 12; ++i) {
    EXPECT_THAT(clients[i]->ReadResponse(), EndsWith("hello /" + std::to_string(i))) << i;
  }
}

TEST(HttpServer, AnOversizedHeadGets431AndTheClientCanReadIt) {
  auto server = StartOrDie();
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  // 64 KiB of header: the server answers after 16 KiB, then drains the rest, so the
  // client still reads the answer instead of a connection reset.
  std::string req = "GET / HTTP/1.1\r\nX-Big: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  c.Send(req);  // may fail part-way once the server shut its side; the answer is what counts
  EXPECT_THAT(c.ReadResponse(), StartsWith("HTTP/1.1 431 "));
  EXPECT_TRUE(c.ClosedWithin(kHangBound));
}

TEST(HttpServer, ARequestWithABodyIsAnsweredAndClosed) {
  auto server = StartOrDie();
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(
      c.Send("POST /p HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, 'b')));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("Connection: close\r\n"));
  EXPECT_TRUE(c.ClosedWithin(kHangBound));
}

TEST(HttpServer, AnswersARequestSentWithItsWriteSideClosed) {
  auto server = StartOrDie();
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send("GET /half HTTP/1.0\r\n\r\n"));
  c.ShutdownWrite();  // like `printf ... | nc -N`: the request, then FIN
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /half"));
  EXPECT_TRUE(c.ClosedWithin(kHangBound));
}

TEST(HttpServer, TwoHundredConcurrentClients) {
  auto server = StartOrDie();
  ASSERT_NE(server, nullptr);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 200; ++i) {
    threads.emplace_back([&, i] {
      Client c(server->port());
      const std::string path = "/" + std::to_string(i);
      if (c.Send("GET " + path + " HTTP/1.1\r\n\r\n") &&
          absl::EndsWith(c.ReadResponse(), "hello " + path)) {
        ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST(HttpServer, StoppingClosesEveryConnection) {
  auto server = StartOrDie();
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.1\r\n\r\n"));
  EXPECT_THAT(c.ReadResponse(), EndsWith("hello /a"));
  const int port = server->port();
  server.reset();
  EXPECT_TRUE(c.ClosedWithin(kHangBound));
  Client after(port);
  EXPECT_FALSE(after.connected());
}

TEST(HttpServer, RefusesBadAndTakenAddresses) {
  for (const char* bad : {"no-port", "127.0.0.1:70000", "127.0.0.1:", "::1:80", "h:x"}) {
    auto s = HttpServer::Start(bad, Hello);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr(bad));
  }
  auto first = StartOrDie();
  ASSERT_NE(first, nullptr);
  const std::string taken = "127.0.0.1:" + std::to_string(first->port());
  auto second = HttpServer::Start(taken, Hello);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(taken));
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

TEST(SplitHostPort, Forms) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(SplitHostPort("[::1]:9470", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 9470);
  ASSERT_TRUE(SplitHostPort(":80", &host, &port).ok());
  EXPECT_EQ(host, "0.0.0.0");
  EXPECT_EQ(port, 80);
  ASSERT_TRUE(SplitHostPort("localhost:0", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 0);
}

}  // namespace
}  // namespace baton
