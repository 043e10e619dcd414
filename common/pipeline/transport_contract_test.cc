// The Transport contract (common/comm/transport.h), one suite over every backend: the
// in-process transport, the gRPC transport (every rank's server in this process, on
// loopback) and the NCCL transport on the fake NCCL. What every backend promises is tested
// here once; each backend's own tests (common/comm, common/transport) keep only what is
// particular to it: framing, backpressure, bring-up, faults.
//
// It lives above the transports because its last promise is the headline one: a pipeline
// of StageExecutors over the transport trains to the reference trainer's weights, bit for
// bit, for each schedule.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/comm/inproc_transport.h"
#include "common/comm/transport_test_util.h"
#include "common/pipeline/stage_executor.h"
#include "common/plan/partition.h"
#include "common/schedule/generators.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "common/transport/grpc_transport_test_util.h"
#include "common/transport/nccl_transport_test_util.h"
#include "gmock/gmock.h"
#include "grpc/grpc.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using transport_test::In;
using transport_test::kHangBound;
using transport_test::kNeverReached;
using transport_test::Pattern;
using transport_test::SameTensor;

// Keep gRPC initialised for the whole binary (see grpc_transport_test.cc).
const bool kGrpcKeptAlive = [] {
  grpc_init();
  return true;
}();

constexpr uint64_t kJob = 7;

TensorTag Tag(int microbatch, int stage = 0, TensorKind kind = TensorKind::kActivation,
              int64_t step = 0) {
  return TensorTag{kJob, step, microbatch, stage, kind};
}

// A backend: `n` connected transports, rank r's at(r). Neighbouring ranks (r, r + 1) are
// connected on every backend; the suite uses no other pair, as a pipeline does not.
class InProcBackend {
 public:
  static constexpr const char* kName = "InProc";
  explicit InProcBackend(int n) : hub_(n) {}
  bool ok() const { return true; }
  Transport* at(int r) { return hub_.transport(r); }
  // Nothing left undelivered after a clean run.
  void ExpectDrained() { EXPECT_EQ(hub_.Pending(), 0); }

 private:
  InProcessHub hub_;
};

class GrpcBackend {
 public:
  static constexpr const char* kName = "Grpc";
  explicit GrpcBackend(int n) : cluster_(n, int64_t{256} << 20, {}, kJob) {
    for (int r = 0; r < n; ++r) transports_.push_back(cluster_.Add(r));
  }
  bool ok() const { return true; }
  Transport* at(int r) { return transports_[r]; }
  void ExpectDrained() {
    for (int r = 0; r < static_cast<int>(transports_.size()); ++r) {
      EXPECT_EQ(cluster_.node(r).inbox.Stats().tensors_filed, 0) << "rank " << r;
    }
  }

 private:
  GrpcTestCluster cluster_;
  std::vector<GrpcTransport*> transports_;
};

class FakeNcclBackend {
 public:
  static constexpr const char* kName = "FakeNccl";
  explicit FakeNcclBackend(int n) : cluster_(n, {}, kJob) { ok_ = cluster_.StartAll(); }
  bool ok() const { return ok_; }
  Transport* at(int r) { return cluster_[r]; }
  // NCCL matches in order and keeps nothing filed: a tensor nobody received would have
  // failed the receive that came after it.
  void ExpectDrained() {}

 private:
  NcclTestCluster cluster_;
  bool ok_ = false;
};

template <typename B>
class TransportContractTest : public ::testing::Test {
 protected:
  // The backend with `n` ranks; fails the test when it could not be brought up.
  std::unique_ptr<B> Make(int n) {
    auto b = std::make_unique<B>(n);
    EXPECT_TRUE(b->ok()) << B::kName << " did not come up with " << n << " ranks";
    return b;
  }
};

struct BackendName {
  template <typename B>
  static std::string GetName(int) {
    return B::kName;
  }
};
using Backends = ::testing::Types<InProcBackend, GrpcBackend, FakeNcclBackend>;
TYPED_TEST_SUITE(TransportContractTest, Backends, BackendName);

// Every shape and dtype arrives with its bits, sent before any is received, received in
// the order sent (the order a validated clock keeps per pair of ranks).
TYPED_TEST(TransportContractTest, TensorsArriveBitExactInClockOrder) {
  auto b = this->Make(2);
  ASSERT_TRUE(b->ok());
  const std::vector<Shape> shapes = {{1}, {3, 5}, {2, 3, 4, 5}, {1, 2, 1, 2, 1, 2, 1, 2},
                                     {1 << 16}};
  constexpr int kN = 40;
  auto tensor = [&](int i) {
    return Pattern(shapes[i % shapes.size()], i % 3 == 0 ? DType::kInt32 : DType::kFloat32, i);
  };
  auto tag = [](int i) {
    return Tag(i % 11, 0, i % 2 ? TensorKind::kGradient : TensorKind::kActivation, i / 11);
  };
  const absl::Time deadline = In(kHangBound);
  std::vector<std::unique_ptr<SendWork>> works;
  for (int i = 0; i < kN; ++i) works.push_back(b->at(0)->Send(1, tag(i), tensor(i)));
  for (int i = 0; i < kN; ++i) {
    absl::StatusOr<Tensor> t = b->at(1)->Recv(0, tag(i), deadline);
    ASSERT_TRUE(t.ok()) << i << ": " << t.status();
    EXPECT_TRUE(SameTensor(*t, tensor(i))) << i << ": " << t->DebugString();
  }
  for (auto& w : works) EXPECT_TRUE(w->Wait(deadline).ok());
  b->ExpectDrained();
}

// The sender may reuse its tensor once the send completed (on NCCL: once it was
// received): the receiver has its own, never the sender's storage.
TYPED_TEST(TransportContractTest, TheReceiverOwnsWhatItGets) {
  auto b = this->Make(2);
  ASSERT_TRUE(b->ok());
  Tensor t = Pattern({16}, DType::kFloat32, 3);
  const Tensor sent = t.Clone();
  const absl::Time deadline = In(kHangBound);
  std::unique_ptr<SendWork> w = b->at(0)->Send(1, Tag(0), t);
  absl::StatusOr<Tensor> got = b->at(1)->Recv(0, Tag(0), deadline);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(w->Wait(deadline).ok());
  t.f32()[0] = 99.0f;
  EXPECT_TRUE(SameTensor(*got, sent));
}

// Activations forward and gradients back through three ranks, every rank a thread.
TYPED_TEST(TransportContractTest, ActivationsForwardAndGradientsBackOnThreeRanks) {
  constexpr int kRanks = 3;
  constexpr int kM = 4;
  auto b = this->Make(kRanks);
  ASSERT_TRUE(b->ok());
  const absl::Time deadline = In(kHangBound);
  auto add = [](const Tensor& t, float v) {
    Tensor out = t.Clone();
    for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] += v;
    return out;
  };
  std::vector<int> checked(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::unique_ptr<SendWork>> works;
      for (int m = 0; m < kM; ++m) {
        Tensor x = Tensor::Zeros({4, 8});
        for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = static_cast<float>(m * 1000 + i);
        if (r > 0) {
          absl::StatusOr<Tensor> in = b->at(r)->Recv(r - 1, Tag(m, r - 1), deadline);
          ASSERT_TRUE(in.ok()) << in.status();
          x = *in;
        }
        Tensor y = add(x, 1.0f);
        if (r + 1 < kRanks) {
          works.push_back(b->at(r)->Send(r + 1, Tag(m, r), y));
        } else {
          for (int64_t i = 0; i < y.numel(); ++i) {
            ASSERT_EQ(y.f32()[i], static_cast<float>(m * 1000 + i + kRanks));
          }
          ++checked[r];
        }
      }
      for (int m = 0; m < kM; ++m) {
        Tensor g = Tensor::Zeros({4, 8});
        if (r + 1 < kRanks) {
          absl::StatusOr<Tensor> in =
              b->at(r)->Recv(r + 1, Tag(m, r + 1, TensorKind::kGradient), deadline);
          ASSERT_TRUE(in.ok()) << in.status();
          g = *in;
        }
        Tensor h = add(g, 10.0f);
        if (r > 0) {
          works.push_back(b->at(r)->Send(r - 1, Tag(m, r, TensorKind::kGradient), h));
        } else {
          for (int64_t i = 0; i < h.numel(); ++i) {
            ASSERT_EQ(h.f32()[i], 10.0f * kRanks);
          }
          ++checked[r];
        }
      }
      for (auto& w : works) EXPECT_TRUE(w->Wait(deadline).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(checked[0], kM);
  EXPECT_EQ(checked[kRanks - 1], kM);
  b->ExpectDrained();
}

// A receive nobody sends for ends at its deadline, naming the peer and the tag.
TYPED_TEST(TransportContractTest, AReceiveDeadlineNamesThePeerAndTheTag) {
  auto b = this->Make(2);
  ASSERT_TRUE(b->ok());
  const TensorTag tag = Tag(2, 0, TensorKind::kActivation, 3);
  absl::StatusOr<Tensor> t = b->at(1)->Recv(0, tag, In(absl::Milliseconds(200)));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_THAT(std::string(t.status().message()),
              AllOf(HasSubstr("from rank 0"), HasSubstr(tag.ToString())));
}

// Abort wakes a blocked receive at once with the reason, and later operations fail too.
TYPED_TEST(TransportContractTest, AbortWakesABlockedReceiveWithTheReason) {
  auto b = this->Make(2);
  ASSERT_TRUE(b->ok());
  // Woken by the abort, never by this deadline (that would be DEADLINE_EXCEEDED).
  const absl::Time far = In(kNeverReached);
  absl::Status seen;
  std::thread waiter([&] { seen = b->at(1)->Recv(0, Tag(0), far).status(); });
  // As a rule the receive blocks by now; one that starts after the abort fails the same
  // way (below), so the outcome does not depend on it.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  b->at(1)->Abort(absl::InternalError("disk on fire"));
  waiter.join();
  EXPECT_EQ(seen.code(), absl::StatusCode::kAborted) << seen;
  EXPECT_THAT(std::string(seen.message()), HasSubstr("rank 1 aborted: disk on fire"));
  EXPECT_FALSE(b->at(1)->Recv(0, Tag(1), far).ok());
  EXPECT_FALSE(b->at(1)->Send(0, Tag(1, 1, TensorKind::kGradient), Tensor::Zeros({1}))
                   ->Wait(far)
                   .ok());
}

// The headline: a 2-rank pipeline of StageExecutors over the transport trains to the same
// losses and weights, bit for bit, as the reference trainer, for each schedule family
// (fill-drain, one-forward-one-backward, split backward).
TYPED_TEST(TransportContractTest, APipelineTrainsLikeTheReferenceTrainer) {
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kGpipe, ScheduleKind::kZbH1}) {
    SCOPED_TRACE(ScheduleKindName(kind));
    absl::StatusOr<baton::v1::JobSpec> parsed = ParseJobSpecJson(R"({
      "model": {"mlp": {"inputDim": 5, "width": 12, "depth": 7, "outputDim": 3}},
      "data": {"synthetic": {"teacherWidth": 6}, "batchSize": 24},
      "optimizer": {"sgd": {"learningRate": 0.05, "momentum": 0.9}},
      "pipeline": {"stages": 2, "microbatches": 4},
      "steps": 2, "seed": 5})");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    baton::v1::JobSpec spec = *parsed;
    spec.mutable_pipeline()->set_schedule(
        static_cast<baton::v1::Schedule>(ScheduleEntryOf(kind).spec_value));
    ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());

    auto ref = ReferenceTrainer::Create(spec);
    ASSERT_TRUE(ref.ok()) << ref.status();
    std::vector<float> ref_losses;
    for (int i = 0; i < spec.steps(); ++i) {
      auto s = (*ref)->Step();
      ASSERT_TRUE(s.ok()) << s.status();
      ref_losses.push_back(s->loss);
    }

    ScheduleOptions so;
    so.kind = kind;
    so.num_ranks = 2;
    so.num_microbatches = 4;
    absl::StatusOr<Schedule> schedule = BuildSchedule(so);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    absl::StatusOr<std::vector<BlockRange>> blocks =
        PartitionBlocks(DescribeBlocks(spec.model()), schedule->num_stages());
    ASSERT_TRUE(blocks.ok()) << blocks.status();

    auto b = this->Make(2);
    ASSERT_TRUE(b->ok());
    StageExecutorOptions eo;
    eo.job_id = kJob;
    eo.recv_timeout = kHangBound;
    std::vector<std::unique_ptr<StageExecutor>> ex;
    for (int r = 0; r < 2; ++r) {
      absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
      ASSERT_TRUE(valid.ok()) << valid.status();
      auto e = StageExecutor::Create(*valid, *schedule, *blocks, r, b->at(r), eo);
      ASSERT_TRUE(e.ok()) << e.status();
      ex.push_back(*std::move(e));
    }
    std::vector<float> losses;
    for (int64_t step = 0; step < spec.steps(); ++step) {
      std::vector<absl::StatusOr<RankStepResult>> results(2, absl::UnknownError("not run"));
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] { results[r] = ex[r]->RunStep(step); });
      }
      for (auto& t : threads) t.join();
      for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
      double sum = 0.0;
      for (float l : results[1]->losses) sum += l;  // rank 1 owns the last stage
      losses.push_back(static_cast<float>(sum / 4.0));
    }
    std::vector<Digest> digests(blocks->back().last);
    for (auto& e : ex) {
      absl::StatusOr<std::vector<std::pair<int, Digest>>> d = e->BlockDigests();
      ASSERT_TRUE(d.ok()) << d.status();
      for (const auto& [block, digest] : *d) digests[block] = digest;
    }
    EXPECT_EQ(losses, ref_losses);
    EXPECT_EQ(DigestHex(CombineBlockDigests(digests)), DigestHex((*ref)->WeightsDigest()));
    b->ExpectDrained();
  }
}

}  // namespace
}  // namespace baton
