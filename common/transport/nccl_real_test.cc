// The real NCCL, loaded by LoadNccl, on a real GPU. One process has one GPU and NCCL will
// not put two ranks of a communicator on one device, so these tests use one-rank
// communicators (a rank may send to itself inside a group) and a two-rank communicator
// whose other rank never comes, for the bring-up deadline. The transport's own logic is
// tested on the fake (nccl_transport_test.cc); this checks that the calls it makes behave
// as the fake assumes. Skips without a CUDA device or without NCCL, unless
// BATON_REQUIRE_GPU is set (scripts/gpu-test.sh): then that is a failure. ctest label gpu.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/core/backend.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_device.h"
#include "common/core/cuda_test_util.h"
#include "common/core/tensor.h"
#include "common/nccl/nccl_api.h"
#include "common/nccl/nccl_test_util.h"
#include "common/transport/nccl_transport.h"

namespace baton {
namespace {

// Polls the communicator until it is no longer in progress or `timeout` passes.
NcclResult Settle(NcclApi* api, NcclComm comm, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  NcclResult state = NcclResult::kInProgress;
  while (absl::Now() < deadline) {
    const NcclResult r = api->CommGetAsyncError(comm, &state);
    if (r != NcclResult::kSuccess) return r;
    if (state != NcclResult::kInProgress) return state;
    absl::SleepFor(absl::Microseconds(100));
  }
  return NcclResult::kInProgress;
}

TEST(NcclRealTest, LoadsAndDescribesItself) {
  BATON_NCCL_OR_SKIP(api);
  EXPECT_NE(api->Describe().find("nccl 2."), std::string::npos) << api->Describe();
  EXPECT_EQ(api->device(), Device::kCuda);
  EXPECT_FALSE(api->ErrorString(NcclResult::kRemoteError).empty());
  // Loaded once: the same object every time.
  EXPECT_EQ(*LoadNccl(), api);
}

// The transport's path on one rank: the "compute" stream writes a device buffer, the comm
// stream waits for it through an event, NCCL moves it (to this same rank), the compute
// stream waits for the comm stream, and the bytes arrive intact.
TEST(NcclRealTest, OneRankCommunicatorSendsADeviceBufferToItself) {
  BATON_NCCL_OR_SKIP(api);
  ASSERT_TRUE(api->SetDevice(0).ok());
  NcclUniqueId id;
  ASSERT_EQ(api->GetUniqueId(&id), NcclResult::kSuccess);
  NcclComm comm = nullptr;
  const NcclResult init = api->CommInitRank(&comm, 1, id, 0, /*cuda_device=*/0);
  ASSERT_TRUE(init == NcclResult::kSuccess || init == NcclResult::kInProgress)
      << NcclResultName(init) << ": " << api->LastError(comm);
  ASSERT_EQ(Settle(api, comm, absl::Seconds(60)), NcclResult::kSuccess) << api->LastError(comm);

  constexpr size_t kBytes = (size_t{1} << 22) + 12;  // not a multiple of anything nice
  auto compute = api->StreamCreate(0);
  auto comm_stream = api->StreamCreate(0);
  auto ready = api->EventCreate(0);
  auto done = api->EventCreate(0);
  auto back = api->EventCreate(0);
  auto src = api->DeviceAlloc(kBytes, 0);
  auto dst = api->DeviceAlloc(kBytes, 0);
  auto host_src = api->HostAlloc(kBytes);
  auto host_dst = api->HostAlloc(kBytes);
  ASSERT_TRUE(compute.ok() && comm_stream.ok() && ready.ok() && done.ok() && back.ok() &&
              src.ok() && dst.ok() && host_src.ok() && host_dst.ok());
  auto* in = static_cast<unsigned char*>(*host_src);
  for (size_t i = 0; i < kBytes; ++i) in[i] = static_cast<unsigned char>(i * 131 + 7);
  std::memset(*host_dst, 0, kBytes);

  ASSERT_TRUE(api->MemcpyAsync(*src, *host_src, kBytes, *compute).ok());
  ASSERT_TRUE(api->EventRecord(*ready, *compute).ok());
  ASSERT_TRUE(api->StreamWaitEvent(*comm_stream, *ready).ok());
  ASSERT_EQ(api->GroupStart(), NcclResult::kSuccess);
  ASSERT_EQ(api->Send(*src, kBytes, 0, comm, *comm_stream), NcclResult::kSuccess);
  ASSERT_EQ(api->Recv(*dst, kBytes, 0, comm, *comm_stream), NcclResult::kSuccess);
  const NcclResult group = api->GroupEnd();
  ASSERT_TRUE(group == NcclResult::kSuccess || group == NcclResult::kInProgress)
      << NcclResultName(group) << ": " << api->LastError(comm);
  // Enqueued only once the communicator is no longer in progress.
  ASSERT_EQ(Settle(api, comm, absl::Seconds(30)), NcclResult::kSuccess) << api->LastError(comm);
  ASSERT_TRUE(api->EventRecord(*done, *comm_stream).ok());
  ASSERT_TRUE(Reached(api, *done, absl::Seconds(30))) << "the transfer did not complete";
  ASSERT_TRUE(api->StreamWaitEvent(*compute, *done).ok());
  ASSERT_TRUE(api->MemcpyAsync(*host_dst, *dst, kBytes, *compute).ok());
  ASSERT_TRUE(api->EventRecord(*back, *compute).ok());
  ASSERT_TRUE(Reached(api, *back, absl::Seconds(30)));
  EXPECT_EQ(std::memcmp(*host_src, *host_dst, kBytes), 0);

  // The transport's graceful close: finalize, wait, release.
  const NcclResult fin = api->CommFinalize(comm);
  EXPECT_TRUE(fin == NcclResult::kSuccess || fin == NcclResult::kInProgress) << NcclResultName(fin);
  EXPECT_EQ(Settle(api, comm, absl::Seconds(30)), NcclResult::kSuccess);
  EXPECT_EQ(api->CommAbort(comm), NcclResult::kSuccess);
  for (CudaEvent e : {*ready, *done, *back}) EXPECT_TRUE(api->EventDestroy(e).ok());
  EXPECT_TRUE(api->StreamDestroy(*compute).ok());
  EXPECT_TRUE(api->StreamDestroy(*comm_stream).ok());
  EXPECT_TRUE(api->DeviceFree(*src).ok());
  EXPECT_TRUE(api->DeviceFree(*dst).ok());
  EXPECT_TRUE(api->HostFree(*host_src).ok());
  EXPECT_TRUE(api->HostFree(*host_dst).ok());
}

// Bring-up with a peer that never comes: a non-blocking init stays in progress, and
// CommAbort ends it promptly (the transport's init deadline relies on both).
TEST(NcclRealTest, InitWhosePeerNeverComesStaysInProgressAndAborts) {
  BATON_NCCL_OR_SKIP(api);
  NcclUniqueId id;
  ASSERT_EQ(api->GetUniqueId(&id), NcclResult::kSuccess);
  NcclComm comm = nullptr;
  const NcclResult init = api->CommInitRank(&comm, 2, id, 0, /*cuda_device=*/0);
  ASSERT_EQ(init, NcclResult::kInProgress) << NcclResultName(init) << ": " << api->LastError(comm);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(Settle(api, comm, absl::Milliseconds(500)), NcclResult::kInProgress);
  EXPECT_EQ(api->CommAbort(comm), NcclResult::kSuccess);  // returns: it did not wait
}

TEST(NcclRealTest, UnrecordedEventIsComplete) {
  BATON_NCCL_OR_SKIP(api);
  auto e = api->EventCreate(0);
  ASSERT_TRUE(e.ok()) << e.status();
  auto q = api->EventQuery(*e);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(*q);
  EXPECT_TRUE(api->EventDestroy(*e).ok());
}

// Polling an event that is still pending leaves "not ready" as the thread's last CUDA
// error unless the poll clears it: the next kernel launched on that thread then reported
// it as its own failure ("device not ready"), failing the step after every receive poll.
TEST(NcclRealTest, APollThatFindsAnEventPendingDoesNotFailTheNextKernel) {
  BATON_NCCL_OR_SKIP(api);
  ASSERT_TRUE(api->SetDevice(0).ok());
  absl::StatusOr<CudaStream> stream = api->StreamCreate(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<CudaEvent> event = api->EventCreate(0);
  ASSERT_TRUE(event.ok()) << event.status();
  // Hold the stream until the poll is done, then mark it: the event is pending when
  // polled, however the threads run.
  std::atomic<bool> polled{false};
  ASSERT_EQ(cudaLaunchHostFunc(
                reinterpret_cast<cudaStream_t>(*stream),
                [](void* flag) {
                  while (!static_cast<std::atomic<bool>*>(flag)->load()) usleep(1000);
                },
                &polled),
            cudaSuccess);
  ASSERT_TRUE(api->EventRecord(*event, *stream).ok());
  absl::StatusOr<bool> done = api->EventQuery(*event);
  polled = true;
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_FALSE(*done) << "the event was not pending: the test proves nothing";
  // A kernel on the same thread, then its check.
  Tensor x = Tensor::Empty({4096}, DType::kFloat32, Device::kCuda);
  absl::StatusOr<Backend*> be = BackendFor(Device::kCuda);
  ASSERT_TRUE(be.ok()) << be.status();
  (*be)->Fill(4096, 2.5f, x.f32());
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
  std::vector<float> host(4096);
  ASSERT_TRUE(x.CopyToHost(host.data()).ok());
  EXPECT_EQ(host[4095], 2.5f);
  ASSERT_TRUE(Reached(api, *event, absl::Seconds(60)));
  EXPECT_TRUE(api->EventDestroy(*event).ok());
  EXPECT_TRUE(api->StreamDestroy(*stream).ok());
}

// Two ranks on two GPUs, the way a worker pair runs: the NCCL transport's four
// communicators come up, handshakes and all, in one global order.
TEST(NcclRealTest, TwoRanksOnTwoGpusBringUpTheirCommunicators) {
  BATON_SKIP_WITHOUT_CUDA_DEVICES(2);
  BATON_NCCL_OR_SKIP(api);
  InMemoryNcclIdExchange ids;
  std::unique_ptr<NcclTransport> t[2];
  absl::Status started[2];
  CudaStream computes[2] = {nullptr, nullptr};
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      NcclTransport::Options o;
      o.rank = r;
      o.num_ranks = 2;
      o.job_key = 77;
      o.peers = {1 - r};
      o.init_timeout = absl::Seconds(60);
      o.cuda_device = r;
      o.api = api;
      o.ids = &ids;
      absl::StatusOr<CudaStream> compute = api->StreamCreate(r);
      ASSERT_TRUE(compute.ok());
      computes[r] = *compute;
      o.compute_stream = reinterpret_cast<void*>(*compute);
      absl::StatusOr<std::unique_ptr<NcclTransport>> made = NcclTransport::Create(o);
      started[r] = made.status();
      if (made.ok()) t[r] = *std::move(made);
    });
  }
  for (std::thread& th : ranks) th.join();
  EXPECT_TRUE(started[0].ok()) << started[0];
  EXPECT_TRUE(started[1].ok()) << started[1];
  for (auto& one : t) one.reset();
  for (CudaStream s : computes) {
    if (s != nullptr) {
      EXPECT_TRUE(api->StreamDestroy(s).ok());
    }
  }
}

}  // namespace
}  // namespace baton
