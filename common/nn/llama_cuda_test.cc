// The LLaMA block on CUDA against the same block on the CPU: same parameters (drawn on the
// host from (seed, name)), same input, forward, backward and weight gradients within
// rounding. The CUDA modules are the CPU modules' code calling the CUDA backend, so what
// differs is the kernels' rounding (cuBLAS GEMMs, tree reductions, the device's expf):
// |cuda - cpu| <= atol + rtol |cpu| with atol 1e-4, rtol 1e-3 on O(1) values, after ~10
// kernels of relative error ~1e-6 each. Skips without a CUDA device; fails instead under
// BATON_REQUIRE_GPU (ctest label gpu, scripts/gpu-test.sh).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/core/cuda_test_util.h"
#include "common/nn/grad_check_test_util.h"
#include "common/nn/llama.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::testing::PerturbParameters;
using ::baton::testing::RandomTensor;

std::vector<float> HostOf(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(t.CopyToHost(v.data()).ok());
  return v;
}

void ExpectNear(const std::vector<float>& got, const Tensor& want, double atol, double rtol,
                const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want.f32()[i];
    const double tol = atol + rtol * std::fabs(w);
    if (!(std::fabs(got[i] - w) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", cpu " << w
                    << " (tolerance " << tol << ")";
      return;
    }
  }
}

// Copies the CPU block's (perturbed) parameter values into the CUDA block.
void CopyParameters(Module& from, Module& to) {
  const std::vector<Parameter*> a = from.Parameters(), b = to.Parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]->name, b[i]->name);
    ASSERT_TRUE(b[i]->value.CopyFromHost(a[i]->value.f32()).ok());
  }
}

TEST(LlamaCudaTest, BlockMatchesTheCpu) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t B, T, C, H, KVH, I;
  };
  for (const Case& c :
       {Case{2, 16, 64, 4, 2, 96}, Case{2, 33, 32, 2, 2, 64}, Case{1, 64, 128, 8, 1, 160}}) {
    SCOPED_TRACE(absl::StrCat("B ", c.B, " T ", c.T, " C ", c.C, " H ", c.H, " KVH ", c.KVH));
    LlamaBlock cpu("block.0", c.C, c.H, c.KVH, c.I, 10000.0f, 1e-5f, 2, 11, Device::kCpu);
    LlamaBlock cuda("block.0", c.C, c.H, c.KVH, c.I, 10000.0f, 1e-5f, 2, 11, Device::kCuda);
    PerturbParameters(cpu, 11, 0.05f);
    CopyParameters(cpu, cuda);
    const Tensor x = RandomTensor({c.B, c.T, c.C}, 12, "x");
    const Tensor dy = RandomTensor({c.B, c.T, c.C}, 12, "dy");
    Tensor y, dx;
    ASSERT_TRUE(cpu.Forward({0, nullptr}, x, &y).ok());
    ASSERT_TRUE(cpu.Backward({0, nullptr}, dy, &dx).ok());
    absl::StatusOr<Tensor> xd = x.On(Device::kCuda), dyd = dy.On(Device::kCuda);
    ASSERT_TRUE(xd.ok() && dyd.ok());
    Tensor yd, dxd;
    ASSERT_TRUE(cuda.Forward({0, nullptr}, *xd, &yd).ok());
    ASSERT_TRUE(cuda.Backward({0, nullptr}, *dyd, &dxd).ok());
    ASSERT_TRUE(DeviceSynchronize(Device::kCuda).ok());
    EXPECT_EQ(yd.device(), Device::kCuda);
    ExpectNear(HostOf(yd), y, 1e-4, 1e-3, "y");
    ExpectNear(HostOf(dxd), dx, 1e-4, 1e-3, "dx");
    const std::vector<Parameter*> pc = cpu.Parameters(), pd = cuda.Parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      ExpectNear(HostOf(pd[i]->grad), pc[i]->grad, 1e-4, 1e-3, pc[i]->name + " grad");
    }
    EXPECT_EQ(cuda.InFlight(), 0);
  }
}

}  // namespace
}  // namespace baton
