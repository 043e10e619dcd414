// Gradient all-reduce between two data-parallel replicas on this machine (two threads,
// loopback TCP): what a REDUCE_GRAD costs per bucket size, against a raw TCP baseline
// measured in the same run.
//
//   gloo-ordered  GlooCollective::AllReduceSum: allgather over Gloo's TCP transport, then
//                 the ordered sum (baton's deterministic mode, what the executor runs)
//   gloo-ring     gloo::allreduce with its ring algorithm and a float sum (the engine's own
//                 all-reduce: fewer bytes for larger groups, not order-fixed)
//   raw-tcp       each side writes its buffer to the other over one loopback TCP
//                 connection and reads the other's, then sums: the least any two-member
//                 all-reduce over TCP can move, with no library in between
//
// Prints, per size, the median of --reps runs of each and its ratio to raw TCP, as
// "algorithm bandwidth" (buffer bytes / time). A driver, not a test: nothing is asserted.
//
//   build/bin/allreduce_bench [--reps 15]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/collective/gloo_collective.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs f(rank) on two threads at once, `reps` times; the slower side's time of each rep.
std::vector<double> TimePairs(int reps, const std::function<void(int)>& f) {
  std::vector<double> out;
  for (int i = 0; i < reps; ++i) {
    double t[2] = {0, 0};
    std::thread a([&] {
      const auto s = Clock::now();
      f(0);
      t[0] = std::chrono::duration<double>(Clock::now() - s).count();
    });
    const auto s = Clock::now();
    f(1);
    t[1] = std::chrono::duration<double>(Clock::now() - s).count();
    a.join();
    out.push_back(std::max(t[0], t[1]));
  }
  return out;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// A connected pair of loopback TCP sockets.
void TcpPair(int fds[2]) {
  const int lis = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(lis, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(lis, 1) != 0 ||
      ::getsockname(lis, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("listen");
    std::exit(1);
  }
  fds[0] = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fds[0], reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("connect");
    std::exit(1);
  }
  fds[1] = ::accept(lis, nullptr, nullptr);
  ::close(lis);
  const int one = 1;
  for (int i = 0; i < 2; ++i) ::setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--reps") reps = std::max(3, std::atoi(argv[i + 1]));
  }
  // Two members of each kind, connected once.
  gloo::rendezvous::HashStore store_a, store_b;
  std::unique_ptr<baton::GlooCollective> ordered[2];
  std::shared_ptr<gloo::Context> ring[2];
  {
    std::vector<std::thread> join;
    for (int r = 0; r < 2; ++r) {
      join.emplace_back([&, r] {
        auto c = baton::GlooCollective::Connect(store_a, r, 2);
        if (!c.ok()) {
          std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
          std::exit(1);
        }
        ordered[r] = *std::move(c);
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, 2);
        std::shared_ptr<gloo::transport::Device> dev = gloo::transport::tcp::CreateDevice(attr);
        ctx->connectFullMesh(store_b, dev);
        ring[r] = ctx;
      });
    }
    for (auto& t : join) t.join();
  }
  int tcp[2];
  TcpPair(tcp);

  std::printf("allreduce_bench: 2 replicas, loopback, median of %d runs; bandwidth = buffer "
              "bytes / time\n",
              reps);
  std::printf("%10s | %20s | %20s | %12s\n", "buffer", "gloo-ordered GB/s", "gloo-ring GB/s",
              "raw-tcp GB/s");
  for (size_t mib : {1, 4, 16, 64}) {
    const size_t n = mib * (1 << 20) / sizeof(float);
    std::vector<float> buf[2] = {std::vector<float>(n, 1.0f), std::vector<float>(n, 2.0f)};
    std::vector<float> peer[2] = {std::vector<float>(n), std::vector<float>(n)};
    const double t_ordered = Median(TimePairs(reps, [&](int r) {
      absl::Status s = ordered[r]->AllReduceSum(buf[r].data(), static_cast<int64_t>(n),
                                                absl::Now() + absl::Seconds(60));
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        std::exit(1);
      }
    }));
    uint32_t tag = 0;
    const double t_ring = Median(TimePairs(reps, [&](int r) {
      gloo::AllreduceOptions o(ring[r]);
      o.setInput(buf[r].data(), n);
      o.setOutput(buf[r].data(), n);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::sum<float>));
      o.setTag(tag);
      gloo::allreduce(o);
      if (r == 1) ++tag;
    }));
    const double t_tcp = Median(TimePairs(reps, [&](int r) {
      const size_t bytes = n * sizeof(float);
      std::thread w([&] {
        WriteAll(tcp[r], reinterpret_cast<const char*>(buf[r].data()), bytes);
      });
      ReadAll(tcp[r], reinterpret_cast<char*>(peer[r].data()), bytes);
      w.join();
      for (size_t i = 0; i < n; ++i) buf[r][i] += peer[r][i];
    }));
    const double bytes = static_cast<double>(n * sizeof(float));
    const double g_tcp = bytes / t_tcp / 1e9;
    std::printf("%6zu MiB | %8.2f (%5.2fx tcp) | %8.2f (%5.2fx tcp) | %12.2f\n", mib,
                bytes / t_ordered / 1e9, t_tcp / t_ordered, bytes / t_ring / 1e9,
                t_tcp / t_ring, g_tcp);
  }
  ::close(tcp[0]);
  ::close(tcp[1]);
  return 0;
}
