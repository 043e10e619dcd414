// The CUDA backend against the CPU backend, kernel by kernel, on the same random inputs.
//
// Tolerances: the element-wise kernels and the in-order column reductions compute the CPU's
// expressions in the same order (cuda_kernels.cu is compiled with --fmad=false), so they
// must match bit for bit. GEMMs (cuBLAS vs OpenBLAS blocking) and row reductions (a fixed
// tree vs the CPU's sequential sum) round differently: |cuda - cpu| <= atol + rtol * |cpu|
// with the bounds each test states. Every CUDA kernel must also give the same bits when run
// twice. Skips without a CUDA device; fails instead under BATON_REQUIRE_GPU (ctest label
// gpu, scripts/gpu-test.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/bf16.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_device.h"
#include "common/core/cuda_test_util.h"
#include "common/core/device_timer.h"
#include "common/core/mutex.h"
#include "common/core/rng.h"
#include "common/core/tensor.h"

namespace baton {
namespace {


using Vec = std::vector<float>;

Vec Random(size_t n, const std::string& name, float lo = -1.0f, float hi = 1.0f) {
  Vec v(n);
  RngStream(777, name).FillUniform(v.data(), static_cast<int64_t>(n), lo, hi);
  return v;
}

std::vector<int32_t> RandomIds(size_t n, int32_t bound, const std::string& name) {
  RngStream s(777, name);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(s.UniformInt(i, bound));
  return t;
}

// A device copy of host data, and back.
Tensor Dev(const Vec& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())}, DType::kFloat32, Device::kCuda);
  EXPECT_TRUE(t.CopyFromHost(v.data()).ok());
  return t;
}
Tensor DevIds(const std::vector<int32_t>& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(v.size())}, DType::kInt32, Device::kCuda);
  EXPECT_TRUE(t.CopyFromHost(v.data()).ok());
  return t;
}
Vec Host(const Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(t.CopyToHost(v.data()).ok());
  EXPECT_TRUE(CudaSynchronize().ok());
  return v;
}

void ExpectBitEqual(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", cpu " << want[i];
      return;
    }
  }
}

void ExpectNear(const Vec& got, const Vec& want, double atol, double rtol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", cpu " << want[i]
                    << " (tolerance " << tol << ")";
      return;
    }
  }
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BATON_SKIP_WITHOUT_CUDA_DEVICE();
    cuda_ = CudaBackend();
    ASSERT_NE(cuda_, nullptr);
    EXPECT_EQ(cuda_->device(), Device::kCuda);
  }
  Backend* cpu_ = CpuBackend();
  Backend* cuda_ = nullptr;
};

// GEMM: |cuda - cpu| <= 1e-5 * sqrt(k) * (sum of |a||b| terms' scale): inputs in [-1, 1]
// give terms of magnitude <= 1, so atol = 2e-6 * k, rtol 1e-5.
TEST_F(CudaKernelsTest, GemmEveryTransposeAndBeta) {
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& cs :
       {Case{1, 1, 1}, Case{7, 5, 3}, Case{64, 96, 128}, Case{130, 33, 257}, Case{512, 384, 128}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f}) {
          const std::string tag = absl::StrCat("gemm ", cs.m, "x", cs.n, "x", cs.k, " ta", ta,
                                               " tb", tb, " beta", beta);
          const int64_t lda = (ta ? cs.m : cs.k) + 3, ldb = (tb ? cs.k : cs.n) + 1, ldc = cs.n + 2;
          const Vec a = Random(static_cast<size_t>((ta ? cs.k : cs.m) * lda), tag + "a");
          const Vec b = Random(static_cast<size_t>((tb ? cs.n : cs.k) * ldb), tag + "b");
          Vec c = Random(static_cast<size_t>(cs.m * ldc), tag + "c");
          Tensor da = Dev(a), db = Dev(b), dc = Dev(c);
          cpu_->Gemm(ta, tb, cs.m, cs.n, cs.k, 0.5f, a.data(), lda, b.data(), ldb, beta, c.data(),
                     ldc);
          cuda_->Gemm(ta, tb, cs.m, cs.n, cs.k, 0.5f, da.f32(), lda, db.f32(), ldb, beta, dc.f32(),
                      ldc);
          ExpectNear(Host(dc), c, 2e-6 * static_cast<double>(cs.k), 1e-5, tag);
        }
}
    }
  }
  // k == 0 scales C by beta, as BLAS does.
  Vec c = Random(6, "gemm k0");
  Tensor dc = Dev(c);
  cpu_->Gemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, c.data(), 3);
  cuda_->Gemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, dc.f32(), 3);
  ExpectBitEqual(Host(dc), c, "gemm k=0");
}

// GemmBf16 on cuBLAS's bf16 tensor cores: products of bf16 values are exact, so it agrees
// with the CPU's Gemm on the widened values within float32 accumulation error, for every
// transpose, both betas and padded leading dimensions; and it repeats its own bits.
TEST_F(CudaKernelsTest, GemmBf16AgreesWithTheCpuAndRepeatsItsBits) {
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& cs : {Case{1, 1, 1}, Case{7, 5, 3}, Case{130, 33, 257}, Case{512, 384, 768}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f}) {
          const std::string tag = absl::StrCat("gemm bf16 ", cs.m, "x", cs.n, "x", cs.k, " ta",
                                               ta, " tb", tb, " beta", beta);
          const int64_t lda = (ta ? cs.m : cs.k) + 3, ldb = (tb ? cs.k : cs.n) + 1;
          const int64_t ldc = cs.n + 2;
          const Vec a = Random(static_cast<size_t>((ta ? cs.k : cs.m) * lda), tag + "a");
          const Vec b = Random(static_cast<size_t>((tb ? cs.n : cs.k) * ldb), tag + "b");
          const Vec c0 = Random(static_cast<size_t>(cs.m * ldc), tag + "c");
          std::vector<uint16_t> a_bits(a.size()), b_bits(b.size());
          cpu_->ToBf16(static_cast<int64_t>(a.size()), a.data(), a_bits.data());
          cpu_->ToBf16(static_cast<int64_t>(b.size()), b.data(), b_bits.data());
          Vec want = c0;
          cpu_->GemmBf16(ta, tb, cs.m, cs.n, cs.k, 0.5f, a_bits.data(), lda, b_bits.data(), ldb,
                         beta, want.data(), ldc);
          Tensor da = Tensor::Empty({static_cast<int64_t>(a.size())}, DType::kBFloat16,
                                    Device::kCuda);
          Tensor db = Tensor::Empty({static_cast<int64_t>(b.size())}, DType::kBFloat16,
                                    Device::kCuda);
          ASSERT_TRUE(da.CopyFromHost(a_bits.data()).ok());
          ASSERT_TRUE(db.CopyFromHost(b_bits.data()).ok());
          Tensor dc = Dev(c0), dc2 = Dev(c0);
          cuda_->GemmBf16(ta, tb, cs.m, cs.n, cs.k, 0.5f, da.bf16(), lda, db.bf16(), ldb, beta,
                          dc.f32(), ldc);
          cuda_->GemmBf16(ta, tb, cs.m, cs.n, cs.k, 0.5f, da.bf16(), lda, db.bf16(), ldb, beta,
                          dc2.f32(), ldc);
          ExpectNear(Host(dc), want, 2e-6 * static_cast<double>(cs.k), 1e-5, tag);
          ExpectBitEqual(Host(dc2), Host(dc), tag + " (repeated)");
        }
      }
    }
  }
}

// bf16 rounding and conversion: the CPU's bits exactly (common/core/bf16.h is shared).
TEST_F(CudaKernelsTest, Bf16RoundingAndConversionAreBitExact) {
  const int64_t n = 100003;
  Vec x = Random(static_cast<size_t>(n), "bf16", -1e3f, 1e3f);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = std::numeric_limits<float>::max();
  x[3] = 1.0f + std::ldexp(1.0f, -8);  // a tie
  Vec rounded(x.size());
  cpu_->RoundToBf16(n, x.data(), rounded.data());
  Tensor dx = Dev(x), dy = Dev(x);
  cuda_->RoundToBf16(n, dx.f32(), dy.f32());
  ExpectBitEqual(Host(dy), rounded, "RoundToBf16");
  Tensor bits = Tensor::Empty({n}, DType::kBFloat16, Device::kCuda);
  cuda_->ToBf16(n, dx.f32(), bits.bf16());
  std::vector<uint16_t> want_bits(x.size()), got_bits(x.size());
  cpu_->ToBf16(n, x.data(), want_bits.data());
  ASSERT_TRUE(bits.CopyToHost(got_bits.data()).ok());
  EXPECT_EQ(got_bits, want_bits);
  Tensor back = Tensor::Empty({n}, DType::kFloat32, Device::kCuda);
  cuda_->FromBf16(n, bits.bf16(), back.f32());
  ExpectBitEqual(Host(back), rounded, "FromBf16");
}

// TF32 (SetAllowTf32): on, fp32 products lose precision (a 10-bit mantissa on the inputs)
// but stay within TF32's bound of the CPU; products of bf16 values are TF32-exact, so
// they stay within fp32 accumulation error; off again, the pedantic bits come back.
TEST_F(CudaKernelsTest, Tf32ProductsOnRequestAndPedanticOtherwise) {
  const int64_t m = 256, n = 256, k = 512;
  const Vec a = Random(static_cast<size_t>(m * k), "tf32 a");
  const Vec b = Random(static_cast<size_t>(k * n), "tf32 b");
  Vec want(static_cast<size_t>(m * n));
  cpu_->Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, want.data(), n);
  Tensor da = Dev(a), db = Dev(b), dc = Dev(want);
  auto run = [&]() {
    cuda_->Gemm(false, false, m, n, k, 1.0f, da.f32(), k, db.f32(), n, 0.0f, dc.f32(), n);
    return Host(dc);
  };
  const Vec pedantic = run();
  ExpectNear(pedantic, want, 2e-6 * k, 1e-5, "pedantic");
  cuda_->SetAllowTf32(true);
  const Vec tf32 = run();
  double worst = 0.0;
  for (size_t i = 0; i < tf32.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(tf32[i]) - want[i]));
  }
  EXPECT_GT(worst, 2e-6 * k) << "TF32 on, yet the products are IEEE float32's";
  ExpectNear(tf32, want, 2e-3 * std::sqrt(static_cast<double>(k)), 1e-2, "tf32");
  Vec ab = a, bb = b;
  cpu_->RoundToBf16(m * k, ab.data(), ab.data());
  cpu_->RoundToBf16(k * n, bb.data(), bb.data());
  Vec want_bf(want.size());
  cpu_->Gemm(false, false, m, n, k, 1.0f, ab.data(), k, bb.data(), n, 0.0f, want_bf.data(), n);
  Tensor dab = Dev(ab), dbb = Dev(bb);
  cuda_->Gemm(false, false, m, n, k, 1.0f, dab.f32(), k, dbb.f32(), n, 0.0f, dc.f32(), n);
  ExpectNear(Host(dc), want_bf, 2e-6 * k, 1e-5, "tf32 on bf16 operands");
  cuda_->SetAllowTf32(false);
  ExpectBitEqual(run(), pedantic, "pedantic again");
}

// The fused (flash-style) attention kernels against the CPU's fused kernels, which run the
// same row functions (flash_attention_math.h): they differ only by the device's expf and
// logf against the host's (a few ulps), so outputs agree within 1e-5 relative and input
// gradients within 1e-4; and each kernel repeats its bits.
TEST_F(CudaKernelsTest, FusedAttentionAgreesWithTheCpuAndRepeatsItsBits) {
  struct S {
    int64_t B, T, H, KVH, D;
  };
  for (const S& s : {S{2, 1, 2, 2, 4}, S{2, 37, 4, 2, 16}, S{1, 130, 3, 1, 64},
                     S{2, 64, 2, 2, 128}}) {
    const std::string tag = absl::StrCat("fused B", s.B, " T", s.T, " H", s.H, " KVH", s.KVH,
                                         " D", s.D);
    const int64_t W = (s.H + 2 * s.KVH) * s.D, C = s.H * s.D;
    const Vec qkv = Random(static_cast<size_t>(s.B * s.T * W), tag + " qkv");
    const Vec dy = Random(static_cast<size_t>(s.B * s.T * C), tag + " dy");
    Vec y(static_cast<size_t>(s.B * s.T * C)), lse(static_cast<size_t>(s.B * s.H * s.T));
    Vec dqkv(qkv.size()), delta(lse.size());
    cpu_->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.data(), y.data(), lse.data());
    cpu_->FusedAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.data(), y.data(), lse.data(),
                                 dy.data(), dqkv.data(), delta.data());
    Tensor dq = Dev(qkv), ddy = Dev(dy), dyo = Dev(y), dlse = Dev(lse), dd = Dev(dqkv),
           ddelta = Dev(delta);
    cuda_->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32());
    const Vec y_gpu = Host(dyo), lse_gpu = Host(dlse);
    ExpectNear(y_gpu, y, 1e-6, 1e-5, tag + " y");
    ExpectNear(lse_gpu, lse, 1e-6, 1e-5, tag + " lse");
    cuda_->FusedAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32(),
                                  ddy.f32(), dd.f32(), ddelta.f32());
    const Vec d_gpu = Host(dd);
    ExpectNear(d_gpu, dqkv, 1e-5, 1e-4, tag + " dqkv");
    cuda_->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32());
    ExpectBitEqual(Host(dyo), y_gpu, tag + " y again");
    cuda_->FusedAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32(),
                                  ddy.f32(), dd.f32(), ddelta.f32());
    ExpectBitEqual(Host(dd), d_gpu, tag + " dqkv again");
  }
}

// The tiled bf16 attention (flash_tiles.h) on tensor cores against the CPU, which runs the
// same blocks with the tile products as loops: the two differ in each product's
// accumulation order, which can move a probability across a bf16 rounding boundary, so the
// outputs agree within 0.5% of their largest magnitude and the gradients within 1% (the
// bounds tiled_attention_test holds the CPU to against float32); lse, from exact products
// alone, to float32 rounding. Each kernel repeats its bits. q, k, v and dy hold bf16 values,
// as in a bf16 job. Shapes cross the 64-row tiles, with grouped heads and D = 64 and 128.
TEST_F(CudaKernelsTest, TiledAttentionAgreesWithTheCpuAndRepeatsItsBits) {
  const absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(CurrentCudaDevice());
  ASSERT_TRUE(info.ok()) << info.status();
  if (info->compute_major < 8) {
    GTEST_SKIP() << "the tiled kernels need bf16 tensor cores (sm_80 or later), this is sm_"
                 << info->compute_major << info->compute_minor;
  }
  struct S {
    int64_t B, T, H, KVH, D;
  };
  const auto bound = [](const Vec& want, double rel) {
    double m = 0.0;
    for (float x : want) m = std::max(m, std::fabs(static_cast<double>(x)));
    return rel * m;
  };
  for (const S& s :
       {S{2, 1, 2, 2, 16}, S{2, 37, 4, 2, 64}, S{1, 130, 4, 1, 64}, S{2, 200, 2, 2, 128}}) {
    const std::string tag =
        absl::StrCat("tiled B", s.B, " T", s.T, " H", s.H, " KVH", s.KVH, " D", s.D);
    const int64_t W = (s.H + 2 * s.KVH) * s.D, C = s.H * s.D;
    Vec qkv = Random(static_cast<size_t>(s.B * s.T * W), tag + " qkv", -2.0f, 2.0f);
    Vec dy = Random(static_cast<size_t>(s.B * s.T * C), tag + " dy");
    cpu_->RoundToBf16(static_cast<int64_t>(qkv.size()), qkv.data(), qkv.data());
    cpu_->RoundToBf16(static_cast<int64_t>(dy.size()), dy.data(), dy.data());
    Vec y(static_cast<size_t>(s.B * s.T * C)), lse(static_cast<size_t>(s.B * s.H * s.T));
    Vec dqkv(qkv.size()), delta(lse.size());
    cpu_->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.data(), y.data(), lse.data());
    cpu_->TiledAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.data(), y.data(), lse.data(),
                                 dy.data(), dqkv.data(), delta.data());
    Tensor dq = Dev(qkv), ddy = Dev(dy), dyo = Dev(y), dlse = Dev(lse), ddelta = Dev(delta);
    Tensor dd = Dev(Vec(qkv.size(), std::nanf("")));  // every element is written
    cuda_->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32());
    ASSERT_TRUE(CudaSynchronize().ok()) << tag;
    const Vec y_gpu = Host(dyo), lse_gpu = Host(dlse);
    ExpectNear(y_gpu, y, bound(y, 5e-3), 0.0, tag + " y");
    ExpectNear(lse_gpu, lse, 1e-5, 1e-5, tag + " lse");
    cuda_->TiledAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32(),
                                  ddy.f32(), dd.f32(), ddelta.f32());
    ASSERT_TRUE(CudaSynchronize().ok()) << tag;
    const Vec d_gpu = Host(dd);
    ExpectNear(d_gpu, dqkv, bound(dqkv, 1e-2), 0.0, tag + " dqkv");
    cuda_->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32());
    ExpectBitEqual(Host(dyo), y_gpu, tag + " y again");
    cuda_->TiledAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, dq.f32(), dyo.f32(), dlse.f32(),
                                  ddy.f32(), dd.f32(), ddelta.f32());
    ExpectBitEqual(Host(dd), d_gpu, tag + " dqkv again");
  }
}

TEST_F(CudaKernelsTest, ElementWiseKernelsAreBitExact) {
  const int64_t n = 100003;  // not a multiple of any block size
  const Vec a = Random(n, "ew a", -4.0f, 4.0f), b = Random(n, "ew b", -4.0f, 4.0f);
  Tensor da = Dev(a), db = Dev(b), dout = Dev(Vec(n));
  Vec out(n);
  cpu_->Add(n, a.data(), b.data(), out.data());
  cuda_->Add(n, da.f32(), db.f32(), dout.f32());
  ExpectBitEqual(Host(dout), out, "Add");
  cpu_->Scale(n, -0.37f, a.data(), out.data());
  cuda_->Scale(n, -0.37f, da.f32(), dout.f32());
  ExpectBitEqual(Host(dout), out, "Scale");
  cpu_->Fill(n, 2.5f, out.data());
  cuda_->Fill(n, 2.5f, dout.f32());
  ExpectBitEqual(Host(dout), out, "Fill");
  cpu_->Copy(n, b.data(), out.data());
  cuda_->Copy(n, db.f32(), dout.f32());
  ExpectBitEqual(Host(dout), out, "Copy");
  // GELU over a wide range, both branches of the tanh approximation.
  const int64_t rows = 37, cols = 129;
  const Vec x = Random(rows * cols, "gelu x", -12.0f, 12.0f), bias = Random(cols, "gelu b");
  Vec pre(rows * cols), g(rows * cols);
  Tensor dx = Dev(x), dbias = Dev(bias), dpre = Dev(pre), dg = Dev(g);
  cpu_->BiasGelu(rows, cols, x.data(), bias.data(), pre.data(), g.data(), false);
  cuda_->BiasGelu(rows, cols, dx.f32(), dbias.f32(), dpre.f32(), dg.f32(), false);
  ExpectBitEqual(Host(dpre), pre, "BiasGelu pre");
  ExpectBitEqual(Host(dg), g, "BiasGelu out");
  cpu_->BiasGelu(rows, cols, x.data(), nullptr, pre.data(), g.data(), false);
  cuda_->BiasGelu(rows, cols, dx.f32(), nullptr, dpre.f32(), dg.f32(), false);
  ExpectBitEqual(Host(dg), g, "BiasGelu without bias");
  const Vec dy = Random(rows * cols, "gelu dy");
  Tensor ddy = Dev(dy);
  cpu_->GeluBackward(rows * cols, x.data(), dy.data(), g.data());
  cuda_->GeluBackward(rows * cols, dx.f32(), ddy.f32(), dg.f32());
  ExpectBitEqual(Host(dg), g, "GeluBackward");
  Vec y = Random(rows * cols, "bias y");
  Tensor dyb = Dev(y);
  cpu_->AddBias(rows, cols, bias.data(), y.data(), false);
  cuda_->AddBias(rows, cols, dbias.f32(), dyb.f32(), false);
  ExpectBitEqual(Host(dyb), y, "AddBias");
  // Rounded to bf16 in the same pass (a bf16 job's Linear outputs).
  cpu_->AddBias(rows, cols, bias.data(), y.data(), true);
  cuda_->AddBias(rows, cols, dbias.f32(), dyb.f32(), true);
  ExpectBitEqual(Host(dyb), y, "AddBias rounded to bf16");
  cpu_->BiasGelu(rows, cols, x.data(), bias.data(), pre.data(), g.data(), true);
  cuda_->BiasGelu(rows, cols, dx.f32(), dbias.f32(), dpre.f32(), dg.f32(), true);
  ExpectBitEqual(Host(dpre), pre, "BiasGelu pre, its output rounded");
  ExpectBitEqual(Host(dg), g, "BiasGelu out rounded to bf16");
}

// Column reductions: chunks of 64 rows in order, then the chunks in order, against the
// CPU's rows in order: within float32 accumulation error over `rows` O(1) terms (atol
// 2e-6 per row, rtol 1e-5), and the same bits on a second run. 300 rows are 5 chunks, the
// last one short. The embedding's backward adds each element's rows in order: bit-exact
// (more cases in EmbeddingBackwardIsTheCpusOrderForAnyTokens).
TEST_F(CudaKernelsTest, ColumnReductionsAgreeWithinRoundingAndRepeat) {
  const int64_t rows = 300, cols = 77;
  const double atol = 2e-6 * rows, rtol = 1e-5;
  const Vec dy = Random(rows * cols, "bg dy");
  const Vec dbias0 = Random(cols, "bg acc");  // accumulates into what is there
  Vec dbias = dbias0;
  Tensor ddy = Dev(dy), ddbias = Dev(dbias0), ddbias2 = Dev(dbias0);
  cpu_->BiasGrad(rows, cols, dy.data(), dbias.data());
  cuda_->BiasGrad(rows, cols, ddy.f32(), ddbias.f32());
  cuda_->BiasGrad(rows, cols, ddy.f32(), ddbias2.f32());
  ExpectNear(Host(ddbias), dbias, atol, rtol, "BiasGrad");
  ExpectBitEqual(Host(ddbias2), Host(ddbias), "BiasGrad (repeated)");
  // From bf16 bits: BiasGrad's bits on the widened floats, without the widened copy.
  std::vector<uint16_t> bits(dy.size());
  for (size_t i = 0; i < dy.size(); ++i) bits[i] = FloatToBf16Bits(dy[i]);
  Tensor dbits = Tensor::Empty({rows * cols}, DType::kBFloat16, Device::kCuda);
  ASSERT_TRUE(dbits.CopyFromHost(bits.data()).ok());
  Tensor dwide = Dev(dy), dfrom_bits = Dev(dbias0), dfrom_wide = Dev(dbias0);
  cuda_->FromBf16(rows * cols, dbits.bf16(), dwide.f32());
  cuda_->BiasGrad(rows, cols, dwide.f32(), dfrom_wide.f32());
  cuda_->BiasGradBf16(rows, cols, dbits.bf16(), dfrom_bits.f32());
  ExpectBitEqual(Host(dfrom_bits), Host(dfrom_wide), "BiasGradBf16");

  const Vec x = Random(rows * cols, "ln x");
  const Vec mean = Random(rows, "ln mean"), rstd = Random(rows, "ln rstd", 0.5f, 2.0f);
  Vec dgamma = Random(cols, "ln dg"), dbeta = Random(cols, "ln db");
  Tensor dx = Dev(x), dmean = Dev(mean), drstd = Dev(rstd), ddg = Dev(dgamma), ddb = Dev(dbeta);
  cpu_->LayerNormBackwardWeight(rows, cols, x.data(), mean.data(), rstd.data(), dy.data(),
                                dgamma.data(), dbeta.data());
  cuda_->LayerNormBackwardWeight(rows, cols, dx.f32(), dmean.f32(), drstd.f32(), ddy.f32(),
                                 ddg.f32(), ddb.f32());
  ExpectNear(Host(ddg), dgamma, atol, rtol, "LayerNormBackwardWeight gamma");
  ExpectNear(Host(ddb), dbeta, atol, rtol, "LayerNormBackwardWeight beta");

  const int64_t B = 3, T = 11, C = 40, V = 17;
  const std::vector<int32_t> tokens = RandomIds(B * T, V, "emb tokens");
  const Vec wte = Random(V * C, "emb wte"), wpe = Random(T * C, "emb wpe");
  const Vec dout = Random(B * T * C, "emb dout");
  Vec out(B * T * C), dwte = Random(V * C, "emb dwte"), dwpe = Random(T * C, "emb dwpe");
  Tensor dtok = DevIds(tokens), dwte_in = Dev(wte), dwpe_in = Dev(wpe), dres = Dev(out);
  cpu_->EmbeddingForward(B, T, C, tokens.data(), wte.data(), wpe.data(), out.data());
  cuda_->EmbeddingForward(B, T, C, dtok.i32(), dwte_in.f32(), dwpe_in.f32(), dres.f32());
  ExpectBitEqual(Host(dres), out, "EmbeddingForward");
  Tensor ddout = Dev(dout), ddwte = Dev(dwte), ddwpe = Dev(dwpe);
  cpu_->EmbeddingBackward(B, T, C, tokens.data(), dout.data(), dwte.data(), dwpe.data());
  cuda_->EmbeddingBackward(B, T, C, dtok.i32(), ddout.f32(), ddwte.f32(), ddwpe.f32());
  ExpectBitEqual(Host(ddwte), dwte, "EmbeddingBackward wte");
  ExpectBitEqual(Host(ddwpe), dwpe, "EmbeddingBackward wpe");
}

// EmbeddingBackward sorts the rows by token and adds each token's rows in ascending order:
// the CPU's order for every element, so its bits, whatever the mix of tokens. Cases: many
// repeats of few tokens, 8192 rows of 5 tokens, every row the same token (one run of all
// the rows), channels that are not a multiple of the block (two tiles, the second short),
// without a position table; each run twice for the same bits.
TEST_F(CudaKernelsTest, EmbeddingBackwardIsTheCpusOrderForAnyTokens) {
  struct Case {
    int64_t B, T, C;
    int32_t V;
    bool same_token, positions;
  };
  for (const Case& cs : {Case{4, 50, 40, 3, false, true}, Case{8, 1024, 64, 5, false, true},
                         Case{2, 4096, 24, 7, true, true}, Case{3, 37, 300, 11, false, true},
                         Case{5, 33, 19, 1000, false, false}}) {
    const std::string tag =
        absl::StrCat("embedding B", cs.B, " T", cs.T, " C", cs.C, " V", cs.V,
                     cs.same_token ? " one token" : "", cs.positions ? "" : " no wpe");
    const int64_t R = cs.B * cs.T, C = cs.C;
    std::vector<int32_t> tokens = RandomIds(R, cs.V, tag + " tokens");
    if (cs.same_token) std::fill(tokens.begin(), tokens.end(), cs.V - 1);
    const Vec dout = Random(R * C, tag + " dout");
    const Vec dwte0 = Random(cs.V * C, tag + " dwte"), dwpe0 = Random(cs.T * C, tag + " dwpe");
    Vec dwte = dwte0, dwpe = dwpe0;
    cpu_->EmbeddingBackward(cs.B, cs.T, C, tokens.data(), dout.data(), dwte.data(),
                            cs.positions ? dwpe.data() : nullptr);
    Tensor dtok = DevIds(tokens), ddout = Dev(dout);
    Vec first_wte, first_wpe;
    for (int run = 0; run < 2; ++run) {
      Tensor ddwte = Dev(dwte0), ddwpe = Dev(dwpe0);
      cuda_->EmbeddingBackward(cs.B, cs.T, C, dtok.i32(), ddout.f32(), ddwte.f32(),
                               cs.positions ? ddwpe.f32() : nullptr);
      const Vec got_wte = Host(ddwte), got_wpe = Host(ddwpe);
      ExpectBitEqual(got_wte, dwte, tag + " wte");
      ExpectBitEqual(got_wpe, cs.positions ? dwpe : dwpe0, tag + " wpe");
      if (run == 0) {
        first_wte = got_wte;
        first_wpe = got_wpe;
      } else {
        ExpectBitEqual(got_wte, first_wte, tag + " wte again");
        ExpectBitEqual(got_wpe, first_wpe, tag + " wpe again");
      }
    }
  }
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
}

// The whole-tensor sums are two passes over partitions that depend on n alone: against the
// CPU within relative 1e-12 (double accumulation), the same bits on a second call, and the
// same bits for the same values at an address that is not 16-byte aligned (float loads
// instead of float4: the order does not change). Sizes around the block's round (1024),
// the one-partition limit (8192), the partition cap (512 partitions of 8192) and 3M.
TEST_F(CudaKernelsTest, WholeSumsOfEverySizeRepeatAndIgnoreAlignment) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1023}, int64_t{1025}, int64_t{8191},
                    int64_t{8193}, int64_t{123457}, int64_t{3'000'000}, int64_t{512 * 8192 + 7}}) {
    const std::string tag = absl::StrCat("n ", n);
    const Vec x = Random(n, tag + " x");
    Vec shifted(static_cast<size_t>(n) + 1, 0.0f);  // x at element 1: 4 bytes off alignment
    std::copy(x.begin(), x.end(), shifted.begin() + 1);
    Tensor dx = Dev(x), dshifted = Dev(shifted);
    const double sum = cuda_->Sum(n, dx.f32()), sq = cuda_->SumSquares(n, dx.f32());
    const double want = cpu_->Sum(n, x.data()), want_sq = cpu_->SumSquares(n, x.data());
    EXPECT_NEAR(sum, want, 1e-12 * static_cast<double>(n)) << tag;
    EXPECT_NEAR(sq, want_sq, 1e-12 * want_sq) << tag;
    const double again = cuda_->Sum(n, dx.f32()), sq_again = cuda_->SumSquares(n, dx.f32());
    const double off = cuda_->Sum(n, dshifted.f32() + 1);
    const double sq_off = cuda_->SumSquares(n, dshifted.f32() + 1);
    EXPECT_EQ(std::memcmp(&again, &sum, sizeof(double)), 0) << tag << " sum again";
    EXPECT_EQ(std::memcmp(&sq_again, &sq, sizeof(double)), 0) << tag << " squares again";
    EXPECT_EQ(std::memcmp(&off, &sum, sizeof(double)), 0) << tag << " sum misaligned";
    EXPECT_EQ(std::memcmp(&sq_off, &sq, sizeof(double)), 0) << tag << " squares misaligned";
    // MeanInto and SquaredErrorMeanInto run the same passes, divided on the device.
    Tensor dmean = Tensor::Empty({1}, DType::kFloat32, Device::kCuda);
    cuda_->MeanInto(n, dx.f32(), dmean.f32());
    ExpectBitEqual(Host(dmean), Vec{static_cast<float>(sum / static_cast<double>(n))},
                   tag + " MeanInto");
    Tensor dzero = Dev(Vec(static_cast<size_t>(n), 0.0f)), ddiff = Dev(Vec(static_cast<size_t>(n)));
    cuda_->SquaredErrorMeanInto(n, dx.f32(), dzero.f32(), ddiff.f32(), dmean.f32());
    ExpectBitEqual(Host(dmean), Vec{static_cast<float>(sq / static_cast<double>(n))},
                   tag + " SquaredErrorMeanInto");
  }
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
}

// SumEach and SumSquaresEach: the bits of Sum and SumSquares per tensor, for tensors of one
// and of many partitions, empty ones and a misaligned one, in one call; inf and NaN come
// through (the divergence check relies on them).
TEST_F(CudaKernelsTest, SumEachIsSumPerTensorBitForBit) {
  const Vec a = Random(3'000'000, "each a"), b = Random(8193, "each b", -3.0f, 1.0f);
  const Vec c = Random(7, "each c");
  Vec bad = Random(20000, "each bad");
  bad[12345] = std::numeric_limits<float>::infinity();
  Vec nan = Random(5, "each nan");
  nan[2] = std::numeric_limits<float>::quiet_NaN();
  Tensor da = Dev(a), db = Dev(b), dc = Dev(c), dbad = Dev(bad), dnan = Dev(nan);
  const std::vector<const float*> xs = {da.f32(),   db.f32(),     nullptr,    dc.f32(),
                                        dbad.f32(), da.f32() + 1, dnan.f32(), db.f32()};
  const std::vector<int64_t> ns = {3'000'000, 8193, 0, 7, 20000, 1'000'001, 5, 1};
  for (bool squares : {false, true}) {
    std::vector<double> got(xs.size(), -1.0);
    if (squares) {
      cuda_->SumSquaresEach(xs, ns, got.data());
    } else {
      cuda_->SumEach(xs, ns, got.data());
    }
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = squares ? cuda_->SumSquares(ns[i], xs[i]) : cuda_->Sum(ns[i], xs[i]);
      EXPECT_EQ(std::memcmp(&got[i], &want, sizeof(double)), 0)
          << (squares ? "SumSquaresEach " : "SumEach ") << i << ": " << got[i] << ", alone "
          << want;
    }
    EXPECT_TRUE(std::isinf(got[4])) << got[4];
    EXPECT_TRUE(std::isnan(got[6])) << got[6];
  }
  std::vector<double> none = {-1.0};
  cuda_->SumEach({nullptr}, {int64_t{0}}, none.data());
  EXPECT_EQ(none[0], 0.0);
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
}

// Row reductions: a fixed tree against the CPU's sequential sums: rtol 1e-5, atol 1e-5
// (values O(1)); Sum and SquaredError accumulate in double: relative 1e-12.
TEST_F(CudaKernelsTest, RowReductionsAgreeWithinRounding) {
  const int64_t n = 123457;
  const Vec x = Random(n, "sum x");
  Tensor dx = Dev(x);
  const double want = cpu_->Sum(n, x.data());
  const double got = cuda_->Sum(n, dx.f32());
  EXPECT_NEAR(got, want, 1e-12 * n);
  // MeanInto: the same tree, divided on the device, left there: Sum's bits over n.
  {
    Tensor dmean = Tensor::Empty({1}, DType::kFloat32, Device::kCuda);
    cuda_->MeanInto(n, dx.f32(), dmean.f32());
    ExpectBitEqual(Host(dmean), Vec{static_cast<float>(got / static_cast<double>(n))},
                   "MeanInto");
  }
  // SumSquares: the same tree over the squares; deterministic on the device.
  const double want_sq = cpu_->SumSquares(n, x.data());
  const double got_sq = cuda_->SumSquares(n, dx.f32());
  EXPECT_NEAR(got_sq, want_sq, 1e-12 * want_sq);
  EXPECT_EQ(cuda_->SumSquares(n, dx.f32()), got_sq);
  EXPECT_EQ(cuda_->SumSquares(0, nullptr), 0.0);
  const Vec t = Random(n, "se t");
  Tensor dt = Dev(t), ddiff = Dev(Vec(n));
  Vec diff(n);
  const double se = cpu_->SquaredError(n, x.data(), t.data(), diff.data());
  EXPECT_NEAR(cuda_->SquaredError(n, dx.f32(), dt.f32(), ddiff.f32()), se, 1e-12 * se);
  ExpectBitEqual(Host(ddiff), diff, "SquaredError diff");
  // SquaredErrorMeanInto: the same differences and the same tree as SquaredError, divided on
  // the device and left there.
  {
    const double dse = cuda_->SquaredError(n, dx.f32(), dt.f32(), ddiff.f32());
    Tensor dmean = Tensor::Empty({1}, DType::kFloat32, Device::kCuda);
    Tensor ddiff2 = Dev(Vec(n));
    cuda_->SquaredErrorMeanInto(n, dx.f32(), dt.f32(), ddiff2.f32(), dmean.f32());
    ExpectBitEqual(Host(dmean), Vec{static_cast<float>(dse / static_cast<double>(n))},
                   "SquaredErrorMeanInto");
    ExpectBitEqual(Host(ddiff2), diff, "SquaredErrorMeanInto diff");
  }

  const int64_t rows = 65, cols = 300;
  const Vec lx = Random(rows * cols, "ln fwd x", -3.0f, 3.0f);
  const Vec gamma = Random(cols, "ln gamma", 0.5f, 1.5f), beta = Random(cols, "ln beta");
  Vec y(rows * cols), mean(rows), rstd(rows);
  Tensor dlx = Dev(lx), dgamma = Dev(gamma), dbeta = Dev(beta), dy = Dev(y), dmean = Dev(mean),
         drstd = Dev(rstd);
  cpu_->LayerNormForward(rows, cols, 1e-5f, lx.data(), gamma.data(), beta.data(), y.data(),
                         mean.data(), rstd.data());
  cuda_->LayerNormForward(rows, cols, 1e-5f, dlx.f32(), dgamma.f32(), dbeta.f32(), dy.f32(),
                          dmean.f32(), drstd.f32());
  ExpectNear(Host(dy), y, 1e-5, 1e-5, "LayerNormForward y");
  ExpectNear(Host(dmean), mean, 1e-6, 1e-5, "LayerNormForward mean");
  ExpectNear(Host(drstd), rstd, 1e-6, 1e-5, "LayerNormForward rstd");
  const Vec g = Random(rows * cols, "ln dy");
  Vec dxo(rows * cols);
  Tensor dg = Dev(g), ddx = Dev(dxo);
  // Both from the CPU's statistics, so only the backward's own sums differ.
  Tensor cmean = Dev(mean), crstd = Dev(rstd);
  cpu_->LayerNormBackwardInput(rows, cols, lx.data(), mean.data(), rstd.data(), gamma.data(),
                               g.data(), dxo.data());
  cuda_->LayerNormBackwardInput(rows, cols, dlx.f32(), cmean.f32(), crstd.f32(), dgamma.f32(),
                                dg.f32(), ddx.f32());
  ExpectNear(Host(ddx), dxo, 1e-5, 1e-4, "LayerNormBackwardInput");

  const int64_t R = 33, V = 1000;
  const Vec logits = Random(R * V, "ce logits", -6.0f, 6.0f);
  const std::vector<int32_t> targets = RandomIds(R, V, "ce targets");
  Vec stats(2 * R), losses(R);
  Tensor dl = Dev(logits), dtg = DevIds(targets), dstats = Dev(stats), dloss = Dev(losses);
  cpu_->SoftmaxCrossEntropyForward(R, V, V, logits.data(), targets.data(), stats.data(),
                                   losses.data());
  cuda_->SoftmaxCrossEntropyForward(R, V, V, dl.f32(), dtg.i32(), dstats.f32(), dloss.f32());
  ExpectNear(Host(dstats), stats, 1e-8, 1e-5, "SoftmaxCrossEntropyForward row statistics");
  ExpectNear(Host(dloss), losses, 1e-5, 1e-5, "SoftmaxCrossEntropyForward losses");
  // Backward from the CPU's statistics: element-wise, bit-exact; in place over the logits too.
  Tensor cstats = Dev(stats), dd = Dev(Vec(R * V)), inplace = Dev(logits);
  Vec dlog(R * V);
  cpu_->SoftmaxCrossEntropyBackward(R, V, V, logits.data(), stats.data(), targets.data(), 0.125f,
                                    dlog.data());
  cuda_->SoftmaxCrossEntropyBackward(R, V, V, dl.f32(), cstats.f32(), dtg.i32(), 0.125f, dd.f32());
  cuda_->SoftmaxCrossEntropyBackward(R, V, V, inplace.f32(), cstats.f32(), dtg.i32(), 0.125f,
                                     inplace.f32());
  ExpectBitEqual(Host(inplace), dlog, "SoftmaxCrossEntropyBackward in place");
  ExpectBitEqual(Host(dd), dlog, "SoftmaxCrossEntropyBackward");
  // Rows ld = 1024 apart (the LM head's padded logits): the packed rows' bits, and the
  // columns past V neither read (NaN there changes nothing) nor written.
  const int64_t ld = 1024;
  Vec padded(static_cast<size_t>(R * ld), std::nanf(""));
  cpu_->CopyRows(R, V, logits.data(), V, padded.data(), ld);
  Tensor dp = Dev(padded), pstats = Dev(stats), ploss = Dev(losses);
  cuda_->SoftmaxCrossEntropyForward(R, V, ld, dp.f32(), dtg.i32(), pstats.f32(), ploss.f32());
  ExpectBitEqual(Host(pstats), Host(dstats), "SoftmaxCrossEntropyForward, padded rows");
  ExpectBitEqual(Host(ploss), Host(dloss), "SoftmaxCrossEntropyForward losses, padded rows");
  cuda_->SoftmaxCrossEntropyBackward(R, V, ld, dp.f32(), cstats.f32(), dtg.i32(), 0.125f, dp.f32());
  const Vec back = Host(dp);
  Vec packed(static_cast<size_t>(R * V));
  cpu_->CopyRows(R, V, back.data(), ld, packed.data(), V);
  ExpectBitEqual(packed, dlog, "SoftmaxCrossEntropyBackward, padded rows");
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t v = V; v < ld; ++v) ASSERT_TRUE(std::isnan(back[r * ld + v])) << r << " " << v;
  }
  // CopyRows on the device: the CPU's copy.
  Tensor dpacked = Dev(Vec(static_cast<size_t>(R * V)));
  cuda_->CopyRows(R, V, dp.f32(), ld, dpacked.f32(), V);
  ExpectBitEqual(Host(dpacked), dlog, "CopyRows");
}

// Attention: GEMMs and softmax rows round differently: atol 1e-5, rtol 1e-4.
TEST_F(CudaKernelsTest, AttentionForwardAndBackward) {
  for (int64_t T : {1, 5, 64, 130}) {
    const int64_t B = 2, H = 3, D = 8, C = H * D;
    const std::string tag = absl::StrCat("attention T=", T);
    const Vec qkv = Random(B * T * 3 * C, tag + " qkv");
    Vec att(B * H * T * T), y(B * T * C);
    Tensor dqkv_in = Dev(qkv), datt = Dev(att), dy = Dev(y);
    cpu_->AttentionForward(B, T, H, D, qkv.data(), att.data(), y.data());
    cuda_->AttentionForward(B, T, H, D, dqkv_in.f32(), datt.f32(), dy.f32());
    ExpectNear(Host(datt), att, 1e-6, 1e-4, tag + " att");
    ExpectNear(Host(dy), y, 1e-5, 1e-4, tag + " y");
    const Vec g = Random(B * T * C, tag + " dy");
    Vec dqkv(B * T * 3 * C), scratch(T * T);
    Tensor dg = Dev(g), catt = Dev(att), ddqkv = Dev(dqkv);
    cpu_->AttentionBackward(B, T, H, D, qkv.data(), att.data(), g.data(), dqkv.data(),
                            scratch.data());
    Tensor dscratch = Dev(Vec(H * T * T));
    cuda_->AttentionBackward(B, T, H, D, dqkv_in.f32(), catt.f32(), dg.f32(), ddqkv.f32(),
                             dscratch.f32());
    ExpectNear(Host(ddqkv), dqkv, 1e-5, 1e-4, tag + " dqkv");
  }
}

// Grouped-query attention (kv heads shared by H / KVH query heads): the strided GEMMs per
// group position against the CPU's per-head loop. Tolerances of the multi-head test: atol
// 1e-5, rtol 1e-4 (dk, dv sum up to 4 heads' contributions: atol 2e-5). Run twice: the
// same bits.
TEST_F(CudaKernelsTest, GroupedQueryAttentionForwardAndBackward) {
  struct Case {
    int64_t T, H, KVH;
  };
  for (const Case& cs :
       {Case{1, 4, 2}, Case{5, 4, 1}, Case{64, 8, 2}, Case{130, 6, 3}, Case{33, 4, 4}}) {
    const int64_t B = 2, T = cs.T, H = cs.H, KVH = cs.KVH, D = 8, C = H * D;
    const int64_t W = (H + 2 * KVH) * D;
    const std::string tag = absl::StrCat("gqa T=", T, " H=", H, " KVH=", KVH);
    const Vec qkv = Random(B * T * W, tag + " qkv");
    Vec att(B * H * T * T), y(B * T * C);
    Tensor dqkv_in = Dev(qkv), datt = Dev(att), dy = Dev(y);
    cpu_->AttentionForward(B, T, H, KVH, D, qkv.data(), att.data(), y.data());
    cuda_->AttentionForward(B, T, H, KVH, D, dqkv_in.f32(), datt.f32(), dy.f32());
    ExpectNear(Host(datt), att, 1e-6, 1e-4, tag + " att");
    ExpectNear(Host(dy), y, 1e-5, 1e-4, tag + " y");
    const Vec g = Random(B * T * C, tag + " dy");
    Vec dqkv(B * T * W), scratch(T * T);
    Tensor dg = Dev(g), catt = Dev(att);
    cpu_->AttentionBackward(B, T, H, KVH, D, qkv.data(), att.data(), g.data(), dqkv.data(),
                            scratch.data());
    Vec first;
    for (int run = 0; run < 2; ++run) {
      Tensor ddqkv = Dev(Vec(B * T * W)), dscratch = Dev(Vec(H * T * T));
      cuda_->AttentionBackward(B, T, H, KVH, D, dqkv_in.f32(), catt.f32(), dg.f32(), ddqkv.f32(),
                               dscratch.f32());
      const Vec got = Host(ddqkv);
      if (run == 0) {
        ExpectNear(got, dqkv, 2e-5, 1e-4, tag + " dqkv");
        first = got;
      } else {
        ExpectBitEqual(got, first, tag + " dqkv second run");
      }
    }
  }
}

// AddLayerNormForward's one kernel gives the bits of AddKernel, RoundToBf16Kernel and
// LayerNormForwardKernel in turn (they share LayerNormRow), with and without the rounding.
TEST_F(CudaKernelsTest, FusedResidualLayerNormIsTheThreeKernelsInTurn) {
  const int64_t rows = 65, cols = 300;
  const Vec a = Random(rows * cols, "res a", -3.0f, 3.0f), b = Random(rows * cols, "res b");
  const Vec gamma = Random(cols, "res gamma", 0.5f, 1.5f), beta = Random(cols, "res beta");
  Tensor da = Dev(a), db = Dev(b), dgamma = Dev(gamma), dbeta = Dev(beta);
  for (bool round : {false, true}) {
    const std::string what = round ? "AddLayerNormForward (bf16)" : "AddLayerNormForward";
    Tensor sum = Dev(Vec(rows * cols)), y = Dev(Vec(rows * cols)), mean = Dev(Vec(rows)),
           rstd = Dev(Vec(rows));
    cuda_->AddLayerNormForward(rows, cols, 1e-5f, da.f32(), db.f32(), round, dgamma.f32(),
                               dbeta.f32(), sum.f32(), y.f32(), mean.f32(), rstd.f32());
    Tensor sum2 = Dev(Vec(rows * cols)), y2 = Dev(Vec(rows * cols)), mean2 = Dev(Vec(rows)),
           rstd2 = Dev(Vec(rows));
    cuda_->Add(rows * cols, da.f32(), db.f32(), sum2.f32());
    if (round) cuda_->RoundToBf16(rows * cols, sum2.f32(), sum2.f32());
    cuda_->LayerNormForward(rows, cols, 1e-5f, sum2.f32(), dgamma.f32(), dbeta.f32(), y2.f32(),
                            mean2.f32(), rstd2.f32());
    ExpectBitEqual(Host(sum), Host(sum2), what + " sum");
    ExpectBitEqual(Host(y), Host(y2), what + " y");
    ExpectBitEqual(Host(mean), Host(mean2), what + " mean");
    ExpectBitEqual(Host(rstd), Host(rstd2), what + " rstd");
  }
}

// RMSNorm: the row statistics in a tree (rtol 1e-5, atol 1e-5 on O(1) values, as
// LayerNorm's); the weight gradient in the column reductions' chunks (as BiasGrad's).
TEST_F(CudaKernelsTest, RmsNormForwardAndBackward) {
  const int64_t rows = 65, cols = 300;
  const Vec x = Random(rows * cols, "rms x", -3.0f, 3.0f);
  const Vec gamma = Random(cols, "rms gamma", 0.5f, 1.5f);
  Vec y(rows * cols), rstd(rows);
  Tensor dx = Dev(x), dgamma = Dev(gamma), dy = Dev(y), drstd = Dev(rstd);
  cpu_->RmsNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), y.data(), rstd.data());
  cuda_->RmsNormForward(rows, cols, 1e-5f, dx.f32(), dgamma.f32(), dy.f32(), drstd.f32());
  ExpectNear(Host(dy), y, 1e-5, 1e-5, "RmsNormForward y");
  ExpectNear(Host(drstd), rstd, 1e-6, 1e-5, "RmsNormForward rstd");
  const Vec g = Random(rows * cols, "rms dy");
  Vec dxo(rows * cols);
  Tensor dg = Dev(g), ddx = Dev(dxo), crstd = Dev(rstd);  // the CPU's statistics
  cpu_->RmsNormBackwardInput(rows, cols, x.data(), rstd.data(), gamma.data(), g.data(), dxo.data());
  cuda_->RmsNormBackwardInput(rows, cols, dx.f32(), crstd.f32(), dgamma.f32(), dg.f32(), ddx.f32());
  ExpectNear(Host(ddx), dxo, 1e-5, 1e-4, "RmsNormBackwardInput");
  Vec dgam = Random(cols, "rms dgamma");  // accumulates into what is there
  Tensor ddgam = Dev(dgam);
  cpu_->RmsNormBackwardWeight(rows, cols, x.data(), rstd.data(), g.data(), dgam.data());
  cuda_->RmsNormBackwardWeight(rows, cols, dx.f32(), crstd.f32(), dg.f32(), ddgam.f32());
  ExpectNear(Host(ddgam), dgam, 2e-6 * rows * 3.0, 1e-5, "RmsNormBackwardWeight");
}

// Rotary: the same float32 angles (rotary_math.h, evaluated in double) and element
// expressions; double cos/sin on the two sides may differ in their last double bit, which
// can move a rounded float by an ulp: atol 1e-6 on values O(1) (positions up to 4095,
// theta 10000 and 500000). In place, on heads inside wider rows; the columns around them
// untouched (bit-exact).
TEST_F(CudaKernelsTest, RotaryForwardAndBackward) {
  for (float theta : {10000.0f, 500000.0f}) {
    const int64_t B = 2, T = 4096, heads = 3, D = 16, stride = 80, offset = 8;
    const std::string tag = absl::StrCat("rotary theta=", theta);
    Vec x = Random(B * T * stride, tag + " x", -2.0f, 2.0f);
    Tensor dx = Dev(x);
    cpu_->RotaryForward(B, T, heads, D, stride, theta, x.data() + offset);
    cuda_->RotaryForward(B, T, heads, D, stride, theta, dx.f32() + offset);
    ExpectNear(Host(dx), x, 1e-6, 0.0, tag + " forward");
    cpu_->RotaryBackward(B, T, heads, D, stride, theta, x.data() + offset);
    cuda_->RotaryBackward(B, T, heads, D, stride, theta, dx.f32() + offset);
    const Vec back = Host(dx);
    ExpectNear(back, x, 1e-6, 0.0, tag + " backward");
    const Vec orig = Random(B * T * stride, tag + " x", -2.0f, 2.0f);
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t c : {int64_t{0}, offset - 1, offset + heads * D, stride - 1}) {
        ASSERT_EQ(back[r * stride + c], orig[r * stride + c])
            << tag << " row " << r << " col " << c;
      }
    }
  }
}

// SwiGLU: element-wise, but the device's expf is not glibc's (both within 2 ulp): atol 1e-6,
// rtol 1e-5.
TEST_F(CudaKernelsTest, SwiGluForwardAndBackward) {
  const int64_t rows = 37, I = 129;
  const Vec gu = Random(rows * 2 * I, "swiglu gu", -12.0f, 12.0f);
  const Vec dout = Random(rows * I, "swiglu dout");
  Vec out(rows * I), dgu(rows * 2 * I);
  Tensor dgu_in = Dev(gu), dres = Dev(out), ddout = Dev(dout), ddgu = Dev(dgu);
  cpu_->SwiGluForward(rows, I, gu.data(), out.data());
  cuda_->SwiGluForward(rows, I, dgu_in.f32(), dres.f32());
  ExpectNear(Host(dres), out, 1e-6, 1e-5, "SwiGluForward");
  cpu_->SwiGluBackward(rows, I, gu.data(), dout.data(), dgu.data());
  cuda_->SwiGluBackward(rows, I, dgu_in.f32(), ddout.f32(), ddgu.f32());
  ExpectNear(Host(ddgu), dgu, 1e-6, 1e-5, "SwiGluBackward");
}

TEST_F(CudaKernelsTest, OptimizersAreBitExact) {
  const int64_t n = 4099;
  const Vec w0 = Random(n, "opt w"), g = Random(n, "opt g");
  for (bool first : {true, false}) {
    Vec w = w0, buf = Random(n, "opt buf");
    Tensor dw = Dev(w), dg = Dev(g), dbuf = Dev(buf);
    cpu_->SgdStep(n, 0.1f, 0.9f, 0.01f, first, w.data(), g.data(), buf.data());
    cuda_->SgdStep(n, 0.1f, 0.9f, 0.01f, first, dw.f32(), dg.f32(), dbuf.f32());
    ExpectBitEqual(Host(dw), w, "SgdStep w");
    ExpectBitEqual(Host(dbuf), buf, "SgdStep buf");
  }
  Vec w = w0, m = Random(n, "opt m"), v = Random(n, "opt v", 0.0f, 1.0f);
  Tensor dw = Dev(w), dg = Dev(g), dm = Dev(m), dv = Dev(v);
  cpu_->AdamWStep(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.19f, 0.002f, w.data(), g.data(), m.data(),
                  v.data());
  cuda_->AdamWStep(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.19f, 0.002f, dw.f32(), dg.f32(),
                   dm.f32(), dv.f32());
  ExpectBitEqual(Host(dw), w, "AdamWStep w");
  ExpectBitEqual(Host(dm), m, "AdamWStep m");
  ExpectBitEqual(Host(dv), v, "AdamWStep v");
}

// Every kernel with a reduction, run twice on the same inputs: the same bits.
TEST_F(CudaKernelsTest, RepeatsItsBits) {
  const int64_t B = 2, T = 64, H = 4, D = 16, C = H * D;
  const Vec qkv = Random(B * T * 3 * C, "rep qkv");
  Tensor dq = Dev(qkv);
  Vec first;
  for (int run = 0; run < 2; ++run) {
    Tensor att = Dev(Vec(B * H * T * T)), y = Dev(Vec(B * T * C));
    cuda_->AttentionForward(B, T, H, D, dq.f32(), att.f32(), y.f32());
    Tensor dqkv = Dev(Vec(B * T * 3 * C));
    Tensor scratch = Dev(Vec(H * T * T));
    cuda_->AttentionBackward(B, T, H, D, dq.f32(), att.f32(), y.f32(), dqkv.f32(), scratch.f32());
    Tensor ln = Dev(Vec(B * T * C)), mean = Dev(Vec(B * T)), rstd = Dev(Vec(B * T));
    Tensor ones = Dev(Vec(C, 1.0f)), zeros = Dev(Vec(C, 0.0f));
    cuda_->LayerNormForward(B * T, C, 1e-5f, y.f32(), ones.f32(), zeros.f32(), ln.f32(), mean.f32(),
                            rstd.f32());
    Tensor gemm = Dev(Vec(B * T * C));
    cuda_->Gemm(false, true, B * T, C, 3 * C, 1.0f, dq.f32(), 3 * C, dqkv.f32(), 3 * C, 0.0f,
                gemm.f32(), C);
    Vec all = Host(dqkv);
    for (const Tensor* t : {&att, &ln, &gemm}) {
      const Vec h = Host(*t);
      all.insert(all.end(), h.begin(), h.end());
    }
    const double sum = cuda_->Sum(static_cast<int64_t>(B * T * C), ln.f32());
    all.push_back(static_cast<float>(sum));
    if (run == 0) {
      first = all;
    } else {
      ExpectBitEqual(all, first, "second run");
    }
  }
}

TEST_F(CudaKernelsTest, AllocatorCachesAndReportsOutOfMemory) {
  Allocator* a = CudaAllocator();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->device(), Device::kCuda);
  void* p = a->Allocate(1 << 20);
  ASSERT_NE(p, nullptr);
  a->Deallocate(p, 1 << 20);
  const int64_t before = a->Stats().system_allocations;
  void* q = a->Allocate(1 << 20);  // the cached block, no cudaMalloc
  EXPECT_EQ(q, p);
  EXPECT_EQ(a->Stats().system_allocations, before);
  a->Deallocate(q, 1 << 20);
  // 1 PiB: an error, not an abort, and the device still works afterwards.
  EXPECT_EQ(a->Allocate(size_t{1} << 50), nullptr);
  absl::StatusOr<Tensor> huge =
      Tensor::TryEmpty({int64_t{1} << 48}, DType::kFloat32, Device::kCuda);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("cuda"), std::string::npos) << huge.status();
  const Vec v = Random(1000, "after oom");
  EXPECT_EQ(Host(Dev(v)), v);
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
}

TEST_F(CudaKernelsTest, DeviceChoiceAndCopies) {
  EXPECT_EQ(SetCudaDevice(CudaDeviceCount()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetCudaDevice(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SetCudaDevice(CurrentCudaDevice()).ok());
  // Host -> device -> device -> host, bit for bit; and Tensor::CopyTo across devices.
  const Vec v = Random(5000, "copies");
  Tensor a = Dev(v);
  absl::StatusOr<Tensor> b = a.CopyTo(Device::kCuda);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<Tensor> h = b->CopyTo(Device::kCpu);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(std::memcmp(h->raw(), v.data(), v.size() * sizeof(float)), 0);
  Tensor z = Dev(v);
  z.SetZero();
  EXPECT_EQ(Host(z), Vec(v.size(), 0.0f));
}

// m == 0 or n == 0 touches nothing (the operands may then be null).
TEST_F(CudaKernelsTest, GemmWithNoOutputIsANoOp) {
  const Vec c = Random(12, "gemm empty");
  Tensor dc = Dev(c);
  cuda_->Gemm(false, false, 0, 4, 5, 1.0f, nullptr, 5, nullptr, 4, 0.0f, dc.f32(), 4);
  cuda_->Gemm(true, true, 3, 0, 5, 1.0f, nullptr, 3, nullptr, 5, 0.0f, dc.f32(), 4);
  ExpectBitEqual(Host(dc), c, "gemm with m or n == 0");
  EXPECT_EQ(cuda_->Sum(0, nullptr), 0.0);
  EXPECT_EQ(cuda_->SquaredError(0, nullptr, nullptr, nullptr), 0.0);
}

// The reductions the other tests do not repeat, run twice on the same inputs (fresh outputs
// and fresh accumulators each time): the same bits.
TEST_F(CudaKernelsTest, EveryReductionRepeatsItsBits) {
  const int64_t R = 48, C = 96, V = 517, B = 2, T = 24;
  const Vec logits = Random(R * V, "rep2 logits", -6.0f, 6.0f);
  const std::vector<int32_t> targets = RandomIds(R, V, "rep2 targets");
  const Vec x = Random(R * C, "rep2 x", -3.0f, 3.0f), dy = Random(R * C, "rep2 dy");
  const Vec gamma = Random(C, "rep2 gamma", 0.5f, 1.5f), beta = Random(C, "rep2 beta");
  const Vec acc_c = Random(C, "rep2 acc c");
  const std::vector<int32_t> tokens = RandomIds(B * T, V, "rep2 tokens");
  const Vec acc_wte = Random(V * C, "rep2 wte"), acc_wpe = Random(T * C, "rep2 wpe");
  Tensor dlogits = Dev(logits), dtargets = DevIds(targets), dx = Dev(x), ddy = Dev(dy),
         dgamma = Dev(gamma), dbeta = Dev(beta), dtokens = DevIds(tokens);
  auto run = [&](std::vector<double>* sums) {
    Vec all;
    auto append = [&all](const Tensor& t) {
      const Vec h = Host(t);
      all.insert(all.end(), h.begin(), h.end());
    };
    Tensor stats = Dev(Vec(2 * R)), losses = Dev(Vec(R));
    cuda_->SoftmaxCrossEntropyForward(R, V, V, dlogits.f32(), dtargets.i32(), stats.f32(),
                                      losses.f32());
    append(stats);
    append(losses);
    Tensor y = Dev(Vec(R * C)), mean = Dev(Vec(R)), rstd = Dev(Vec(R));
    cuda_->LayerNormForward(R, C, 1e-5f, dx.f32(), dgamma.f32(), dbeta.f32(), y.f32(), mean.f32(),
                            rstd.f32());
    append(y);
    append(mean);
    append(rstd);
    Tensor dxo = Dev(Vec(R * C));
    cuda_->LayerNormBackwardInput(R, C, dx.f32(), mean.f32(), rstd.f32(), dgamma.f32(), ddy.f32(),
                                  dxo.f32());
    append(dxo);
    Tensor dg = Dev(acc_c), db = Dev(acc_c), dbias = Dev(acc_c);
    cuda_->LayerNormBackwardWeight(R, C, dx.f32(), mean.f32(), rstd.f32(), ddy.f32(), dg.f32(),
                                   db.f32());
    cuda_->BiasGrad(R, C, ddy.f32(), dbias.f32());
    append(dg);
    append(db);
    append(dbias);
    // dout[B*T, C] is dy's first B*T rows.
    Tensor dwte = Dev(acc_wte), dwpe = Dev(acc_wpe);
    cuda_->EmbeddingBackward(B, T, C, dtokens.i32(), ddy.f32(), dwte.f32(), dwpe.f32());
    append(dwte);
    append(dwpe);
    Tensor diff = Dev(Vec(R * C));
    sums->push_back(cuda_->SquaredError(R * C, dx.f32(), ddy.f32(), diff.f32()));
    sums->push_back(cuda_->Sum(R * V, dlogits.f32()));
    append(diff);
    return all;
  };
  std::vector<double> sums1, sums2;
  const Vec first = run(&sums1);
  const Vec second = run(&sums2);
  ExpectBitEqual(second, first, "second run");
  ASSERT_EQ(sums1.size(), sums2.size());
  for (size_t i = 0; i < sums1.size(); ++i) {
    EXPECT_EQ(std::memcmp(&sums1[i], &sums2[i], sizeof(double)), 0)
        << "double result " << i << ": " << sums1[i] << " then " << sums2[i];
  }
}

// Several host threads issue kernels at once (the stage threads of an in-process pipeline):
// each gets the bits it gets alone. Exercises the per-thread device selection, the shared
// cuBLAS handle and the allocator under concurrency.
TEST_F(CudaKernelsTest, ConcurrentHostThreadsGetTheBitsTheyGetAlone) {
  constexpr int kThreadCount = 4;
  const int64_t m = 96, n = 80, k = 72;
  auto work = [&](int id) {
    const std::string tag = absl::StrCat("thread ", id);
    const Vec a = Random(m * k, tag + " a"), b = Random(k * n, tag + " b");
    const Vec bias = Random(n, tag + " bias"), gamma = Random(n, tag + " gamma", 0.5f, 1.5f);
    Tensor da = Dev(a), db = Dev(b), dbias = Dev(bias), dgamma = Dev(gamma);
    Vec all;
    for (int rep = 0; rep < 5; ++rep) {
      Tensor c = Dev(Vec(m * n)), pre = Dev(Vec(m * n)), out = Dev(Vec(m * n));
      Tensor y = Dev(Vec(m * n)), mean = Dev(Vec(m)), rstd = Dev(Vec(m));
      cuda_->Gemm(false, false, m, n, k, 1.0f, da.f32(), k, db.f32(), n, 0.0f, c.f32(), n);
      cuda_->BiasGelu(m, n, c.f32(), dbias.f32(), pre.f32(), out.f32(), false);
      cuda_->LayerNormForward(m, n, 1e-5f, out.f32(), dgamma.f32(), dbias.f32(), y.f32(),
                              mean.f32(), rstd.f32());
      const double sum = cuda_->Sum(m * n, y.f32());
      if (rep == 0) {
        all = Host(y);
        all.push_back(static_cast<float>(sum));
}
    }
    return all;
  };
  std::vector<Vec> alone(kThreadCount), together(kThreadCount);
  for (int i = 0; i < kThreadCount; ++i) alone[i] = work(i);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreadCount; ++i) {
    threads.emplace_back([&, i] { together[i] = work(i); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreadCount; ++i) {
    ExpectBitEqual(together[i], alone[i], absl::StrCat("thread ", i));
  }
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
}

TEST_F(CudaKernelsTest, AllocatorStatsCountRoundedBytes) {
  Allocator* a = CudaAllocator();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(CudaSynchronize().ok());
  a->ReleaseCached();
  const AllocatorStats s0 = a->Stats();
  EXPECT_EQ(s0.bytes_cached, 0);
  const size_t bytes = (size_t{3} << 20) + 5;  // not a multiple of the rounding
  void* p = a->Allocate(bytes);
  ASSERT_NE(p, nullptr);
  const AllocatorStats s1 = a->Stats();
  const int64_t held = s1.bytes_in_use - s0.bytes_in_use;
  EXPECT_GE(held, static_cast<int64_t>(bytes));
  EXPECT_LT(held, static_cast<int64_t>(bytes) + 4096);
  EXPECT_EQ(s1.system_allocations, s0.system_allocations + 1);
  EXPECT_GE(s1.peak_bytes_in_use, s1.bytes_in_use);
  a->Deallocate(p, bytes);
  const AllocatorStats s2 = a->Stats();
  EXPECT_EQ(s2.bytes_in_use, s0.bytes_in_use);
  EXPECT_EQ(s2.bytes_cached, held);
  EXPECT_EQ(s2.peak_bytes_in_use, s1.peak_bytes_in_use);
  // The same size again: the cached block, no cudaMalloc.
  void* q = a->Allocate(bytes);
  EXPECT_EQ(q, p);
  const AllocatorStats s3 = a->Stats();
  EXPECT_EQ(s3.system_allocations, s1.system_allocations);
  EXPECT_EQ(s3.bytes_cached, 0);
  EXPECT_EQ(s3.bytes_in_use, s1.bytes_in_use);
  a->Deallocate(q, bytes);
  a->ReleaseCached();
  EXPECT_EQ(a->Stats().bytes_cached, 0);
  EXPECT_EQ(a->Stats().bytes_in_use, s0.bytes_in_use);
}

TEST_F(CudaKernelsTest, CudaCopyRoundTripAndZero) {
  const Vec v = Random(4097, "cuda copy");
  const size_t bytes = v.size() * sizeof(float);
  Allocator* a = CudaAllocator();
  ASSERT_NE(a, nullptr);
  void* d1 = a->Allocate(bytes);
  void* d2 = a->Allocate(bytes);
  ASSERT_NE(d1, nullptr);
  ASSERT_NE(d2, nullptr);
  ASSERT_TRUE(CudaCopy(d1, v.data(), bytes, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(CudaCopy(d2, d1, bytes, CopyKind::kDeviceToDevice).ok());
  Vec back(v.size(), -1.0f);
  ASSERT_TRUE(CudaCopy(back.data(), d2, bytes, CopyKind::kDeviceToHost).ok());
  EXPECT_EQ(std::memcmp(back.data(), v.data(), bytes), 0);
  // Zero the first half (stream order: the copy after it sees it).
  const size_t half = v.size() / 2;
  ASSERT_TRUE(CudaZero(d2, half * sizeof(float)).ok());
  ASSERT_TRUE(CudaCopy(back.data(), d2, bytes, CopyKind::kDeviceToHost).ok());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(back[i], i < half ? 0.0f : v[i]) << "element " << i;
  }
  EXPECT_TRUE(CudaCopy(nullptr, nullptr, 0, CopyKind::kDeviceToHost).ok());
  EXPECT_TRUE(CudaZero(nullptr, 0).ok());
  a->Deallocate(d1, bytes);
  a->Deallocate(d2, bytes);
  EXPECT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
}

// CudaCopyDeviceAsync queues the copy on the compute stream: a later synchronising copy
// sees it, without a wait of its own.
TEST_F(CudaKernelsTest, CudaCopyDeviceAsyncIsInStreamOrder) {
  const Vec v = Random(100003, "cuda async copy");
  const size_t bytes = v.size() * sizeof(float);
  Tensor src = Dev(v), dst = Dev(Vec(v.size(), 0.0f));
  ASSERT_TRUE(CudaCopyDeviceAsync(dst.raw(), src.raw(), bytes).ok());
  cuda_->Scale(static_cast<int64_t>(v.size()), 2.0f, dst.f32(), dst.f32());
  Vec want(v.size());
  for (size_t i = 0; i < v.size(); ++i) want[i] = v[i] * 2.0f;
  ExpectBitEqual(Host(dst), want, "copied then doubled");
  EXPECT_TRUE(CudaCopyDeviceAsync(nullptr, nullptr, 0).ok());
}

// Another call on a stage thread may make another device current (NcclApi's and the
// self-test's cudaSetDevice): the launches after it still run on the compute device.
TEST_F(CudaKernelsTest, LaunchesFollowTheComputeDeviceAfterAnotherWasMadeCurrent) {
  BATON_SKIP_WITHOUT_CUDA_DEVICES(2);
  const int64_t n = 4099;
  Tensor t = Dev(Vec(n, 0.0f));
  cuda_->Fill(n, 2.0f, t.f32());  // this thread is on the compute device now
  ASSERT_TRUE(CudaSynchronize().ok());
  ASSERT_TRUE(CudaSelfTest(1).ok());  // leaves device 1 current on this thread
  cuda_->Fill(n, 3.0f, t.f32());
  ASSERT_TRUE(CudaSynchronize().ok()) << CudaSynchronize();
  ExpectBitEqual(Host(t), Vec(n, 3.0f), "filled after the self-test on GPU 1");
}

// A device tensor staged for the transports lands in page-locked host memory (a CUDA
// process), with its bytes intact, and comes back to the device the same.
TEST_F(CudaKernelsTest, StagingGoesThroughPageLockedHostMemory) {
  const Vec v = Random(1000, "staging");
  Tensor host = Tensor::Empty({1000});
  std::memcpy(host.f32(), v.data(), v.size() * sizeof(float));
  absl::StatusOr<Tensor> dev = host.CopyTo(Device::kCuda);
  ASSERT_TRUE(dev.ok()) << dev.status();
  Allocator* staging = HostStagingAllocator();
  EXPECT_NE(staging, CpuAllocator()) << "a process holding device memory stages in pinned memory";
  EXPECT_EQ(staging, CudaPinnedHostAllocator());
  const int64_t before = staging->Stats().bytes_in_use;
  absl::StatusOr<Tensor> staged = dev->StagedOnHost();
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->device(), Device::kCpu);
  EXPECT_EQ(staging->Stats().bytes_in_use - before, 4096) << "1000 floats in a 256-byte-rounded block";
  EXPECT_EQ(std::memcmp(staged->f32(), v.data(), v.size() * sizeof(float)), 0);
  absl::StatusOr<Tensor> back = staged->CopyTo(Device::kCuda);
  ASSERT_TRUE(back.ok()) << back.status();
  Vec out(v.size());
  ASSERT_TRUE(back->CopyToHost(out.data()).ok());
  EXPECT_EQ(out, v);
}

// The device timer brackets work on the compute stream: a large GEMM between two marks takes
// measurable device time, the marks restart after Reset, and unknown marks are refused.
TEST_F(CudaKernelsTest, DeviceTimerMeasuresStreamWork) {
  std::unique_ptr<DeviceTimer> timer = NewDeviceTimer(Device::kCuda);
  ASSERT_NE(timer, nullptr);
  EXPECT_EQ(NewDeviceTimer(Device::kCpu), nullptr) << "the CPU computes synchronously";
  const int64_t n = 1024;
  Tensor a = Tensor::Zeros({n, n}, DType::kFloat32, Device::kCuda);
  Tensor c = Tensor::Zeros({n, n}, DType::kFloat32, Device::kCuda);
  for (int round = 0; round < 2; ++round) {
    timer->Reset();
    const int from = timer->Mark();
    cuda_->Gemm(false, false, n, n, n, 1.0f, a.f32(), n, a.f32(), n, 0.0f, c.f32(), n);
    const int to = timer->Mark();
    EXPECT_EQ(from, 0);
    EXPECT_EQ(to, 1);
    absl::StatusOr<int64_t> ns = timer->ElapsedNs(from, to);
    ASSERT_TRUE(ns.ok()) << ns.status();
    // 2 GFLOP in fp32 without TF32: well over a microsecond on any GPU, under ten seconds.
    EXPECT_GT(*ns, 1000);
    EXPECT_LT(*ns, int64_t{10'000'000'000});
  }
  EXPECT_EQ(timer->ElapsedNs(0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CudaSynchronize().ok());
}

// Errors belong to the thread that caused them: a call one thread got wrong (a GEMM with
// an impossible leading dimension: cuBLAS refuses it without launching, and the context
// stays fine) is reported to that thread's next CudaSynchronize, not taken by another
// thread that synchronises first.
TEST_F(CudaKernelsTest, AThreadsErrorIsReportedToThatThreadAlone) {
  Tensor a = Tensor::Zeros({4, 4}, DType::kFloat32, Device::kCuda);
  Tensor c = Tensor::Zeros({4, 4}, DType::kFloat32, Device::kCuda);
  ASSERT_TRUE(CudaSynchronize().ok());
  Mutex mu;
  std::condition_variable cv;
  int stage = 0;  // 1: the bad call was made; 2: the main thread has synchronised
  absl::Status theirs;
  std::thread other([&] {
    cuda_->Gemm(false, false, 4, 4, 4, 1.0f, a.f32(), 4, a.f32(), 4, 0.0f, c.f32(), /*ldc=*/1);
    {
      MutexLock lock(mu);
      stage = 1;
    }
    cv.notify_all();
    MutexLock lock(mu);
    cv.wait(lock.native(), [&] { return stage == 2; });
    theirs = CudaSynchronize();
  });
  {
    MutexLock lock(mu);
    cv.wait(lock.native(), [&] { return stage == 1; });
  }
  const absl::Status mine = CudaSynchronize();
  {
    MutexLock lock(mu);
    stage = 2;
  }
  cv.notify_all();
  other.join();
  EXPECT_TRUE(mine.ok()) << "another thread's error was reported here: " << mine;
  EXPECT_FALSE(theirs.ok()) << "the thread that made the bad call was not told";
  EXPECT_TRUE(CudaDeviceFault().ok()) << CudaDeviceFault();  // not a broken context
}

[[noreturn]] void BreakTheContextInAChild() {
  BATON_CHILD_CHECK(CudaDeviceFault().ok());
  (*BackendFor(Device::kCuda))->Fill(1 << 20, 1.0f, reinterpret_cast<float*>(uintptr_t{16}));
  const absl::Status mine = CudaSynchronize();
  absl::Status theirs;
  std::thread([&] { theirs = CudaSynchronize(); }).join();
  const absl::Status fault = CudaDeviceFault();
  std::fprintf(stderr, "this thread: %s\nanother thread: %s\nfault: %s\n",
               mine.ToString().c_str(), theirs.ToString().c_str(),
               fault.ToString().c_str());
  std::_Exit(!mine.ok() && !theirs.ok() && !fault.ok() && !CudaSynchronize().ok() ? 0 : 1);
}

// A kernel that writes where there is no memory breaks the CUDA context for good: the
// thread that synchronises sees it, so does every other thread (errors are the thread's,
// but a broken context is the process's), and CudaDeviceFault says so, for the worker to
// leave. In a child process (the context is unusable afterwards).
TEST(CudaFaultDeathTest, AnIllegalAddressBreaksTheContextForEveryThread) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(BreakTheContextInAChild(), testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace baton
