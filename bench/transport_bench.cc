// Tensor transport throughput on loopback: the gRPC transport against a raw TCP socket
// pair moving the same bytes, in the same run (results and the breakdown of the gap in
// docs/benchmarks.md, "Tensor transport (gRPC vs raw TCP)").
//
// The unit of work is a batch of tensors of one size (about 64 MiB per batch), moved from
// a sender to a receiver; a batch counts when the receiver holds all of it, so bytes/s is
// end-to-end throughput. The baseline moves the same bytes with write() into a loopback TCP
// socket and a reader thread recv()ing them into a tensor-sized buffer. On a shared machine
// load changes from one second to the next, so every paired benchmark alternates one TCP
// batch and one gRPC batch per iteration and reports both rates, their ratio (vs_tcp_pct)
// and the CPU seconds (all threads) each spends per GB:
//   BM_Transport/SIZE               GrpcTransport::Send on rank 0 → TensorServiceImpl →
//                                   inbox → GrpcTransport::Recv on rank 1, one process; the
//                                   shipped configuration
//   BM_TransportTwoProcesses/SIZE   the same with rank 1 in a child process, as workers are
//   BM_ProtoStream/SIZE/CHUNK_KIB   the straightforward version: the generated stub writes
//                                   TensorFrame{chunk: bytes} messages, the generated
//                                   service parses them and copies them into a tensor
//   BM_Variant/NAME/SIZE            the transport with one setting changed (chunk size,
//                                   HTTP/2 frame size and windows, TCP read sizes, write
//                                   buffer, server without health/reflection services)
//   BM_TransportAlone, BM_TcpAlone  one side only, for profiling (perf record -g)
// A table at the end lists TCP and gRPC GB/s and the ratio for every paired benchmark.
//
//   transport_bench [--benchmark_filter=BM_Transport/] [--benchmark_min_time=1]
//   transport_bench --tune_malloc=0 ...   TensorServiceImpl leaves glibc malloc alone
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/tensor.grpc.pb.h"
#include "benchmark/benchmark.h"
#include "common/core/check.h"
#include "common/rpc/rpc.h"
#include "common/transport/grpc_transport.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"
#include "common/core/mutex.h"
#include "grpc/grpc.h"
#include "grpcpp/grpcpp.h"

namespace baton {
namespace {

constexpr int64_t kBatchBytes = int64_t{64} << 20;
constexpr uint64_t kJob = 1;

int64_t TensorsPerBatch(int64_t bytes) { return std::max<int64_t>(4, kBatchBytes / bytes); }

Tensor Payload(int64_t bytes) {
  Tensor t = Tensor::Empty({bytes / 4});
  auto* p = static_cast<uint32_t*>(t.raw());
  for (int64_t i = 0; i < bytes / 4; ++i) p[i] = static_cast<uint32_t>(i * 2654435761u);
  return t;
}

// ---------------------------------------------------------------------------------------
// Raw TCP: a socket pair over loopback, a reader thread recv()ing into a tensor-sized buffer.

class TcpMover {
 public:
  explicit TcpMover(int64_t size) : size_(size), src_(Payload(size)) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BATON_CHECK(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    BATON_CHECK(listen(listener_, 1) == 0);
    socklen_t len = sizeof(addr);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    client_ = socket(AF_INET, SOCK_STREAM, 0);
    BATON_CHECK(connect(client_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    server_ = accept(listener_, nullptr, nullptr);
    BATON_CHECK(server_ >= 0);
    reader_ = std::thread([this] { Read(); });
  }
  ~TcpMover() {
    shutdown(client_, SHUT_WR);
    reader_.join();
    close(client_);
    close(server_);
    close(listener_);
  }

  // Moves `count` tensors; returns when the reader has all of them.
  void Batch(int64_t count) {
    const char* p = static_cast<const char*>(src_.raw());
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t left = size_; left > 0;) {
        const ssize_t n = send(client_, p + (size_ - left), static_cast<size_t>(left), 0);
        BATON_CHECK(n > 0);
        left -= n;
      }
    }
    sent_ += count * size_;
    MutexLock lock(mu_);
    cv_.wait(lock.native(), [&] { return received_ >= sent_; });
  }

 private:
  void Read() {
    Tensor dst = Tensor::Empty({size_ / 4});
    char* out = static_cast<char*>(dst.raw());
    int64_t off = 0;
    while (true) {
      const ssize_t n = recv(server_, out + off, static_cast<size_t>(size_ - off), 0);
      if (n <= 0) return;
      off = (off + n) % size_;
      MutexLock lock(mu_);
      received_ += n;
      if (off == 0) cv_.notify_all();
    }
  }

  const int64_t size_;
  const Tensor src_;
  int listener_ = -1, client_ = -1, server_ = -1;
  int64_t sent_ = 0;
  Mutex mu_;
  std::condition_variable cv_;
  int64_t received_ = 0;  // guarded by mu_
  std::thread reader_;
};

// ---------------------------------------------------------------------------------------
// The gRPC transport, with knobs for the breakdown.

struct Setup {
  int64_t chunk_bytes = GrpcTransport::Options().chunk_bytes;
  // A ServerBuilder of our own instead of StartServer: no health or reflection services
  // (whose callback-API threads poll too), and the sync server's pollers capped at this
  // many (0: gRPC's default). Only meaningful in a process that never called StartServer,
  // which turns the health service on for every later server.
  bool plain_server = false;
  int sync_pollers = 0;
  std::vector<std::pair<std::string, int>> client_args;  // on top of MakeTensorChannel's
  std::vector<std::pair<std::string, int>> server_args;  // on top of StartServer's
};

// StartServer (common/rpc), or a server like it with extra channel arguments.
std::unique_ptr<grpc::Server> BenchServer(grpc::Service* service, const Setup& setup,
                                          std::string* address) {
  if (setup.server_args.empty() && !setup.plain_server) {
    ServerOptions so;
    so.services = {service};
    auto server = StartServer(so, address);
    BATON_CHECK_OK(server.status());
    return *std::move(server);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  for (const auto& [k, v] : setup.server_args) builder.AddChannelArgument(k, v);
  if (setup.sync_pollers > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS,
                                setup.sync_pollers);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                setup.sync_pollers);
  }
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  BATON_CHECK(server != nullptr && port != 0);
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

std::shared_ptr<grpc::Channel> BenchChannel(const std::string& address, const Setup& setup) {
  if (setup.client_args.empty()) return MakeTensorChannel(address);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  for (const auto& [k, v] : setup.client_args) args.SetInt(k, v);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

bool g_tune_malloc = true;  // --tune_malloc=0: TensorServiceImpl leaves malloc alone

// Rank 0's GrpcTransport sends to rank 1's TensorServiceImpl; rank 1's GrpcTransport
// receives from its inbox.
class TransportMover {
 public:
  TransportMover(int64_t size, const Setup& setup)
      : size_(size), setup_(setup), src_(Payload(size)) {
    TensorServiceImpl::Options so;
    so.tune_malloc = g_tune_malloc;
    service_ = std::make_unique<TensorServiceImpl>(&inbox_, so);
    inbox_.Open(kJob, TensorsPerBatch(size) * size + (int64_t{16} << 20));
    server_ = BenchServer(service_.get(), setup_, &address_);
    GrpcTransport::Options o;
    o.rank = 0;
    o.job_key = kJob;
    o.peer_addresses = {"", address_};
    o.chunk_bytes = setup_.chunk_bytes;
    o.make_channel = [this](const std::string& a) { return BenchChannel(a, setup_); };
    sender_ = std::make_unique<GrpcTransport>(o, &unused_);
    GrpcTransport::Options r;
    r.rank = 1;
    r.job_key = kJob;
    r.peer_addresses = {"", ""};
    receiver_ = std::make_unique<GrpcTransport>(r, &inbox_);
  }
  ~TransportMover() {
    sender_.reset();
    receiver_.reset();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  void Batch(int64_t count) {
    std::vector<std::unique_ptr<SendWork>> works;
    for (int m = 0; m < count; ++m) {
      works.push_back(
          sender_->Send(1, TensorTag{kJob, step_, m, 0, TensorKind::kActivation}, src_));
    }
    for (int m = 0; m < count; ++m) {
      absl::StatusOr<Tensor> got =
          receiver_->Recv(0, TensorTag{kJob, step_, m, 0, TensorKind::kActivation},
                          absl::Now() + absl::Seconds(60));
      BATON_CHECK_OK(got.status());
      benchmark::DoNotOptimize(got->raw());
    }
    for (auto& w : works) BATON_CHECK_OK(w->Wait(absl::Now() + absl::Seconds(60)));
    ++step_;
  }

 private:
  const int64_t size_;
  const Setup setup_;
  const Tensor src_;
  TensorInbox inbox_;
  TensorInbox unused_;
  std::unique_ptr<TensorServiceImpl> service_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcTransport> sender_;
  std::unique_ptr<GrpcTransport> receiver_;
  int64_t step_ = 0;
};

// ---------------------------------------------------------------------------------------
// The same, with the receiving rank in a process of its own, as workers are: gRPC's
// pollers and executor threads then serve one side each instead of both.

// The child: `transport_bench --receiver=READ_FD,WRITE_FD`. Reports its address, then per
// command (step, count, size) receives `count` tensors and answers with its CPU seconds.
int ReceiverMain(int in, int out) {
  TensorInbox inbox;
  inbox.Open(kJob, int64_t{1} << 30);
  TensorServiceImpl service(&inbox);
  ServerOptions so;
  so.services = {&service};
  std::string address;
  auto server = StartServer(so, &address);
  BATON_CHECK_OK(server.status());
  GrpcTransport::Options r;
  r.rank = 1;
  r.job_key = kJob;
  r.peer_addresses = {"", ""};
  GrpcTransport receiver(r, &inbox);
  char addr[64] = {};
  std::snprintf(addr, sizeof(addr), "%s", address.c_str());
  BATON_CHECK(write(out, addr, sizeof(addr)) == sizeof(addr));
  int64_t cmd[2];
  while (read(in, cmd, sizeof(cmd)) == sizeof(cmd)) {
    for (int64_t m = 0; m < cmd[1]; ++m) {
      absl::StatusOr<Tensor> got = receiver.Recv(
          0, TensorTag{kJob, cmd[0], static_cast<int32_t>(m), 0, TensorKind::kActivation},
          absl::Now() + absl::Seconds(60));
      BATON_CHECK_OK(got.status());
    }
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    const double cpu = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    BATON_CHECK(write(out, &cpu, sizeof(cpu)) == sizeof(cpu));
  }
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

class TwoProcessMover {
 public:
  explicit TwoProcessMover(int64_t size) : src_(Payload(size)) {
    int to_child[2], from_child[2];
    BATON_CHECK(pipe2(to_child, O_CLOEXEC) == 0 && pipe2(from_child, O_CLOEXEC) == 0);
    // The child gets its two ends as fds 100 and 101, and nothing else of ours.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 100);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 101);
    char* argv[] = {const_cast<char*>("/proc/self/exe"), const_cast<char*>("--receiver=100,101"),
                    nullptr};
    BATON_CHECK(posix_spawn(&child_, "/proc/self/exe", &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    to_ = to_child[1];
    from_ = from_child[0];
    char addr[64];
    BATON_CHECK(read(from_, addr, sizeof(addr)) == sizeof(addr));
    GrpcTransport::Options o;
    o.rank = 0;
    o.job_key = kJob;
    o.peer_addresses = {"", addr};
    sender_ = std::make_unique<GrpcTransport>(o, &unused_);
  }
  ~TwoProcessMover() {
    sender_.reset();
    close(to_);
    close(from_);
    waitpid(child_, nullptr, 0);
  }
  void Batch(int64_t count) {
    const int64_t cmd[2] = {step_, count};
    BATON_CHECK(write(to_, cmd, sizeof(cmd)) == sizeof(cmd));
    std::vector<std::unique_ptr<SendWork>> works;
    for (int m = 0; m < count; ++m) {
      works.push_back(
          sender_->Send(1, TensorTag{kJob, step_, m, 0, TensorKind::kActivation}, src_));
    }
    for (auto& w : works) BATON_CHECK_OK(w->Wait(absl::Now() + absl::Seconds(60)));
    BATON_CHECK(read(from_, &child_cpu_, sizeof(child_cpu_)) == sizeof(child_cpu_));
    ++step_;
  }
  double child_cpu() const { return child_cpu_; }

 private:
  const Tensor src_;
  TensorInbox unused_;
  pid_t child_ = -1;
  int to_ = -1, from_ = -1;
  std::unique_ptr<GrpcTransport> sender_;
  int64_t step_ = 0;
  double child_cpu_ = 0;
};

// ---------------------------------------------------------------------------------------
// The straightforward version: the generated stub and service, protobuf bytes chunks.

class ProtoSink final : public baton::v1::TensorService::Service {
 public:
  explicit ProtoSink(int64_t size) : dst_(Tensor::Empty({size / 4})) {}
  grpc::Status Push(grpc::ServerContext*, grpc::ServerReader<baton::v1::TensorFrame>* reader,
                    baton::v1::PushSummary*) override {
    baton::v1::TensorFrame f;
    int64_t off = 0;
    const int64_t size = static_cast<int64_t>(dst_.nbytes());
    while (reader->Read(&f)) {
      if (f.frame_case() != baton::v1::TensorFrame::kChunk) continue;
      const std::string& c = f.chunk();
      std::memcpy(static_cast<char*>(dst_.raw()) + off, c.data(), c.size());
      off = (off + static_cast<int64_t>(c.size())) % size;
      MutexLock lock(mu_);
      received_ += static_cast<int64_t>(c.size());
      if (off == 0) cv_.notify_all();
    }
    return grpc::Status::OK;
  }
  void WaitFor(int64_t bytes) {
    MutexLock lock(mu_);
    cv_.wait(lock.native(), [&] { return received_ >= bytes; });
  }

 private:
  Tensor dst_;
  Mutex mu_;
  std::condition_variable cv_;
  int64_t received_ = 0;
};

class ProtoMover {
 public:
  ProtoMover(int64_t size, int64_t chunk)
      : size_(size), chunk_(std::min(size, chunk)), src_(Payload(size)), sink_(size) {
    server_ = BenchServer(&sink_, Setup(), &address_);
    stub_ = baton::v1::TensorService::NewStub(MakeTensorChannel(address_));
    writer_ = stub_->Push(&ctx_, &summary_);
    header_.mutable_header()->set_byte_length(size);
  }
  ~ProtoMover() {
    writer_->WritesDone();
    BATON_CHECK(writer_->Finish().ok());
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  void Batch(int64_t count) {
    const char* data = static_cast<const char*>(src_.raw());
    for (int64_t m = 0; m < count; ++m) {
      BATON_CHECK(writer_->Write(header_));
      for (int64_t off = 0; off < size_; off += chunk_) {
        frame_.set_chunk(data + off, static_cast<size_t>(std::min(chunk_, size_ - off)));
        BATON_CHECK(writer_->Write(frame_));
      }
    }
    sent_ += count * size_;
    sink_.WaitFor(sent_);
  }

 private:
  const int64_t size_;
  const int64_t chunk_;
  const Tensor src_;
  ProtoSink sink_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<baton::v1::TensorService::Stub> stub_;
  grpc::ClientContext ctx_;
  baton::v1::PushSummary summary_;
  std::unique_ptr<grpc::ClientWriter<baton::v1::TensorFrame>> writer_;
  baton::v1::TensorFrame header_;
  baton::v1::TensorFrame frame_;
  int64_t sent_ = 0;
};

// ---------------------------------------------------------------------------------------
// Each iteration moves one batch over TCP and then one over gRPC, timing each, so that both
// see the same machine (a shared 2-core box is anything but steady). Reported: GB/s of each
// and gRPC / TCP.

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <typename Mover>
double ChildCpu(const Mover& mover) {
  if constexpr (requires { mover.child_cpu(); }) {
    return mover.child_cpu();
  } else {
    return 0.0;
  }
}

template <typename Mover>
void Paired(benchmark::State& state, Mover& mover) {
  const int64_t size = state.range(0);
  const int64_t count = TensorsPerBatch(size);
  TcpMover tcp(size);
  tcp.Batch(count);  // warm up both
  mover.Batch(count);
  double tcp_s = 0, grpc_s = 0, tcp_cpu = 0, grpc_cpu = 0;
  using Clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const double c0 = ProcessCpuSeconds() + ChildCpu(mover);
    const auto t0 = Clock::now();
    tcp.Batch(count);
    const double c1 = ProcessCpuSeconds() + ChildCpu(mover);
    const auto t1 = Clock::now();
    mover.Batch(count);
    const double c2 = ProcessCpuSeconds() + ChildCpu(mover);
    const auto t2 = Clock::now();
    tcp_s += std::chrono::duration<double>(t1 - t0).count();
    grpc_s += std::chrono::duration<double>(t2 - t1).count();
    tcp_cpu += c1 - c0;
    grpc_cpu += c2 - c1;
  }
  const double gb = static_cast<double>(state.iterations() * count * size) / 1e9;
  state.counters["tensor_KiB"] = static_cast<double>(size >> 10);
  state.counters["tcp_GBps"] = gb / tcp_s;
  state.counters["grpc_GBps"] = gb / grpc_s;
  state.counters["vs_tcp_pct"] = 100.0 * tcp_s / grpc_s;
  // CPU seconds (all threads of the process) per GB moved: what a 2-core box runs out of.
  state.counters["tcp_cpu_s_per_GB"] = tcp_cpu / gb;
  state.counters["grpc_cpu_s_per_GB"] = grpc_cpu / gb;
}

// Only the transport (or only TCP), for profiling one of them.
template <typename Mover>
void Alone(benchmark::State& state, Mover& mover) {
  const int64_t count = TensorsPerBatch(state.range(0));
  mover.Batch(count);
  for (auto _ : state) mover.Batch(count);
  state.SetBytesProcessed(state.iterations() * count * state.range(0));
}

void BM_Transport(benchmark::State& state) {
  TransportMover mover(state.range(0), Setup());
  Paired(state, mover);
}

void BM_TransportTwoProcesses(benchmark::State& state) {
  TwoProcessMover mover(state.range(0));
  Paired(state, mover);
}

void BM_ProtoStream(benchmark::State& state) {
  ProtoMover mover(state.range(0), state.range(1) << 10);
  Paired(state, mover);
}

void BM_TransportAlone(benchmark::State& state) {
  TransportMover mover(state.range(0), Setup());
  Alone(state, mover);
}

void BM_TcpAlone(benchmark::State& state) {
  TcpMover mover(state.range(0));
  Alone(state, mover);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t kib : {256, 1024, 4096, 16384}) b->Arg(kib << 10);
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Transport)->Apply(Sizes);
BENCHMARK(BM_TransportTwoProcesses)->Apply(Sizes);
BENCHMARK(BM_TransportAlone)->Apply(Sizes);
BENCHMARK(BM_TcpAlone)->Apply(Sizes);
// Chunk (message) size in KiB as the second argument.
BENCHMARK(BM_ProtoStream)
    ->ArgsProduct({{256 << 10, 1 << 20, 4 << 20, 16 << 20}, {1024}})
    ->ArgsProduct({{4 << 20}, {256, 4096}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The transport with one setting changed, for the breakdown.
void RegisterVariants() {
  struct V {
    std::string name;
    Setup setup;
  };
  std::vector<V> variants;
  for (int64_t kib : {64, 256, 1024, 4096, 16384}) {
    Setup s;
    s.chunk_bytes = kib << 10;
    variants.push_back({absl::StrCat("chunk_", kib, "KiB"), s});
  }
  auto server = [](const char* name, std::vector<std::pair<std::string, int>> args) {
    Setup s;
    s.server_args = std::move(args);
    return V{name, s};
  };
  variants.push_back(server("frame_1MiB", {{GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20}}));
  variants.push_back(server("frame_16MiB", {{GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 24) - 1}}));
  variants.push_back(
      server("no_bdp_window_64MiB",
             {{GRPC_ARG_HTTP2_BDP_PROBE, 0}, {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20}}));
  variants.push_back(
      server("no_bdp_window_8MiB",
             {{GRPC_ARG_HTTP2_BDP_PROBE, 0}, {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20}}));
  {
    V v = server("chunk_4MiB_no_bdp_window_8MiB",
                 {{GRPC_ARG_HTTP2_BDP_PROBE, 0}, {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20}});
    v.setup.chunk_bytes = 4 << 20;
    variants.push_back(v);
  }
  variants.push_back(
      server("no_bdp_window_1MiB",
             {{GRPC_ARG_HTTP2_BDP_PROBE, 0}, {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1 << 20}}));
  variants.push_back(server("tcp_read_256KiB", {{GRPC_ARG_TCP_READ_CHUNK_SIZE, 256 << 10},
                                                {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10},
                                                {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 256 << 10}}));
  variants.push_back(server("tcp_read_4MiB", {{GRPC_ARG_TCP_READ_CHUNK_SIZE, 4 << 20},
                                              {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 4 << 20},
                                              {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 << 20}}));
  {
    Setup s;
    s.client_args = {{GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20}};
    variants.push_back({"write_buffer_8MiB", s});
  }
  {
    Setup s;
    s.plain_server = true;
    variants.push_back({"plain_server", s});
    s.sync_pollers = 1;
    variants.push_back({"plain_server_1_poller", s});
  }
  for (int64_t kib : {1024, 4096}) {
    Setup s;
    s.client_args = {{GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, static_cast<int>(kib << 10)}};
    variants.push_back({absl::StrCat("write_buffer_", kib, "KiB"), s});
  }
  for (const V& v : variants) {
    const Setup setup = v.setup;
    benchmark::RegisterBenchmark(absl::StrCat("BM_Variant/", v.name).c_str(),
                                 [setup](benchmark::State& st) {
                                   TransportMover mover(st.range(0), setup);
                                   Paired(st, mover);
                                 })
        ->Arg(1 << 20)
        ->Arg(4 << 20)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// A summary table at the end: GB/s of TCP and gRPC and their ratio per benchmark.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration && r.aggregate_name != "median") continue;
      if (!r.counters.contains("vs_tcp_pct")) continue;
      rows_.push_back({r.benchmark_name(), r.counters.at("tensor_KiB").value,
                       r.counters.at("tcp_GBps").value, r.counters.at("grpc_GBps").value,
                       r.counters.at("vs_tcp_pct").value});
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-52s %9s %8s %8s %7s\n", "benchmark", "tensor", "TCP", "gRPC", "ratio");
    for (const Row& r : rows_) {
      std::printf("%-52s %5.0f KiB %5.2f GB/s %5.2f GB/s %5.0f%%\n", r.name.c_str(), r.kib, r.tcp,
                  r.grpc, r.pct);
    }
  }

 private:
  struct Row {
    std::string name;
    double kib, tcp, grpc, pct;
  };
  std::vector<Row> rows_;
};

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  if (argc == 2 && std::strncmp(argv[1], "--receiver=", 11) == 0) {
    int in = -1, out = -1;
    BATON_CHECK(std::sscanf(argv[1] + 11, "%d,%d", &in, &out) == 2);
    return baton::ReceiverMain(in, out);
  }
  grpc_init();  // once for the whole run, not per benchmark
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--tune_malloc=0") {
      baton::g_tune_malloc = false;
      argv[i] = argv[--argc];
      --i;
    }
  }
  baton::RegisterVariants();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  baton::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
