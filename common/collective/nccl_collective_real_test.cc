// The NCCL engine on a real GPU with the real library. One GPU holds one member (NCCL will
// not put two ranks of a communicator on one device), so on one GPU this checks a
// one-member group's calls (the same NCCL calls and kernel as a larger group) and,
// directly, the ordered-sum kernel against the CPU's sum bit for bit: the part of the
// engine the fake (nccl_collective_test.cc) cannot run. With two GPUs, a two-member group
// too (skipped, saying so, with fewer). Skips without a CUDA device
// or NCCL; fails instead under BATON_REQUIRE_GPU (scripts/gpu-test.sh). ctest label gpu.
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common/collective/nccl_collective.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_test_util.h"
#include "common/nccl/nccl_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(NcclCollectiveRealTest, TheOrderedSumKernelAddsTheMembersInOrderBitForBit) {
  BATON_NCCL_OR_SKIP(api);
  constexpr int kMembers = 3;
  constexpr size_t kN = 100003;
  std::vector<float> gathered(kMembers * kN);
  for (size_t i = 0; i < gathered.size(); ++i) {
    // Magnitudes far apart, so that another order gives other bits.
    gathered[i] =
        static_cast<float>(std::sin(0.1 * static_cast<double>(i))) * (i % 7 == 0 ? 1e7f : 1.0f);
  }
  absl::StatusOr<void*> src = api->DeviceAlloc(gathered.size() * sizeof(float), 0);
  absl::StatusOr<void*> dst = api->DeviceAlloc(kN * sizeof(float), 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  absl::StatusOr<CudaStream> stream = api->StreamCreate(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(
      CudaCopy(*src, gathered.data(), gathered.size() * sizeof(float), CopyKind::kHostToDevice)
          .ok());
  ASSERT_TRUE(api->OrderedSum(static_cast<float*>(*dst), static_cast<const float*>(*src), kMembers,
                              kN, *stream)
                  .ok());
  absl::StatusOr<CudaEvent> done = api->EventCreate(0);
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(api->EventRecord(*done, *stream).ok());
  ASSERT_TRUE(Reached(api, *done, absl::Seconds(30))) << "the kernel did not complete";
  std::vector<float> got(kN);
  ASSERT_TRUE(CudaCopy(got.data(), *dst, kN * sizeof(float), CopyKind::kDeviceToHost).ok());
  for (size_t i = 0; i < kN; ++i) {
    float want = gathered[i];
    for (int m = 1; m < kMembers; ++m) want = want + gathered[m * kN + i];
    ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0) << i;
  }
  EXPECT_TRUE(api->EventDestroy(*done).ok());
  EXPECT_TRUE(api->StreamDestroy(*stream).ok());
  EXPECT_TRUE(api->DeviceFree(*src).ok());
  EXPECT_TRUE(api->DeviceFree(*dst).ok());
}

// A one-member group through the real library, both modes: the data comes back unchanged
// (the sum of one), through ncclAllGather + the kernel, or ncclAllReduce.
TEST(NcclCollectiveRealTest, AOneMemberGroupJoinsAndReducesInBothModes) {
  BATON_NCCL_OR_SKIP(api);
  for (bool ordered : {true, false}) {
    NcclCollectiveOptions o;
    o.api = api;
    ASSERT_EQ(api->GetUniqueId(&o.id), NcclResult::kSuccess);
    o.ordered = ordered;
    o.init_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<NcclCollective>> c = NcclCollective::Connect(0, 1, o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->device(), Device::kCuda);
    std::vector<float> host = {1.5f, -2.25f, 3e7f, 1e-7f};
    absl::StatusOr<void*> buf = api->DeviceAlloc(host.size() * sizeof(float), 0);
    ASSERT_TRUE(buf.ok());
    ASSERT_TRUE(
        CudaCopy(*buf, host.data(), host.size() * sizeof(float), CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(
        (*c)->AllReduceSum(static_cast<float*>(*buf), 4, absl::Now() + absl::Seconds(30)).ok());
    std::vector<float> back(4);
    ASSERT_TRUE(
        CudaCopy(back.data(), *buf, back.size() * sizeof(float), CopyKind::kDeviceToHost).ok());
    EXPECT_EQ(back, host) << (ordered ? "ordered" : "fast");
    c->reset();
    EXPECT_TRUE(api->DeviceFree(*buf).ok());
  }
}

// A one-member group that follows the compute stream: the buffer is written by a copy still
// queued on that stream (a large one, from pageable memory, so that it is likely still
// running) when AllReduceSum is called, and the result is what the copy wrote.
TEST(NcclCollectiveRealTest, AnEngineThatFollowsTheComputeStreamReadsWhatItQueued) {
  BATON_NCCL_OR_SKIP(api);
  constexpr size_t kN = size_t{1} << 24;
  NcclCollectiveOptions o;
  o.api = api;
  ASSERT_EQ(api->GetUniqueId(&o.id), NcclResult::kSuccess);
  o.init_timeout = absl::Seconds(30);
  o.compute_stream = CudaComputeStream();
  ASSERT_NE(o.compute_stream, nullptr);
  absl::StatusOr<std::unique_ptr<NcclCollective>> c = NcclCollective::Connect(0, 1, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->follows_compute_stream());
  std::vector<float> host(kN);
  for (size_t i = 0; i < kN; ++i) host[i] = static_cast<float>(i % 1000) - 0.5f;
  absl::StatusOr<void*> staged = api->DeviceAlloc(kN * sizeof(float), 0);
  absl::StatusOr<void*> buf = api->DeviceAlloc(kN * sizeof(float), 0);
  ASSERT_TRUE(staged.ok() && buf.ok());
  ASSERT_TRUE(CudaCopy(*staged, host.data(), kN * sizeof(float), CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(CudaZero(*buf, kN * sizeof(float)).ok());
  ASSERT_TRUE(CudaSynchronize().ok());
  // Queued, not waited for: the engine must order itself after it.
  ASSERT_TRUE(CudaCopyDeviceAsync(*buf, *staged, kN * sizeof(float)).ok());
  ASSERT_TRUE(
      (*c)->AllReduceSum(static_cast<float*>(*buf), kN, absl::Now() + absl::Seconds(30)).ok());
  std::vector<float> back(kN);
  ASSERT_TRUE(CudaCopy(back.data(), *buf, kN * sizeof(float), CopyKind::kDeviceToHost).ok());
  EXPECT_EQ(back, host);
  c->reset();
  EXPECT_TRUE(api->DeviceFree(*buf).ok());
  EXPECT_TRUE(api->DeviceFree(*staged).ok());
}

// Two members on two GPUs, ordered mode: every member ends with the sum in member order,
// bit for bit (the engine's contract), through the real ncclAllGather.
TEST(NcclCollectiveRealTest, TwoMembersOnTwoGpusSumInMemberOrderBitForBit) {
  BATON_SKIP_WITHOUT_CUDA_DEVICES(2);
  BATON_NCCL_OR_SKIP(api);
  constexpr size_t kN = 65537;
  NcclUniqueId id;
  ASSERT_EQ(api->GetUniqueId(&id), NcclResult::kSuccess);
  auto value = [](int member, size_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + member)) *
           (i % 5 == static_cast<size_t>(member) ? 3e7f : 1.0f);
  };
  std::vector<float> got[2];
  std::thread members[2];
  for (int m = 0; m < 2; ++m) {
    members[m] = std::thread([&, m] {
      NcclCollectiveOptions o;
      o.api = api;
      o.id = id;
      o.ordered = true;
      o.cuda_device = m;
      o.init_timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<NcclCollective>> c = NcclCollective::Connect(m, 2, o);
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<CudaStream> stream = api->StreamCreate(m);
      absl::StatusOr<CudaEvent> done = api->EventCreate(m);
      absl::StatusOr<void*> dev = api->DeviceAlloc(kN * sizeof(float), m);
      absl::StatusOr<void*> host = api->HostAlloc(kN * sizeof(float));
      ASSERT_TRUE(stream.ok() && done.ok() && dev.ok() && host.ok());
      float* h = static_cast<float*>(*host);
      for (size_t i = 0; i < kN; ++i) h[i] = value(m, i);
      ASSERT_TRUE(api->MemcpyAsync(*dev, h, kN * sizeof(float), *stream).ok());
      ASSERT_TRUE(api->EventRecord(*done, *stream).ok());
      ASSERT_TRUE(Reached(api, *done, absl::Seconds(30)));
      ASSERT_TRUE(
          (*c)->AllReduceSum(static_cast<float*>(*dev), kN, absl::Now() + absl::Seconds(60)).ok());
      ASSERT_TRUE(api->MemcpyAsync(h, *dev, kN * sizeof(float), *stream).ok());
      ASSERT_TRUE(api->EventRecord(*done, *stream).ok());
      ASSERT_TRUE(Reached(api, *done, absl::Seconds(30)));
      got[m].assign(h, h + kN);
      c->reset();
      EXPECT_TRUE(api->HostFree(*host).ok());
      EXPECT_TRUE(api->DeviceFree(*dev).ok());
      EXPECT_TRUE(api->EventDestroy(*done).ok());
      EXPECT_TRUE(api->StreamDestroy(*stream).ok());
    });
  }
  for (std::thread& t : members) t.join();
  ASSERT_EQ(got[0].size(), kN);
  ASSERT_EQ(got[1].size(), kN);
  for (size_t i = 0; i < kN; ++i) {
    const float want = value(0, i) + value(1, i);
    ASSERT_EQ(std::memcmp(&got[0][i], &want, sizeof(float)), 0) << i;
    ASSERT_EQ(std::memcmp(&got[1][i], &want, sizeof(float)), 0) << i;
  }
}

}  // namespace
}  // namespace baton
