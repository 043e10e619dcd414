// The NCCL transport's own behaviour on the fake NCCL (common/nccl/nccl_fake_test_util.h):
// every rank is a thread with its own FakeNccl, compute stream and transport, and tensors
// live in host memory. What every transport promises is tested in
// common/pipeline/transport_contract_test.cc.
#include "common/transport/nccl_transport.h"

#include <atomic>
#include <cstring>
#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <future>

#include "absl/strings/str_cat.h"
#include "common/comm/transport_test_util.h"
#include "common/nccl/nccl_fake_test_util.h"
#include "common/transport/nccl_transport_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kJob = 7;
constexpr int64_t kAttempt = 1;

TensorTag Tag(int microbatch, int stage = 0, TensorKind kind = TensorKind::kActivation,
              int64_t step = 0) {
  return TensorTag{kJob, step, microbatch, stage, kind};
}

using transport_test::In;
using transport_test::kHangBound;
using transport_test::kNeverReached;
using transport_test::Pattern;
using transport_test::SameTensor;
using Cluster = NcclTestCluster;

// --- Exchanges --------------------------------------------------------------------------

// With NCCL_COMM_BLOCKING=1 each ncclCommInitRank waits for its peer's: every rank must
// bring its communicators up in one global order (the pair's ranks, then the lower rank's
// send first), whatever order its peers were listed in.
TEST(NcclTransportTest, BlockingBringUpGoesInOneGlobalOrder) {
  FakeNcclOptions blocking;
  blocking.blocking_init = true;
  blocking.blocking_init_timeout = kHangBound;  // the ranks' threads may start far apart
  Cluster c(3, {{0, blocking}, {1, blocking}, {2, blocking}});
  const auto statuses = c.Start({}, [](NcclTransport::Options& o) {
    std::reverse(o.peers.begin(), o.peers.end());  // rank 1 lists rank 2 first
  });
  for (const auto& [r, s] : statuses) ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s;
  auto w = c[1]->Send(2, Tag(0), Tensor::Zeros({4}));
  EXPECT_TRUE(c[2]->Recv(1, Tag(0), In(kHangBound)).ok());
  EXPECT_TRUE(w->Wait(In(kHangBound)).ok());
}

// A 2-rank 1F1B exchange: rank 0 sends activations and receives gradients, rank 1 the
// reverse, each in its clock order; in the steady state both send before they receive.
TEST(NcclTransportTest, TwoRanksExchangeInClockOrder) {
  Cluster c(2);
  ASSERT_TRUE(c.StartAll());
  EXPECT_STREQ(c[0]->backend(), "nccl");
  EXPECT_EQ(c[1]->rank(), 1);
  constexpr int kM = 8;
  const Shape shape = {3, 17};
  auto act = [&](int m) { return Pattern(shape, DType::kFloat32, 100 + m); };
  auto grad = [&](int m) { return Pattern(shape, DType::kFloat32, 200 + m); };
  const absl::Time deadline = In(kHangBound);

  std::thread r0([&] {
    std::vector<std::unique_ptr<SendWork>> works;
    works.push_back(c[0]->Send(1, Tag(0, 0), act(0)));  // warm-up
    for (int m = 1; m < kM; ++m) {
      works.push_back(c[0]->Send(1, Tag(m, 0), act(m)));
      auto g = c[0]->Recv(1, Tag(m - 1, 1, TensorKind::kGradient), deadline);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_TRUE(SameTensor(*g, grad(m - 1))) << m;
    }
    auto g = c[0]->Recv(1, Tag(kM - 1, 1, TensorKind::kGradient), deadline);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(SameTensor(*g, grad(kM - 1)));
    for (auto& w : works) EXPECT_TRUE(w->Wait(deadline).ok());
  });
  std::thread r1([&] {
    std::vector<std::unique_ptr<SendWork>> works;
    for (int m = 0; m < kM; ++m) {
      auto a = c[1]->Recv(0, Tag(m, 0), deadline);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_TRUE(SameTensor(*a, act(m))) << m;
      works.push_back(c[1]->Send(0, Tag(m, 1, TensorKind::kGradient), grad(m)));
    }
    for (auto& w : works) {
      EXPECT_TRUE(w->Wait(deadline).ok());
      EXPECT_TRUE(w->IsCompleted());
    }
  });
  r0.join();
  r1.join();
}

// Both ranks send before they receive. With one communicator per pair this deadlocks
// (each send waits for a receive queued behind the other's send); one per direction not.
TEST(NcclTransportTest, BothRanksSendBeforeTheyReceive) {
  Cluster c(2);
  ASSERT_TRUE(c.StartAll());
  const absl::Time deadline = In(kHangBound);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      for (int i = 0; i < 5; ++i) {
        auto w = c[r]->Send(1 - r, Tag(i, r), Pattern({64}, DType::kInt32, 10 * r + i));
        auto t = c[r]->Recv(1 - r, Tag(i, 1 - r), deadline);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_TRUE(SameTensor(*t, Pattern({64}, DType::kInt32, 10 * (1 - r) + i)));
        EXPECT_TRUE(w->Wait(deadline).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Hundreds of tensors of every shape and dtype (scalars, empty, undefined, 8 dims, big)
// sent before the first is received: more than the staging slots, so sends queue.
TEST(NcclTransportTest, ManyTagsInOrderEveryShapeAndDtype) {
  Cluster c(2);
  ASSERT_TRUE(c.Start({}, [](NcclTransport::Options& o) { o.max_sends_in_flight = 8; }).at(0).ok());
  ASSERT_NE(c[1], nullptr);
  const std::vector<Shape> shapes = {
      {}, {0}, {1}, {3, 5}, {2, 3, 4, 5}, {1, 2, 1, 2, 1, 2, 1, 2}, {0, 7}, {1 << 16}};
  constexpr int kN = 300;
  auto tensor = [&](int i) -> Tensor {
    if (i % 37 == 5) return Tensor();
    return Pattern(shapes[i % shapes.size()], i % 3 == 0 ? DType::kInt32 : DType::kFloat32, i);
  };
  auto tag = [](int i) {
    return Tag(i % 11, i % 3, i % 2 ? TensorKind::kGradient : TensorKind::kActivation, i / 11);
  };
  const absl::Time deadline = In(kHangBound);
  std::vector<std::unique_ptr<SendWork>> works;
  for (int i = 0; i < kN; ++i) works.push_back(c[0]->Send(1, tag(i), tensor(i)));
  for (int i = 0; i < kN; ++i) {
    auto t = c[1]->Recv(0, tag(i), deadline);
    ASSERT_TRUE(t.ok()) << i << ": " << t.status();
    ASSERT_TRUE(SameTensor(*t, tensor(i))) << i << ": " << t->DebugString();
  }
  for (auto& w : works) ASSERT_TRUE(w->Wait(deadline).ok());
}

// The sender's compute stream writes the tensor later than Send is called: the transport
// must send what the compute stream wrote, not what was there at the call.
TEST(NcclTransportTest, SendWaitsForTheComputeStream) {
  Cluster c(2);
  ASSERT_TRUE(c.StartAll());
  Tensor t = Tensor::Zeros({1024}, DType::kInt32);
  const Tensor expected = Pattern({1024}, DType::kInt32, 99);
  // The compute stream writes only once Send has returned, however the threads run.
  std::promise<void> sent;
  std::shared_future<void> sent_done = sent.get_future().share();
  ASSERT_TRUE(c.api(0)
                  ->LaunchHostFunc(c.compute(0),
                                   [t, expected, sent_done]() mutable {
                                     sent_done.wait();
                                     std::memcpy(t.raw(), expected.raw(), t.nbytes());
                                   })
                  .ok());
  auto w = c[0]->Send(1, Tag(0), t);
  sent.set_value();
  auto got = c[1]->Recv(0, Tag(0), In(kHangBound));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameTensor(*got, expected));
  EXPECT_TRUE(w->Wait(In(kHangBound)).ok());
}

// The fake returns kInProgress from every call and keeps reporting it for a while: the
// transport must poll before its next call (the fake refuses calls made too early).
TEST(NcclTransportTest, CallsThatReturnInProgressArePolled) {
  FakeNcclOptions slow;
  slow.in_progress_polls = 3;
  Cluster c(2, {{0, slow}, {1, slow}});
  ASSERT_TRUE(c.StartAll());
  const absl::Time deadline = In(kHangBound);
  std::thread r1([&] {
    for (int i = 0; i < 20; ++i) {
      auto t = c[1]->Recv(0, Tag(i), deadline);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_TRUE(SameTensor(*t, Pattern({33}, DType::kFloat32, i)));
      EXPECT_TRUE(c[1]->Send(0, Tag(i, 1, TensorKind::kGradient), *t)->Wait(deadline).ok());
    }
  });
  for (int i = 0; i < 20; ++i) {
    auto w = c[0]->Send(1, Tag(i), Pattern({33}, DType::kFloat32, i));
    auto g = c[0]->Recv(1, Tag(i, 1, TensorKind::kGradient), deadline);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(SameTensor(*g, Pattern({33}, DType::kFloat32, i)));
    EXPECT_TRUE(w->Wait(deadline).ok());
  }
  r1.join();
}

// --- Order and integrity ------------------------------------------------------------------

TEST(NcclTransportTest, OutOfOrderTagIsRefusedNamingBothTagsAndThePeer) {
  Cluster c(2);
  ASSERT_TRUE(c.StartAll());
  const TensorTag first = Tag(0);
  const TensorTag second = Tag(1);
  auto w0 = c[0]->Send(1, first, Pattern({8}, DType::kFloat32, 1));
  auto w1 = c[0]->Send(1, second, Pattern({8}, DType::kFloat32, 2));
  // Refused as soon as `first` arrives: a receive that waited for its deadline instead
  // would end DEADLINE_EXCEEDED.
  auto t = c[1]->Recv(0, second, In(kNeverReached));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_THAT(
      std::string(t.status().message()),
      AllOf(HasSubstr("rank 1: receiving " + second.ToString() + " from rank 0"),
            HasSubstr(first.ToString() + " from rank 0 arrived instead"), HasSubstr("same order")));
  // The edge is done for: the payload of `first` is on its way and cannot be taken back.
  auto again = c[1]->Recv(0, first, In(kNeverReached));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("failed earlier"));
  // The sender's sends never complete now; their waits end at the deadline.
  EXPECT_EQ(w1->Wait(In(absl::Milliseconds(100))).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(w0->Wait(In(absl::Milliseconds(100))).ok());
}

TEST(NcclTransportTest, KindAndStepAreCheckedToo) {
  Cluster c(2);
  ASSERT_TRUE(c.StartAll());
  auto w = c[0]->Send(1, Tag(0, 0, TensorKind::kActivation, /*step=*/3), Tensor::Zeros({2}));
  auto t = c[1]->Recv(0, Tag(0, 0, TensorKind::kGradient, 3), In(kHangBound));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("activation from rank 0 arrived"));
}

// A peer that speaks the protocol by hand through the fake: rank 0 of a 2-rank job, so
// that tests can put any bytes on the wire to rank 1.
class RawRank0 {
 public:
  RawRank0(InMemoryNcclIdExchange* ids, uint64_t job = kJob) : job_(job) {
    stream_ = *api_.StreamCreate(0);
    buf_ = static_cast<char*>(*api_.HostAlloc(1 << 16));
    std::memset(buf_, 0, 1 << 16);
    for (int dir = 0; dir < 2; ++dir) {
      NcclUniqueId id;
      EXPECT_EQ(api_.GetUniqueId(&id), NcclResult::kSuccess);
      const int src = dir == 0 ? 0 : 1;
      EXPECT_TRUE(ids->Publish(nccl_internal::EdgeKey(kJob, kAttempt, src, 1 - src), id).ok());
      EXPECT_EQ(api_.CommInitRank(&comm_[dir], 2, id, 0, 0), NcclResult::kInProgress);
    }
  }
  ~RawRank0() {
    for (NcclComm c : comm_) api_.CommAbort(c);
    EXPECT_TRUE(api_.StreamDestroy(stream_).ok());
    EXPECT_TRUE(api_.HostFree(buf_).ok());
  }
  // Waits for both communicators, then says hello on 0 -> 1 and takes rank 1's hello.
  void Handshake() {
    for (NcclComm c : comm_) {
      NcclResult state = NcclResult::kInProgress;
      while (state == NcclResult::kInProgress) {
        ASSERT_EQ(api_.CommGetAsyncError(c, &state), NcclResult::kSuccess);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_EQ(state, NcclResult::kSuccess);
    }
    nccl_internal::Header hello;
    hello.hello = true;
    hello.tag.job = job_;
    hello.tag.step = kAttempt;
    hello.source_rank = 0;
    SendHeader(hello);
    ASSERT_EQ(api_.Recv(buf_ + 512, nccl_internal::kHeaderBytes, 1, comm_[1], stream_),
              NcclResult::kSuccess);
  }
  // Sends 128 raw bytes (then `payload` bytes) on 0 -> 1.
  void SendRaw(const void* header, size_t payload = 0) {
    char* slot = buf_ + 1024 + 128 * (used_++ % 64);
    std::memcpy(slot, header, nccl_internal::kHeaderBytes);
    ASSERT_EQ(api_.Send(slot, nccl_internal::kHeaderBytes, 1, comm_[0], stream_),
              NcclResult::kSuccess);
    if (payload > 0) {
      ASSERT_EQ(api_.Send(buf_ + 16384, payload, 1, comm_[0], stream_), NcclResult::kSuccess);
    }
  }
  void SendHeader(const nccl_internal::Header& h, size_t payload = 0) {
    char bytes[nccl_internal::kHeaderBytes];
    nccl_internal::EncodeHeader(h, bytes);
    SendRaw(bytes, payload);
  }

 private:
  const uint64_t job_;
  FakeNccl api_;
  CudaStream stream_ = nullptr;
  char* buf_ = nullptr;
  NcclComm comm_[2] = {nullptr, nullptr};  // 0 -> 1, 1 -> 0
  int used_ = 0;
};

// Rank 1 of a 2-rank job whose rank 0 is a RawRank0.
struct AgainstRaw {
  AgainstRaw(uint64_t raw_job = kJob) : c(2), raw(&c.ids(), raw_job) {
    std::thread t([&] { started = c.Start({1}).at(1); });
    raw.Handshake();
    t.join();
  }
  Cluster c;
  RawRank0 raw;
  absl::Status started;
};

TEST(NcclTransportTest, GarbageHeaderIsDataLoss) {
  AgainstRaw a;
  ASSERT_TRUE(a.started.ok()) << a.started;
  char garbage[nccl_internal::kHeaderBytes];
  std::memset(garbage, 0xab, sizeof(garbage));
  a.raw.SendRaw(garbage);
  auto t = a.c[1]->Recv(0, Tag(0), In(kHangBound));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_THAT(std::string(t.status().message()),
              AllOf(HasSubstr("rank 1: receiving " + Tag(0).ToString() + " from rank 0"),
                    HasSubstr("corrupt header"), HasSubstr("magic")));
}

TEST(NcclTransportTest, HeaderWhoseSizeDoesNotMatchItsShapeIsDataLoss) {
  AgainstRaw a;
  ASSERT_TRUE(a.started.ok()) << a.started;
  nccl_internal::Header h;
  h.tag = Tag(0);
  h.dtype = DType::kFloat32;
  h.shape = {4};
  h.nbytes = 20;  // f32[4] is 16
  a.raw.SendHeader(h, 20);
  auto t = a.c[1]->Recv(0, Tag(0), In(kHangBound));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_THAT(std::string(t.status().message()),
              AllOf(HasSubstr("from rank 0"), HasSubstr("announces 20 bytes"), HasSubstr("16")));
}

#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
// (Sanitizer allocators abort on a request this large instead of failing it.)
TEST(NcclTransportTest, TensorTooLargeToAllocateIsResourceExhausted) {
  AgainstRaw a;
  ASSERT_TRUE(a.started.ok()) << a.started;
  nccl_internal::Header h;
  h.tag = Tag(0);
  h.shape = {int64_t{1} << 40};  // 4 TiB of f32
  h.nbytes = uint64_t{4} << 40;
  a.raw.SendHeader(h);
  auto t = a.c[1]->Recv(0, Tag(0), In(kHangBound));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("rank 1: receiving " + Tag(0).ToString() + " from rank 0"));
}
#endif

TEST(NcclTransportTest, HeaderFromAnotherRankIsRefused) {
  AgainstRaw a;
  ASSERT_TRUE(a.started.ok()) << a.started;
  a.raw.SendHeader(nccl_internal::TensorHeader(/*source_rank=*/2, Tag(0), Tensor::Zeros({1})), 4);
  auto t = a.c[1]->Recv(0, Tag(0), In(kHangBound));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("from rank 2 arrived instead"));
}

TEST(NcclTransportTest, HandshakeForAnotherJobFailsBringUp) {
  AgainstRaw a(/*raw_job=*/99);
  EXPECT_EQ(a.started.code(), absl::StatusCode::kFailedPrecondition) << a.started;
  EXPECT_THAT(std::string(a.started.message()),
              AllOf(HasSubstr("rank 0 -> rank 1"), HasSubstr("of another job"),
                    Not(HasSubstr("99"))));  // job keys are secrets: never named
}

// The fake's byte-count mismatch: the payload's send claims more bytes than the receive
// takes. Both sides fail, naming the edge, instead of hanging.
TEST(NcclTransportTest, ByteCountMismatchFailsBothSidesNamingTheEdge) {
  FakeNcclOptions bad;
  bad.mismatch_bytes_at_op = 3;  // 1: hello, 2: the first header, 3: its payload
  Cluster c(2, {{0, bad}});
  ASSERT_TRUE(c.StartAll());
  // Neither side waits for its deadline: that would end DEADLINE_EXCEEDED.
  auto w = c[0]->Send(1, Tag(0), Pattern({16}, DType::kFloat32, 1));
  auto t = c[1]->Recv(0, Tag(0), In(kNeverReached));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInternal) << t.status();
  EXPECT_THAT(
      std::string(t.status().message()),
      AllOf(HasSubstr("receiving " + Tag(0).ToString() + " from rank 0"),
            HasSubstr("rank 0 -> rank 1"), HasSubstr("ncclInvalidUsage"), HasSubstr("68 bytes")));
  const absl::Status ws = w->Wait(In(kNeverReached));
  EXPECT_EQ(ws.code(), absl::StatusCode::kInternal) << ws;
  EXPECT_THAT(std::string(ws.message()),
              AllOf(HasSubstr("sending " + Tag(0).ToString() + " to rank 1"),
                    HasSubstr("ncclInvalidUsage")));
  // An asynchronous error aborts the whole transport.
  auto later = c[1]->Recv(0, Tag(1), In(kHangBound));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(later.status().message()), HasSubstr("rank 1 aborted: "));
}

// --- Bring-up -----------------------------------------------------------------------------

TEST(NcclTransportTest, InitThatNeverCompletesIsDeadlineExceededNamingThePeer) {
  FakeNcclOptions hang;
  hang.init_never_completes = true;
  Cluster c(2, {{1, hang}});
  // Whichever rank's thread runs first (or is late past the other's timeout), each gives up
  // at its own init_timeout with the same account of both edges.
  std::map<int, std::vector<int>> failed;
  auto s = c.Start(
      {}, [](NcclTransport::Options& o) { o.init_timeout = absl::Milliseconds(300); }, &failed);
  for (int r : {0, 1}) {
    EXPECT_EQ(s[r].code(), absl::StatusCode::kDeadlineExceeded) << s[r];
    EXPECT_THAT(std::string(s[r].message()),
                AllOf(HasSubstr(absl::StrCat("nccl: rank ", r)), HasSubstr("rank 0 -> rank 1"),
                      HasSubstr("rank 1 -> rank 0"), HasSubstr("did not come up within 300ms")));
    EXPECT_EQ(failed[r], std::vector<int>{1 - r});
    EXPECT_EQ(c[r], nullptr);
  }
  EXPECT_THAT(std::string(s[0].message()), HasSubstr("rank 1 has not joined it"));
  for (int r : {0, 1}) {
    const FakeNccl::Counts n = c.api(r)->counts();
    EXPECT_EQ(n.comms, 0) << "rank " << r;    // aborted
    EXPECT_EQ(n.streams, 1) << "rank " << r;  // the compute stream only
    EXPECT_EQ(n.buffers, 0) << "rank " << r;
    EXPECT_EQ(n.events, 0) << "rank " << r;
  }
}

TEST(NcclTransportTest, InitFailureIsUnavailableNamingThePeer) {
  FakeNcclOptions broken;
  broken.init_fails = true;
  Cluster c(2, {{1, broken}});
  std::map<int, std::vector<int>> failed;
  // Rank 1 waits for rank 0's ids as long as it takes (a late rank 0 must not turn its
  // failure into a deadline); rank 0 waits 300 ms for rank 1 to join.
  auto s = c.Start(
      {},
      [](NcclTransport::Options& o) {
        o.init_timeout = o.rank == 1 ? kNeverReached : absl::Milliseconds(300);
      },
      &failed);
  EXPECT_EQ(s[1].code(), absl::StatusCode::kUnavailable) << s[1];
  EXPECT_THAT(std::string(s[1].message()),
              AllOf(HasSubstr("rank 1 -> rank 0"), HasSubstr("ncclCommInitRankConfig"),
                    HasSubstr("ncclSystemError"), HasSubstr("injected initialisation failure")));
  EXPECT_EQ(failed[1], std::vector<int>{0});
  // Its peer waits for it until the deadline.
  EXPECT_EQ(s[0].code(), absl::StatusCode::kDeadlineExceeded) << s[0];
}

TEST(NcclTransportTest, PeerThatNeverStartsIsDeadlineExceeded) {
  Cluster c(3);
  auto tweak = [](NcclTransport::Options& o) { o.init_timeout = absl::Milliseconds(200); };
  // Rank 1 alone: rank 0 never publishes its ids, rank 2 never joins.
  std::map<int, std::vector<int>> failed;
  auto s = c.Start({1}, tweak, &failed);
  EXPECT_EQ(s[1].code(), absl::StatusCode::kDeadlineExceeded) << s[1];
  EXPECT_THAT(std::string(s[1].message()),
              AllOf(HasSubstr("rank 0 published no id"), HasSubstr("rank 2 has not joined")));
  EXPECT_EQ(failed[1], (std::vector<int>{0, 2}));
}

TEST(NcclTransportTest, BadOptionsAreInvalidArgument) {
  Cluster c(2);
  auto bad = [&](const std::function<void(NcclTransport::Options&)>& tweak) {
    NcclTransport::Options o = c.Options(0);
    tweak(o);
    return NcclTransport::Create(o).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad([](auto& o) { o.api = nullptr; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.ids = nullptr; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.compute_stream = nullptr; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.peers = {0}; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.peers = {1, 1}; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.peers = {2}; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.rank = 2; }), kInvalid);
  EXPECT_EQ(bad([](auto& o) { o.max_sends_in_flight = 0; }), kInvalid);
}

TEST(NcclTransportTest, BadArgumentsAreInvalidArgument) {
  Cluster c(3);
  ASSERT_TRUE(c.StartAll());
  const absl::Time deadline = In(kHangBound);
  // Rank 0's only peer is rank 1.
  EXPECT_EQ(c[0]->Send(2, Tag(0), Tensor::Zeros({1}))->Wait(deadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c[0]->Recv(2, Tag(0), deadline).status().code(), absl::StatusCode::kInvalidArgument);
  TensorTag other = Tag(0);
  other.job = kJob + 1;
  const absl::Status s = c[0]->Send(1, other, Tensor::Zeros({1}))->Wait(deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the tag's job key is not this transport's"));
  // Nothing was sent: the edge still works.
  auto w = c[0]->Send(1, Tag(1), Tensor::Zeros({1}));
  EXPECT_TRUE(c[1]->Recv(0, Tag(1), In(kHangBound)).ok());
  EXPECT_TRUE(w->Wait(In(kHangBound)).ok());
}

// --- Failures while running ----------------------------------------------------------------

TEST(NcclTransportTest, AsyncErrorFailsTheWaiterNamingThePeerAndAbortsTheTransport) {
  FakeNcclOptions flaky;
  flaky.async_error_at_op = 4;  // 1: hello, 2-3: the first tensor, 4: the second's header
  Cluster c(2, {{0, flaky}});
  ASSERT_TRUE(c.StartAll());
  std::thread receiver([&] {
    EXPECT_TRUE(c[1]->Recv(0, Tag(0), In(kHangBound)).ok());
    // The second never comes: rank 1 finds out at its deadline (or when told out of band).
    auto t = c[1]->Recv(0, Tag(1), In(absl::Milliseconds(300)));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
    EXPECT_THAT(std::string(t.status().message()),
                AllOf(HasSubstr("rank 1 timed out waiting for " + Tag(1).ToString()),
                      HasSubstr("from rank 0")));
  });
  auto w0 = c[0]->Send(1, Tag(0), Pattern({5}, DType::kFloat32, 0));
  EXPECT_TRUE(w0->Wait(In(kHangBound)).ok());
  // The communicator breaks as the second tensor's header is enqueued: the wait ends on
  // the asynchronous error, not at its deadline.
  auto w1 = c[0]->Send(1, Tag(1), Pattern({5}, DType::kFloat32, 1));
  const absl::Status s = w1->Wait(In(kNeverReached));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("rank 0: sending " + Tag(1).ToString() + " to rank 1"),
                    HasSubstr("NCCL error on the communicator rank 0 -> rank 1"),
                    HasSubstr("ncclRemoteError"), HasSubstr("injected")));
  // The transport is aborted with a reason that names the peer.
  auto r = c[0]->Recv(1, Tag(0, 1, TensorKind::kGradient), In(kNeverReached));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("rank 0 aborted: "), HasSubstr("rank 0 -> rank 1")));
  receiver.join();
}

TEST(NcclTransportTest, PeerThatNeverReceivesHitsTheSendDeadline) {
  Cluster c(2);
  ASSERT_TRUE(c.StartAll());
  auto w = c[0]->Send(1, Tag(0), Pattern({100}, DType::kFloat32, 0));
  EXPECT_FALSE(w->IsCompleted());
  const absl::Time start = absl::Now();
  const absl::Status s = w->Wait(In(absl::Milliseconds(200)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));  // not before its deadline
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("rank 0: sending " + Tag(0).ToString() + " to rank 1"),
                    HasSubstr("not received by rank 1"), HasSubstr("was aborted")));
  EXPECT_TRUE(w->IsCompleted());
  // That edge is failed; sends to the peer fail at once, receives from it still work.
  const absl::Status later = c[0]->Send(1, Tag(1), Tensor::Zeros({1}))->Wait(In(kNeverReached));
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(later.message()), HasSubstr("failed earlier"));
  auto back = c[1]->Send(0, Tag(0, 1, TensorKind::kGradient), Tensor::Zeros({3}));
  EXPECT_TRUE(c[0]->Recv(1, Tag(0, 1, TensorKind::kGradient), In(kHangBound)).ok());
  EXPECT_TRUE(back->Wait(In(kHangBound)).ok());
}

TEST(NcclTransportTest, ReceivesThatAreNeverPostedTimeOutOnBothSides) {
  FakeNcclOptions deaf;
  deaf.drop_recvs_from_op = 2;  // after the handshake
  Cluster c(2, {{1, deaf}});
  ASSERT_TRUE(c.StartAll());
  auto w = c[0]->Send(1, Tag(0), Pattern({10}, DType::kFloat32, 0));
  auto t = c[1]->Recv(0, Tag(0), In(absl::Milliseconds(200)));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_THAT(
      std::string(t.status().message()),
      AllOf(HasSubstr(Tag(0).ToString()), HasSubstr("from rank 0"), HasSubstr("nothing arrived")));
  EXPECT_EQ(w->Wait(In(absl::Milliseconds(200))).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(NcclTransportTest, AbortWakesEveryWaiterWithTheReason) {
  Cluster c(3);
  ASSERT_TRUE(c.StartAll());
  // Woken by the abort, not by this deadline: that would end DEADLINE_EXCEEDED.
  const absl::Time far = In(kNeverReached);
  // Rank 1 waits for rank 0 and rank 2 (who send nothing) and for a send rank 0 never takes.
  auto w = c[1]->Send(0, Tag(0, 1, TensorKind::kGradient), Tensor::Zeros({4}));
  std::vector<absl::Status> got(3);
  std::thread a([&] { got[0] = c[1]->Recv(0, Tag(0, 0), far).status(); });
  std::thread b([&] { got[1] = c[1]->Recv(2, Tag(0, 2, TensorKind::kGradient), far).status(); });
  std::thread d([&] { got[2] = w->Wait(far); });
  // Lets the three block first, as a rule; a thread that is late calls after the abort
  // and gets the same answer (below), so the outcome does not depend on it.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  c[1]->Abort(absl::InternalError("rank 1's optimizer blew up"));
  a.join();
  b.join();
  d.join();
  for (const absl::Status& s : got) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_EQ(s.message(), "rank 1 aborted: rank 1's optimizer blew up");
  }
  // Later operations fail the same way, at once; a second abort changes nothing.
  c[1]->Abort(absl::InternalError("again"));
  EXPECT_EQ(c[1]->Send(2, Tag(1, 1), Tensor::Zeros({1}))->Wait(far).message(),
            "rank 1 aborted: rank 1's optimizer blew up");
  EXPECT_EQ(c[1]->Recv(0, Tag(1), far).status().code(), absl::StatusCode::kAborted);
}

// Destruction aborts pending sends instead of waiting for them: with a shutdown_timeout
// no test outlives, a destructor that waited (to finalize a communicator with sends on it,
// or for its streams) would hang the test rather than return.
TEST(NcclTransportTest, DestroyingWithSendsPendingDoesNotHang) {
  Cluster c(2);
  ASSERT_TRUE(c.Start({}, [](NcclTransport::Options& o) {
                 o.max_sends_in_flight = 2;
                 o.shutdown_timeout = kNeverReached;
               }).at(0).ok());
  ASSERT_NE(c[1], nullptr);
  // Some sends are on the stream, others wait for a staging slot; rank 1 never receives.
  std::vector<std::unique_ptr<SendWork>> works;
  for (int i = 0; i < 6; ++i) works.push_back(c[0]->Send(1, Tag(i), Tensor::Zeros({1000})));
  // And rank 1's receiving edge failed part-way: it expected another tag than the one that
  // came (the receive ends when rank 0's Tag(0) header arrives, however long that takes).
  EXPECT_EQ(c[1]->Recv(0, Tag(0, 9), In(kHangBound)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  c.Destroy(0);
  c.Destroy(1);
  for (auto& w : works) {
    EXPECT_TRUE(w->IsCompleted());
    const absl::Status s = w->Wait(In(kHangBound));
    EXPECT_FALSE(s.ok());
  }
  EXPECT_THAT(std::string(works.back()->Wait(absl::Now()).message()),
              HasSubstr("destroyed with sends pending"));
  // Rank 0 released its communicators with CommAbort without a finalize first (which
  // would have waited for the pending sends).
  EXPECT_EQ(c.api(0)->counts().finalized, 0);
  for (int r : {0, 1}) {
    const FakeNccl::Counts n = c.api(r)->counts();
    EXPECT_EQ(n.comms, 0) << "rank " << r;
    EXPECT_EQ(n.streams, 1) << "rank " << r;
    EXPECT_EQ(n.events, 0) << "rank " << r;
    EXPECT_EQ(n.buffers, 0) << "rank " << r;
  }
}

// Every finalize completes (none is cut short by shutdown_timeout, set here beyond any
// test's life: a finalize that never completed would hang the test).
TEST(NcclTransportTest, CleanShutdownFinalizesAndReleasesEverything) {
  Cluster c(2);
  for (const auto& [r, s] :
       c.Start({}, [](NcclTransport::Options& o) { o.shutdown_timeout = kNeverReached; })) {
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s;
  }
  auto w = c[0]->Send(1, Tag(0), Tensor::Zeros({7}));
  ASSERT_TRUE(c[1]->Recv(0, Tag(0), In(kHangBound)).ok());
  ASSERT_TRUE(w->Wait(In(kHangBound)).ok());
  c.Destroy(0);
  c.Destroy(1);
  for (int r : {0, 1}) {
    const FakeNccl::Counts n = c.api(r)->counts();
    EXPECT_EQ(n.comms, 0);
    EXPECT_EQ(n.finalized, 2);  // each finalized with nothing pending ...
    EXPECT_EQ(n.aborted, 2);    // ... then released by CommAbort
    EXPECT_EQ(n.streams, 1);
    EXPECT_EQ(n.events, 0);
    EXPECT_EQ(n.buffers, 0);
  }
  EXPECT_TRUE(w->Wait(absl::Now()).ok());  // a SendWork outlives its transport
}

// --- Pieces ----------------------------------------------------------------------------

TEST(NcclHeaderTest, RoundTripAndCorruption) {
  const Tensor t = Pattern({2, 3, 4}, DType::kInt32, 5);
  const nccl_internal::Header h =
      nccl_internal::TensorHeader(3, Tag(4, 2, TensorKind::kGradient, 9), t);
  char bytes[nccl_internal::kHeaderBytes];
  nccl_internal::EncodeHeader(h, bytes);
  auto back = nccl_internal::DecodeHeader(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->hello);
  EXPECT_EQ(back->tag, Tag(4, 2, TensorKind::kGradient, 9));
  EXPECT_EQ(back->source_rank, 3);
  EXPECT_EQ(back->dtype, DType::kInt32);
  EXPECT_EQ(back->shape, (Shape{2, 3, 4}));
  EXPECT_EQ(back->nbytes, 96u);
  for (size_t i = 0; i < 120; i += 7) {
    char flipped[nccl_internal::kHeaderBytes];
    std::memcpy(flipped, bytes, sizeof(bytes));
    flipped[i] ^= 0x10;
    EXPECT_EQ(nccl_internal::DecodeHeader(flipped).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
  }
  nccl_internal::EncodeHeader(nccl_internal::TensorHeader(0, Tag(0), Tensor()), bytes);
  back = nccl_internal::DecodeHeader(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->defined);
  EXPECT_EQ(back->nbytes, 0u);
}

TEST(InMemoryNcclIdExchangeTest, FetchWaitsPublishOnce) {
  InMemoryNcclIdExchange ids;
  NcclUniqueId a, b;
  a.bytes[0] = 1;
  b.bytes[0] = 2;
  EXPECT_EQ(ids.Fetch("k", In(absl::Milliseconds(20))).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // Published a little later, as a rule while Fetch waits; published first, it is
  // fetched all the same.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(ids.Publish("k", a).ok());
  });
  auto got = ids.Fetch("k", In(kHangBound));
  later.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, a);
  EXPECT_TRUE(ids.Publish("k", a).ok());
  EXPECT_EQ(ids.Publish("k", b).code(), absl::StatusCode::kAlreadyExists);
}

TEST(LoadNcclTest, FailsCleanlyOrDescribesTheLibrary) {
  absl::StatusOr<NcclApi*> api = LoadNccl();
  if (api.ok()) {
    std::cout << "loaded " << (*api)->Describe() << "\n";
    EXPECT_THAT((*api)->Describe(), HasSubstr("nccl 2."));
    EXPECT_EQ((*api)->device(), Device::kCuda);
  } else {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kUnavailable) << api.status();
    EXPECT_FALSE(api.status().message().empty());
  }
}

TEST(LoadNcclTest, MissingLibraryOrFunctionsAreUnavailableNamingThem) {
  absl::StatusOr<std::unique_ptr<NcclApi>> none = OpenNccl("libbaton-no-such-nccl.so.2");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  const bool loader_built = none.status().message().find("built without") == std::string::npos;
  if (loader_built) {
    EXPECT_THAT(std::string(none.status().message()),
                HasSubstr("libbaton-no-such-nccl.so.2: cannot open shared object file"));
    // A library that is not NCCL.
    absl::StatusOr<std::unique_ptr<NcclApi>> libc = OpenNccl("libc.so.6");
    EXPECT_EQ(libc.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(libc.status().message()),
                AllOf(HasSubstr("libc.so.6 lacks ncclGetVersion"), HasSubstr("2.14")));
  } else {
    EXPECT_THAT(std::string(none.status().message()), HasSubstr("built without"));
  }
}

}  // namespace
}  // namespace baton
