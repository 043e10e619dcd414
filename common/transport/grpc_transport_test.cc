// The gRPC tensor transport's own behaviour, with every rank's server, inbox and transport
// in one process: framing, backpressure, refusals, peers that fail. What every transport
// promises is tested in common/pipeline/transport_contract_test.cc.
#include "common/transport/grpc_transport.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/tensor.grpc.pb.h"
#include "common/comm/transport_test_util.h"
#include "common/rpc/rpc.h"
#include "common/transport/frames.h"
#include "common/transport/grpc_transport_test_util.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"
#include "gmock/gmock.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

// Keep gRPC initialised for the whole binary: otherwise the last server of a test going
// away runs grpc_shutdown, which can spend seconds joining gRPC's executor threads before
// the next test initialises it all again.
const bool kGrpcKeptAlive = [] {
  grpc_init();
  return true;
}();

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kJob = 7;

TensorTag Tag(int microbatch, int stage = 0, TensorKind kind = TensorKind::kActivation,
              int64_t step = 0, uint64_t job = kJob) {
  return TensorTag{job, step, microbatch, stage, kind};
}

using transport_test::In;
using transport_test::kHangBound;
using transport_test::kNeverReached;
using transport_test::Pattern;
using transport_test::SameTensor;
using transport_test::WaitUntil;
using Cluster = GrpcTestCluster;


TEST(GrpcTransportTest, RoundTripIsBitExactForEverySize) {
  Cluster c(2);
  GrpcTransport::Options o0 = c.Options(0);
  o0.chunk_bytes = 64 << 10;  // several chunks, and a last one that is not full
  GrpcTransport* t0 = c.Add(o0);
  GrpcTransport* t1 = c.Add(1);
  const std::vector<std::pair<Shape, DType>> cases = {
      {{0}, DType::kFloat32},         // 0 bytes
      {{1}, DType::kFloat32},         // one element
      {{3, 0, 5}, DType::kInt32},     // 0 bytes, with a shape
      {{3, 33331}, DType::kFloat32},  // not a multiple of the chunk size
      {{5, 7}, DType::kInt32},       {{2 << 20}, DType::kFloat32},  // 8 MiB
      {{1024, 1024}, DType::kInt32},                                // 4 MiB: exactly 64 chunks
  };
  int64_t bytes = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Tensor sent = Pattern(cases[i].first, cases[i].second, static_cast<uint32_t>(i));
    bytes += static_cast<int64_t>(sent.nbytes());
    std::unique_ptr<SendWork> w = t0->Send(1, Tag(static_cast<int>(i)), sent);
    absl::StatusOr<Tensor> got = t1->Recv(0, Tag(static_cast<int>(i)), In(absl::Seconds(20)));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameTensor(sent, *got))
        << "case " << i << " " << sent.DebugString() << " vs " << got->DebugString();
    if (sent.nbytes() > 0) {
      EXPECT_NE(got->raw(), sent.raw());
    }
    ASSERT_TRUE(w->Wait(In(absl::Seconds(20))).ok());
    EXPECT_TRUE(w->IsCompleted());
  }
  EXPECT_EQ(t0->Counters(1).tensors_sent, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(t0->Counters(1).bytes_sent, bytes);
  EXPECT_EQ(t1->Counters(0).tensors_received, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(t1->Counters(0).bytes_received, bytes);
  EXPECT_EQ(c.node(1).inbox.Stats().tensors_filed, 0);
  EXPECT_EQ(c.node(1).inbox.Stats().bytes_in_use, 0);
}

TEST(GrpcTransportTest, ThreeRanksBothDirectionsAnyOrder) {
  Cluster c(3);
  std::vector<GrpcTransport*> t = {c.Add(0), c.Add(1), c.Add(2)};
  std::vector<std::unique_ptr<SendWork>> works;
  // Every rank sends 3 tensors to every other rank.
  for (int src = 0; src < 3; ++src) {
    for (int dst = 0; dst < 3; ++dst) {
      if (src == dst) continue;
      for (int m = 0; m < 3; ++m) {
        works.push_back(t[src]->Send(
            dst, Tag(m, src), Pattern({100 + m, 17}, DType::kFloat32, src * 100 + dst * 10 + m)));
      }
    }
  }
  // ... and takes them in reverse order.
  for (int dst = 0; dst < 3; ++dst) {
    for (int src = 2; src >= 0; --src) {
      if (src == dst) continue;
      for (int m = 2; m >= 0; --m) {
        absl::StatusOr<Tensor> got = t[dst]->Recv(src, Tag(m, src), In(absl::Seconds(20)));
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(
            SameTensor(*got, Pattern({100 + m, 17}, DType::kFloat32, src * 100 + dst * 10 + m)));
      }
    }
  }
  for (auto& w : works) EXPECT_TRUE(w->Wait(In(absl::Seconds(20))).ok());
}

TEST(GrpcTransportTest, BackpressureBoundsTheInbox) {
  constexpr int64_t kTensor = 512 << 10;  // bytes
  constexpr int64_t kCapacity = 1 << 20;  // two tensors
  Cluster c(2, kCapacity);
  GrpcTransport::Options o0 = c.Options(0);
  o0.chunk_bytes = 64 << 10;
  GrpcTransport* t0 = c.Add(o0);
  GrpcTransport* t1 = c.Add(1);
  constexpr int kCount = 48;  // 24 MiB: more than gRPC and the sockets buffer (~7 MiB)
  std::vector<std::unique_ptr<SendWork>> works;
  for (int m = 0; m < kCount; ++m) {
    works.push_back(t0->Send(1, Tag(m), Pattern({kTensor / 4}, DType::kFloat32, m)));
  }
  // Nobody receives yet: the inbox fills up to its capacity and the rest waits upstream,
  // the next delivery blocked for room.
  ASSERT_TRUE(WaitUntil([&] { return c.node(1).inbox.Stats().deliveries_waiting >= 1; }));
  TensorInboxStats s = c.node(1).inbox.Stats();
  EXPECT_LE(s.bytes_in_use, kCapacity + kTensor);
  EXPECT_GE(s.tensors_filed, 1);
  EXPECT_LT(s.tensors_filed, kCount);
  EXPECT_FALSE(works.back()->IsCompleted()) << "the last send completed with the inbox full";
  // Receiving lets the rest through, in order, nothing lost.
  for (int m = 0; m < kCount; ++m) {
    absl::StatusOr<Tensor> got = t1->Recv(0, Tag(m), In(absl::Seconds(20)));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameTensor(*got, Pattern({kTensor / 4}, DType::kFloat32, m))) << m;
  }
  for (auto& w : works) EXPECT_TRUE(w->Wait(In(absl::Seconds(20))).ok());
  s = c.node(1).inbox.Stats();
  EXPECT_LE(s.peak_bytes_in_use, kCapacity + kTensor);
  EXPECT_GT(s.delivery_waits, 0);
  EXPECT_EQ(s.bytes_in_use, 0);
}

TEST(GrpcTransportTest, TensorLargerThanTheCapacityStillPasses) {
  Cluster c(2, /*capacity=*/64 << 10);
  GrpcTransport* t0 = c.Add(0);
  GrpcTransport* t1 = c.Add(1);
  const Tensor big = Pattern({1 << 20}, DType::kFloat32, 1);  // 4 MiB
  auto w = t0->Send(1, Tag(0), big);
  absl::StatusOr<Tensor> got = t1->Recv(0, Tag(0), In(absl::Seconds(20)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameTensor(big, *got));
  EXPECT_TRUE(w->Wait(In(absl::Seconds(20))).ok());
}

// Drives the service with hand-made frames, through the generated (protobuf) stub: this
// also checks that the raw-frame service reads what any protobuf sender writes.
class RawPush {
 public:
  explicit RawPush(const std::string& address)
      : stub_(baton::v1::TensorService::NewStub(MakeChannel(address))) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    writer_ = stub_->Push(&ctx_, &summary_);
  }
  RawPush& Header(int source_rank, const TensorTag& tag, baton::v1::DType dtype,
                  std::vector<int64_t> shape, int64_t byte_length,
                  const std::string& payload = "") {
    baton::v1::TensorFrame f;
    baton::v1::TensorHeader* h = f.mutable_header();
    h->set_job_key(tag.job);
    h->set_step(tag.step);
    h->set_microbatch(tag.microbatch);
    h->set_stage(tag.stage);
    h->set_kind(transport_internal::ToProtoKind(tag.kind));
    h->set_dtype(dtype);
    for (int64_t d : shape) h->add_shape(d);
    h->set_byte_length(byte_length);
    h->set_source_rank(source_rank);
    h->set_payload(payload);
    writer_->Write(f);
    return *this;
  }
  RawPush& Chunk(const std::string& bytes) {
    baton::v1::TensorFrame f;
    f.set_chunk(bytes);
    writer_->Write(f);
    return *this;
  }
  grpc::Status Finish() {
    writer_->WritesDone();
    return writer_->Finish();
  }
  const baton::v1::PushSummary& summary() const { return summary_; }

 private:
  std::unique_ptr<baton::v1::TensorService::Stub> stub_;
  grpc::ClientContext ctx_;
  baton::v1::PushSummary summary_;
  std::unique_ptr<grpc::ClientWriter<baton::v1::TensorFrame>> writer_;
};

TEST(TensorServiceTest, ProtobufFramesAreAccepted) {
  Cluster c(1);
  std::string bytes(16, '\0');
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<char>(i * 7);
  grpc::Status s = RawPush(c.node(0).address)
                       .Header(3, Tag(1), baton::v1::DTYPE_INT32, {2, 2}, 16)
                       .Chunk(bytes.substr(0, 5))
                       .Chunk("")
                       .Chunk(bytes.substr(5))
                       .Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  absl::StatusOr<Tensor> got = c.node(0).inbox.Take(3, Tag(1), In(kHangBound));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->dtype(), DType::kInt32);
  EXPECT_EQ(got->shape(), (Shape{2, 2}));
  EXPECT_EQ(std::memcmp(got->raw(), bytes.data(), 16), 0);
}

TEST(TensorServiceTest, ProtobufHeaderWithPayloadIsAccepted) {
  Cluster c(1);
  std::string bytes(24, '\0');
  for (int i = 0; i < 24; ++i) bytes[i] = static_cast<char>(200 - i);
  grpc::Status s = RawPush(c.node(0).address)
                       .Header(3, Tag(1), baton::v1::DTYPE_FLOAT32, {6}, 24, bytes.substr(0, 10))
                       .Chunk(bytes.substr(10))
                       .Header(3, Tag(2), baton::v1::DTYPE_FLOAT32, {6}, 24, bytes)
                       .Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (int m : {1, 2}) {
    absl::StatusOr<Tensor> got = c.node(0).inbox.Take(3, Tag(m), In(kHangBound));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::memcmp(got->raw(), bytes.data(), 24), 0) << m;
  }
}

TEST(TensorServiceTest, MalformedStreamsAreRefusedNamingRankAndTag) {
  Cluster c(1);
  const std::string tag = Tag(4, 2, TensorKind::kGradient).ToString();
  auto push = [&] { return RawPush(c.node(0).address); };
  struct Case {
    std::string name;
    grpc::Status status;
    std::string expect;
  };
  std::vector<Case> cases;
  {
    RawPush p = push();
    cases.push_back(
        {"wrong size",
         p.Header(3, Tag(4, 2, TensorKind::kGradient), baton::v1::DTYPE_FLOAT32, {4}, 12).Finish(),
         "is 16 bytes but the header says 12"});
  }
  {
    RawPush p = push();
    cases.push_back(
        {"too many bytes",
         p.Header(3, Tag(4, 2, TensorKind::kGradient), baton::v1::DTYPE_FLOAT32, {4}, 16)
             .Chunk(std::string(10, 'a'))
             .Chunk(std::string(10, 'b'))
             .Finish(),
         "more than the header's 16 bytes"});
  }
  {
    RawPush p = push();
    cases.push_back(
        {"too few bytes",
         p.Header(3, Tag(4, 2, TensorKind::kGradient), baton::v1::DTYPE_FLOAT32, {4}, 16)
             .Chunk(std::string(8, 'a'))
             .Finish(),
         "ended after 8 of 16 bytes"});
  }
  {
    RawPush p = push();
    cases.push_back({"header payload too long",
                     p.Header(3, Tag(4, 2, TensorKind::kGradient), baton::v1::DTYPE_FLOAT32, {4},
                              16, std::string(20, 'x'))
                         .Finish(),
                     "carries 20 payload bytes, more than its byte_length 16"});
  }
  {
    RawPush p = push();
    cases.push_back(
        {"unknown dtype",
         p.Header(3, Tag(4, 2, TensorKind::kGradient), baton::v1::DType(9), {4}, 16).Finish(),
         "unknown dtype 9"});
  }
  {
    RawPush p = push();
    cases.push_back(
        {"header inside a tensor",
         p.Header(3, Tag(4, 2, TensorKind::kGradient), baton::v1::DTYPE_FLOAT32, {4}, 16)
             .Chunk(std::string(4, 'a'))
             .Header(3, Tag(5, 2), baton::v1::DTYPE_FLOAT32, {1}, 4)
             .Finish(),
         "came after 4 of 16 bytes"});
  }
  for (const Case& k : cases) {
    EXPECT_EQ(k.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.name;
    EXPECT_THAT(k.status.error_message(),
                AllOf(HasSubstr("from rank 3"), HasSubstr(tag), HasSubstr(k.expect)))
        << k.name;
  }
  {
    grpc::Status s = push().Chunk("abc").Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("without a tensor header"));
  }
  EXPECT_EQ(c.node(0).inbox.Stats().tensors_filed, 0);
  EXPECT_EQ(c.node(0).inbox.Stats().bytes_in_use, 0);  // reservations were released
}

TEST(TensorServiceTest, TagOfAnotherJobIsRefused) {
  Cluster c(1);
  const TensorTag other = Tag(0, 1, TensorKind::kActivation, 0, /*job=*/99);
  grpc::Status s = RawPush(c.node(0).address)
                       .Header(2, other, baton::v1::DTYPE_FLOAT32, {1}, 4)
                       .Chunk("abcd")
                       .Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("unexpected tag"), HasSubstr(other.ToString()),
                                       HasSubstr("from rank 2"), HasSubstr("the key is wrong"),
                                       Not(HasSubstr("99"))));
}

// With the right key (a leaked one, or an insider's), a stream claiming a rank outside the
// plan, or a tensor the plan has no rank send, is refused before anything is allocated:
// twelve 16 MiB headers from made-up ranks take no room in the inbox.
TEST(TensorServiceTest, MadeUpRanksAreRefusedEvenWithTheRightKey) {
  Cluster c(1);
  InboxPlan plan;  // rank 1 of 2: stage 0's activations from rank 0
  plan.job_key = kJob;
  plan.capacity_bytes = 64 << 20;
  plan.num_ranks = 2;
  plan.sources = {{0, 0, TensorKind::kActivation}};
  c.node(0).inbox.Open(plan);
  for (int rank : {7, -1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12}) {
    grpc::Status s = RawPush(c.node(0).address)
                         .Header(rank, Tag(0), baton::v1::DTYPE_FLOAT32, {4 << 20}, 16 << 20)
                         .Chunk("abcd")
                         .Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << rank << ": "
                                                                   << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("not a rank of this job"));
  }
  // Rank 0 exists, but sends this rank no gradients.
  grpc::Status g = RawPush(c.node(0).address)
                       .Header(0, Tag(0, 0, TensorKind::kGradient), baton::v1::DTYPE_FLOAT32,
                               {1}, 4)
                       .Chunk("abcd")
                       .Finish();
  EXPECT_EQ(g.error_code(), grpc::StatusCode::PERMISSION_DENIED) << g.error_message();
  EXPECT_EQ(c.node(0).inbox.Stats().peak_bytes_in_use, 0);
  // The planned tensor still gets in.
  EXPECT_TRUE(RawPush(c.node(0).address)
                  .Header(0, Tag(0), baton::v1::DTYPE_FLOAT32, {1}, 4)
                  .Chunk("abcd")
                  .Finish()
                  .ok());
}

TEST(TensorServiceTest, DuplicateTagIsRefused) {
  Cluster c(1);
  auto once = [&] {
    return RawPush(c.node(0).address)
        .Header(2, Tag(0), baton::v1::DTYPE_FLOAT32, {1}, 4)
        .Chunk("abcd")
        .Finish();
  };
  ASSERT_TRUE(once().ok());
  grpc::Status s = once();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("duplicate"), HasSubstr(Tag(0).ToString()),
                                       HasSubstr("from rank 2")));
}

TEST(GrpcTransportTest, SendToAJobTheReceiverDoesNotRunFailsTheJobNamingPeer) {
  Cluster c(2);
  GrpcTransport::Options o = c.Options(0);
  o.job_key = 99;
  GrpcTransport* t0 = c.Add(o);
  const TensorTag tag = Tag(0, 0, TensorKind::kActivation, 0, 99);
  // The receiver refuses the tensor. Whether the refusal comes back before the tensor
  // left (the send fails) or after (the stream's end is noticed and the transport aborts),
  // the sender's job fails with the receiver's reason.
  absl::Status s = t0->Send(1, tag, Pattern({4}, DType::kFloat32, 0))->Wait(In(absl::Seconds(20)));
  const absl::Time until = In(kHangBound);
  for (int m = 1; s.ok() && absl::Now() < until; ++m) {  // `until` only bounds a hang
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = t0->Send(1, Tag(m, 0, TensorKind::kActivation, 0, 99), Pattern({4}, DType::kFloat32, 0))
            ->Wait(In(absl::Seconds(20)));
  }
  EXPECT_THAT(s.code(),
              ::testing::AnyOf(absl::StatusCode::kFailedPrecondition, absl::StatusCode::kAborted))
      << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("to rank 1 at " + c.addresses()[1]), HasSubstr("unexpected tag"),
                    HasSubstr(tag.ToString())));
  // The transport refuses a tag of another job itself.
  GrpcTransport* t1 = c.Add(1);
  s = t1->Send(0, Tag(0, 0, TensorKind::kActivation, 0, 98), Pattern({4}, DType::kFloat32, 0))
          ->Wait(In(kHangBound));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(GrpcTransportTest, PeerThatVanishesFailsTheJobNamingIt) {
  // Rank 1's worker (server) goes away after a tensor went through: rank 0 notices at
  // once (not at a receive deadline), and every pending receive fails naming rank 1.
  auto node = std::make_unique<Node>();
  node->inbox.Open(kJob, 1 << 20);
  node->service = std::make_unique<TensorServiceImpl>(&node->inbox);
  ServerOptions so;
  so.services = {node->service.get()};
  auto server = StartServer(so, &node->address);
  ASSERT_TRUE(server.ok()) << server.status();
  Cluster c(1);
  GrpcTransport::Options o = c.Options(0);
  o.peer_addresses.push_back(node->address);
  GrpcTransport* t0 = c.Add(o);
  ASSERT_TRUE(
      t0->Send(1, Tag(0), Pattern({16}, DType::kFloat32, 0))->Wait(In(absl::Seconds(20))).ok());
  ASSERT_TRUE(node->inbox.Take(0, Tag(0), In(absl::Seconds(20))).ok());
  // Ended by the abort, never by this deadline (that would be DEADLINE_EXCEEDED).
  auto pending = std::async(std::launch::async, [&] {
    return t0->Recv(1, Tag(0, 1, TensorKind::kGradient), In(kNeverReached));
  });
  ASSERT_TRUE(WaitUntil([&] { return c.node(0).inbox.Stats().takes_waiting >= 1; }));
  (*server)->Shutdown(std::chrono::system_clock::now());  // cancels the open stream
  absl::StatusOr<Tensor> got = pending.get();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted) << got.status();
  EXPECT_THAT(std::string(got.status().message()),
              AllOf(HasSubstr("rank 0 aborted"), HasSubstr("to rank 1 at " + node->address),
                    HasSubstr(Tag(0).ToString())));
  c.Drop(t0);
}

int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);  // nothing listens there now
  return ntohs(addr.sin_port);
}

TEST(GrpcTransportTest, PeerThatIsDownFailsWithinTheSendTimeout) {
  Cluster c(1);
  const std::string dead = absl::StrCat("127.0.0.1:", UnusedPort());
  GrpcTransport::Options o = c.Options(0);
  o.peer_addresses.push_back(dead);
  o.send_timeout = absl::Seconds(1);
  GrpcTransport* t0 = c.Add(o);
  const absl::Time start = absl::Now();
  // It fails at the send timeout, not at the wait's deadline.
  absl::Status s =
      t0->Send(1, Tag(2), Pattern({8}, DType::kFloat32, 0))->Wait(In(kNeverReached));
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(s.ok());
  EXPECT_GE(took, absl::Milliseconds(900));  // it waited for the peer to come up
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("rank 0: sending " + Tag(2).ToString() + " to rank 1 at " + dead),
                    Not(HasSubstr("the wait's deadline"))));
  // Later sends to that peer fail at once with the same reason.
  const absl::Status again =
      t0->Send(1, Tag(3), Pattern({8}, DType::kFloat32, 0))->Wait(In(kNeverReached));
  EXPECT_EQ(again, s);
}

TEST(GrpcTransportTest, PeerThatStartsLateIsWaitedFor) {
  // Rank 1's server comes up 300 ms after rank 0 sends to it.
  const int port = UnusedPort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  Cluster c(1);
  GrpcTransport::Options o = c.Options(0);
  o.peer_addresses.push_back(address);
  o.send_timeout = absl::Seconds(20);
  GrpcTransport* t0 = c.Add(o);
  auto w = t0->Send(1, Tag(0), Pattern({1000}, DType::kFloat32, 5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  TensorInbox inbox;
  inbox.Open(kJob, 1 << 20);
  TensorServiceImpl service(&inbox);
  ServerOptions so;
  so.address = address;
  so.services = {&service};
  std::string bound;
  auto server = StartServer(so, &bound);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<Tensor> got = inbox.Take(0, Tag(0), In(absl::Seconds(20)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameTensor(*got, Pattern({1000}, DType::kFloat32, 5)));
  EXPECT_TRUE(w->Wait(In(absl::Seconds(20))).ok());
  c.Drop(t0);
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

TEST(GrpcTransportTest, AbortWakesBlockedReceivesHereAndOnThePeer) {
  Cluster c(2);
  GrpcTransport* t0 = c.Add(0);
  GrpcTransport* t1 = c.Add(1);
  // Rank 0 has a stream open to rank 1 already.
  auto w = t0->Send(1, Tag(0), Pattern({10}, DType::kFloat32, 0));
  ASSERT_TRUE(w->Wait(In(absl::Seconds(20))).ok());
  // Both end by the abort, never by these deadlines (that would be DEADLINE_EXCEEDED).
  auto here = std::async(std::launch::async, [&] {
    return t0->Recv(1, Tag(0, 1, TensorKind::kGradient), In(kNeverReached));
  });
  auto there =
      std::async(std::launch::async, [&] { return t1->Recv(0, Tag(1), In(kNeverReached)); });
  // Both receives are blocked before the abort.
  ASSERT_TRUE(WaitUntil([&] {
    return c.node(0).inbox.Stats().takes_waiting >= 1 &&
           c.node(1).inbox.Stats().takes_waiting >= 1;
  }));
  t0->Abort(absl::InternalError("stage 0 blew up"));
  absl::StatusOr<Tensor> a = here.get();
  absl::StatusOr<Tensor> b = there.get();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("rank 0 aborted: stage 0 blew up"));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("rank 0 aborted: stage 0 blew up"));
  // Later operations fail with the reason too.
  absl::Status s =
      t0->Send(1, Tag(5), Pattern({1}, DType::kFloat32, 0))->Wait(In(kHangBound));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
}

// Neither the abort nor the destructor waits for the send or shutdown timeouts (set here
// beyond any test's life): the send ends ABORTED, and Drop returns.
TEST(GrpcTransportTest, AbortFailsAPendingSendBlockedByBackpressure) {
  Cluster c(2, /*capacity=*/64 << 10);
  GrpcTransport::Options o = c.Options(0);
  o.chunk_bytes = 16 << 10;
  o.send_timeout = kNeverReached;
  o.shutdown_timeout = kNeverReached;
  GrpcTransport* t0 = c.Add(o);
  std::vector<std::unique_ptr<SendWork>> works;
  for (int m = 0; m < 16; ++m)
    works.push_back(t0->Send(1, Tag(m), Pattern({256 << 10}, DType::kFloat32, m)));
  // The inbox took the first tensor; the second waits for room.
  ASSERT_TRUE(WaitUntil([&] { return c.node(1).inbox.Stats().deliveries_waiting >= 1; }));
  EXPECT_FALSE(works.back()->IsCompleted());
  t0->Abort(absl::CancelledError("stop"));
  absl::Status s = works.back()->Wait(In(kNeverReached));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  c.Drop(t0);  // and the destructor does not hang on the stuck stream
}

// Shutdown gives a stuck send shutdown_timeout to leave, then cancels it: it does not wait
// for the send timeout (set here beyond any test's life).
TEST(GrpcTransportTest, ShutdownWithStreamsOpenAndAStuckSendDoesNotHang) {
  Cluster c(2, /*capacity=*/64 << 10);
  GrpcTransport::Options o = c.Options(0);
  o.shutdown_timeout = absl::Seconds(1);
  o.send_timeout = kNeverReached;
  GrpcTransport* t0 = c.Add(o);
  GrpcTransport* t1 = c.Add(1);
  // A stream from 1 to 0 that is idle, and from 0 to 1 one that is stuck: rank 1 never
  // receives, its inbox is full.
  ASSERT_TRUE(
      t1->Send(0, Tag(0, 1), Pattern({4}, DType::kFloat32, 0))->Wait(In(absl::Seconds(20))).ok());
  std::vector<std::unique_ptr<SendWork>> works;
  for (int m = 0; m < 8; ++m)
    works.push_back(t0->Send(1, Tag(m), Pattern({1 << 20}, DType::kFloat32, m)));
  // The first tensor is in rank 1's inbox, the second waits there for room: stuck.
  ASSERT_TRUE(WaitUntil([&] { return c.node(1).inbox.Stats().deliveries_waiting >= 1; }));
  c.Drop(t0);
  c.Drop(t1);
  absl::Status last = works.back()->Wait(In(kHangBound));
  EXPECT_FALSE(last.ok());
  EXPECT_THAT(std::string(last.message()), HasSubstr("the transport shut down")) << last;
}

TEST(GrpcTransportTest, SendTimeoutCancelsAStuckStream) {
  Cluster c(2, /*capacity=*/64 << 10);
  GrpcTransport::Options o = c.Options(0);
  o.send_timeout = absl::Milliseconds(500);
  GrpcTransport* t0 = c.Add(o);
  std::vector<std::unique_ptr<SendWork>> works;
  for (int m = 0; m < 8; ++m)
    works.push_back(t0->Send(1, Tag(m), Pattern({1 << 20}, DType::kFloat32, m)));
  // It fails at the send timeout, not at the wait's deadline.
  absl::Status s = works.back()->Wait(In(kNeverReached));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("to rank 1 at " + c.addresses()[1]), HasSubstr("send timeout")));
  // The peer stays failed: later sends fail at once.
  s = t0->Send(1, Tag(100), Pattern({1}, DType::kFloat32, 0))->Wait(In(kNeverReached));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("send timeout"));
}

TEST(TensorInboxTest, RefusesWhenClosedAndAfterAbort) {
  TensorInbox inbox;
  absl::Status s = inbox.Deliver(0, Tag(0), Pattern({1}, DType::kFloat32, 0), In(kHangBound));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("from rank 0"));
  inbox.Open(kJob, 1 << 20);
  ASSERT_TRUE(inbox.Deliver(0, Tag(0), Pattern({1}, DType::kFloat32, 0)).ok());
  s = inbox.Deliver(0, Tag(0), Pattern({1}, DType::kFloat32, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  inbox.Abort(absl::AbortedError("rank 3 aborted: boom"));
  EXPECT_EQ(inbox.Take(0, Tag(0), In(kHangBound)).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(inbox.Deliver(0, Tag(1), Pattern({1}, DType::kFloat32, 0)).code(),
            absl::StatusCode::kAborted);
  // A new job starts clean.
  inbox.Open(kJob + 1, 1 << 20);
  TensorTag t = Tag(0);
  t.job = kJob + 1;
  ASSERT_TRUE(inbox.Deliver(0, t, Pattern({1}, DType::kFloat32, 0)).ok());
  EXPECT_TRUE(inbox.Take(0, t, In(kHangBound)).ok());
  inbox.Close();
  EXPECT_EQ(inbox.Take(0, t, In(kHangBound)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TensorInboxTest, SendersAndAbortNoticesAreCheckedAgainstThePlansIdentities) {
  TensorInbox inbox;
  inbox.Open(kJob, 1 << 20, {"baton-worker-0", "baton-worker-1", ""});
  EXPECT_TRUE(inbox.CheckSender(0, Tag(0), "baton-worker-0").ok());
  EXPECT_TRUE(inbox.CheckSender(1, Tag(0), "baton-worker-1").ok());
  EXPECT_TRUE(inbox.CheckSender(2, Tag(0), "anyone").ok());  // no identity known for rank 2
  absl::Status s = inbox.CheckSender(1, Tag(0), "baton-worker-0");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 of this job is baton-worker-1, not baton-worker-0"));
  EXPECT_EQ(inbox.CheckSender(0, Tag(0), "").code(), absl::StatusCode::kPermissionDenied);
  // Made-up ranks are not a way around the identities.
  EXPECT_EQ(inbox.CheckSender(3, Tag(0), "anyone").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(inbox.CheckSender(7, Tag(0), "anyone").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(inbox.CheckSender(-1, Tag(0), "anyone").code(), absl::StatusCode::kPermissionDenied);
  // An abort notice from a stranger does not stop the job; one from a peer does.
  EXPECT_FALSE(inbox.AbortJob(kJob, absl::AbortedError("forged"), "intruder"));
  ASSERT_TRUE(inbox.Deliver(0, Tag(0), Pattern({1}, DType::kFloat32, 0)).ok());
  EXPECT_TRUE(inbox.Take(0, Tag(0), In(kHangBound)).ok());
  EXPECT_TRUE(inbox.AbortJob(kJob, absl::AbortedError("rank 1 failed"), "baton-worker-1"));
  EXPECT_EQ(inbox.Take(0, Tag(1), In(kHangBound)).status().code(),
            absl::StatusCode::kAborted);
  // Without identities (no mutual TLS) the job key alone decides, as before.
  inbox.Open(kJob, 1 << 20);
  EXPECT_TRUE(inbox.CheckSender(1, Tag(0), "").ok());
  EXPECT_TRUE(inbox.AbortJob(kJob, absl::AbortedError("x"), ""));
}

// The job key guards a plaintext cluster's streams: no refusal names it (nor a guess).
TEST(TensorInboxTest, RefusalsNeverNameAJobKey) {
  constexpr uint64_t kSecret = 0x5eed5eed5eed5eedULL;
  constexpr uint64_t kGuess = 0x0badc0ffee0badULL;
  const std::string secret = absl::StrCat(kSecret), guess = absl::StrCat(kGuess);
  TensorInbox inbox;
  inbox.Open(kSecret, 1 << 20, {"", ""});
  const TensorTag wrong = Tag(0, 0, TensorKind::kActivation, 0, kGuess);
  const TensorTag right = Tag(0, 0, TensorKind::kActivation, 0, kSecret);
  std::vector<absl::Status> refusals = {
      inbox.CheckSender(0, wrong, ""),
      inbox.Deliver(0, wrong, Tensor::Zeros({1})),
      inbox.Take(0, wrong, In(absl::Milliseconds(1))).status(),
      inbox.CheckSender(5, right, ""),
  };
  ASSERT_TRUE(inbox.Deliver(0, right, Tensor::Zeros({1})).ok());
  refusals.push_back(inbox.Deliver(0, right, Tensor::Zeros({1})));  // a duplicate
  refusals.push_back(inbox.Take(1, right, In(absl::Milliseconds(1))).status());
  for (const absl::Status& s : refusals) {
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr(secret))) << s;
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr(guess))) << s;
  }
  EXPECT_EQ(refusals[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refusals[0].message()), HasSubstr("the key is wrong"));
}

// A rank's plan names every tensor it receives: the rank that sends it, its stage and kind.
// Anything else is refused, from any sender, before it takes room in the inbox.
TEST(TensorInboxTest, OnlyThePlansSourcesAreAccepted) {
  TensorInbox inbox;
  InboxPlan plan;  // rank 1 of 3: stage 0's activations from rank 0, stage 2's gradients from 2
  plan.job_key = kJob;
  plan.capacity_bytes = 1 << 20;
  plan.num_ranks = 3;
  plan.sources = {{0, 0, TensorKind::kActivation}, {2, 2, TensorKind::kGradient}};
  inbox.Open(plan);
  EXPECT_TRUE(inbox.CheckSender(0, Tag(3, 0, TensorKind::kActivation, 5), "").ok());
  EXPECT_TRUE(inbox.CheckSender(2, Tag(3, 2, TensorKind::kGradient, 5), "").ok());
  for (const auto& [rank, tag] : std::vector<std::pair<int, TensorTag>>{
           {7, Tag(0)},                                  // outside the plan
           {-1, Tag(0)},                                 // outside the plan
           {3, Tag(0)},                                  // one past the last rank
           {0, Tag(0, 0, TensorKind::kGradient)},        // rank 0 sends rank 1 no gradients
           {2, Tag(0, 2, TensorKind::kActivation)},      // nor rank 2 activations
           {0, Tag(0, 1, TensorKind::kActivation)},      // another stage
       }) {
    EXPECT_EQ(inbox.CheckSender(rank, tag, "").code(), absl::StatusCode::kPermissionDenied)
        << rank << " " << tag.ToString();
    EXPECT_EQ(inbox.Deliver(rank, tag, Tensor::Zeros({1})).code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(inbox.Stats().bytes_in_use, 0);
}

// The cap holds for the whole inbox: made-up sources are refused, so only the plan's
// sources get the one-tensor exception, and memory stays within capacity + one tensor per
// source of the plan however many senders try.
TEST(TensorInboxTest, TheCapHoldsForTheWholeInboxWhoeverSends) {
  TensorInbox inbox;
  InboxPlan plan;
  plan.job_key = kJob;
  plan.capacity_bytes = 1000;
  plan.num_ranks = 4;
  plan.sources = {{0, 0, TensorKind::kActivation}, {2, 2, TensorKind::kGradient}};
  inbox.Open(plan);
  for (int rank = 4; rank < 16; ++rank) {  // twelve made-up senders
    EXPECT_EQ(inbox.Reserve(rank, Tag(rank), 800, In(absl::Milliseconds(1))).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  ASSERT_TRUE(inbox.Deliver(0, Tag(0), Tensor::Zeros({200})).ok());  // 800 of 1000 bytes
  // The plan's other source has nothing in: admitted past the capacity (no deadlock).
  ASSERT_TRUE(inbox.Deliver(2, Tag(0, 2, TensorKind::kGradient), Tensor::Zeros({200})).ok());
  // A second tensor from either waits, and gives up at its deadline.
  EXPECT_EQ(inbox.Reserve(0, Tag(1), 800, In(absl::Milliseconds(20))).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(inbox.Reserve(2, Tag(1, 2, TensorKind::kGradient), 800, In(absl::Milliseconds(20)))
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(inbox.Stats().peak_bytes_in_use, 1600);  // capacity + one tensor per source at most
}

TEST(TensorInboxTest, DeliveryWaitsForSpaceAndCloseWakesIt) {
  TensorInbox inbox;
  inbox.Open(kJob, 1000);
  ASSERT_TRUE(inbox.Deliver(0, Tag(0), Tensor::Zeros({200})).ok());  // 800 bytes
  // A second tensor from the same source does not fit beside it: it waits...
  auto pending = std::async(std::launch::async, [&] {
    return inbox.Deliver(0, Tag(1), Tensor::Zeros({100}), In(kNeverReached));
  });
  ASSERT_TRUE(WaitUntil([&] { return inbox.Stats().deliveries_waiting == 1; }));
  EXPECT_EQ(pending.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  // ... while one from a source with nothing in is admitted even over capacity (so that
  // the tensor a receiver waits for from another peer can never be blocked) ...
  ASSERT_TRUE(inbox.Deliver(1, Tag(0, 1), Tensor::Zeros({100}), In(kHangBound)).ok());
  EXPECT_EQ(inbox.Stats().bytes_in_use, 1200);
  // ... and the first one gets in once the inbox has room again.
  ASSERT_TRUE(inbox.Take(0, Tag(0), In(kHangBound)).ok());
  EXPECT_TRUE(pending.get().ok());
  EXPECT_EQ(inbox.Stats().delivery_waits, 1);
  // Over capacity until the deadline: RESOURCE_EXHAUSTED naming the tag.
  absl::Status s = inbox.Deliver(0, Tag(2), Tensor::Zeros({200}), In(absl::Milliseconds(100)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(Tag(2).ToString()), HasSubstr("from rank 0")));
  // Close wakes a waiting delivery.
  auto closing = std::async(std::launch::async, [&] {
    return inbox.Deliver(0, Tag(3), Tensor::Zeros({200}), In(kNeverReached));
  });
  ASSERT_TRUE(WaitUntil([&] { return inbox.Stats().deliveries_waiting == 1; }));
  inbox.Close();
  EXPECT_EQ(closing.get().code(), absl::StatusCode::kFailedPrecondition);
}

// Frames built from slices parse back at the payload's place, whatever the slicing.
TEST(FramesTest, HeaderAndChunkFramesRoundTrip) {
  using namespace transport_internal;
  const Tensor t = Pattern({1000}, DType::kInt32, 9);
  const char* data = static_cast<const char*>(t.raw());
  auto keep = std::make_shared<Tensor>(t);
  baton::v1::TensorHeader h = MakeHeader(2, Tag(3, 1, TensorKind::kGradient, 4), t);
  for (size_t inline_len : {size_t{0}, size_t{1}, size_t{300}, t.nbytes()}) {
    // Re-slice the frame into 7-byte pieces, as a receive buffer may be.
    std::vector<grpc::Slice> pieces;
    ASSERT_TRUE(HeaderFrame(h, data, inline_len, keep).Dump(&pieces).ok());
    std::string flat;
    for (const auto& p : pieces) flat.append(reinterpret_cast<const char*>(p.begin()), p.size());
    std::vector<grpc::Slice> small;
    for (size_t i = 0; i < flat.size(); i += 7)
      small.emplace_back(flat.data() + i, std::min<size_t>(7, flat.size() - i));
    // The encoding is protobuf's own.
    baton::v1::TensorFrame parsed;
    ASSERT_TRUE(parsed.ParseFromString(flat));
    EXPECT_EQ(parsed.header().payload(), std::string(data, inline_len));
    absl::StatusOr<ReceivedFrame> f = ParseFrame(grpc::ByteBuffer(small.data(), small.size()));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_FALSE(f->is_chunk);
    ASSERT_EQ(f->frame.frame_case(), baton::v1::TensorFrame::kHeader);
    EXPECT_TRUE(f->frame.header().payload().empty());
    EXPECT_EQ(TagOf(f->frame.header()), Tag(3, 1, TensorKind::kGradient, 4));
    EXPECT_EQ(f->frame.header().byte_length(), 4000);
    ASSERT_EQ(f->payload_len, inline_len);
    // ... found in place (the zero-copy path), not in a parsed copy (offset 0).
    if (inline_len > 0) {
      EXPECT_GT(f->payload_offset, 0u);
    }
    std::string out(inline_len, '\0');
    CopyPayload(*f, out.data());
    EXPECT_EQ(out, std::string(data, inline_len));
  }
  std::vector<grpc::Slice> pieces;
  ASSERT_TRUE(ChunkFrame(data + 5, 333, keep).Dump(&pieces).ok());
  absl::StatusOr<ReceivedFrame> f = ParseFrame(grpc::ByteBuffer(pieces.data(), pieces.size()));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->is_chunk);
  EXPECT_GT(f->payload_offset, 0u);
  ASSERT_EQ(f->payload_len, 333u);
  std::string out(333, '\0');
  CopyPayload(*f, out.data());
  EXPECT_EQ(out, std::string(data + 5, 333));
}

}  // namespace
}  // namespace baton
