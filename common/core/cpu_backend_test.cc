// The CPU backend against naive double-precision re-implementations.
//
// Each test states its tolerance. Unless said otherwise a float result `got` matches a
// double reference `want` when |got - want| <= atol + rtol * |want|. Inputs are drawn from
// the project's counter-based RNG, so every run sees the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/bf16.h"
#include "common/core/bf16_gemm.h"
#include "common/core/gelu_math.h"
#include "common/core/rng.h"

namespace baton {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

Vec Random(size_t n, const std::string& name, float lo = -1.0f, float hi = 1.0f) {
  Vec v(n);
  RngStream(20240601, name).FillUniform(v.data(), static_cast<int64_t>(n), lo, hi);
  return v;
}

std::vector<int32_t> RandomTokens(size_t n, int32_t bound, const std::string& name) {
  RngStream s(20240601, name);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(s.UniformInt(i, bound));
  return t;
}

DVec ToDouble(const Vec& v) { return DVec(v.begin(), v.end()); }

// Compares float results with a double reference element by element.
void ExpectClose(const float* got, const DVec& want, double atol, double rtol,
                 const std::string& what) {
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (error " << err << ", atol " << atol << ", rtol " << rtol << ")";
      if (++reported == 10) return;
    }
  }
}
void ExpectClose(const Vec& got, const DVec& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ExpectClose(got.data(), want, atol, rtol, what);
}

void ExpectBitEqual(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

double GeluRef(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

class CpuBackendTest : public ::testing::Test {
 protected:
  Backend* be_ = CpuBackend();
};

TEST_F(CpuBackendTest, Lookup) {
  EXPECT_EQ(be_->device(), Device::kCpu);
  absl::StatusOr<Backend*> cpu = BackendFor(Device::kCpu);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, be_);
  absl::StatusOr<Backend*> cuda = BackendFor(Device::kCuda);
  if (!cuda.ok()) {  // no CUDA in this build, or no device: says which
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(cuda.status().message().find("CUDA"), absl::string_view::npos) << cuda.status();
  } else {
    EXPECT_EQ((*cuda)->device(), Device::kCuda);
  }
}

// ---- Gemm ----

struct GemmCase {
  bool ta, tb;
  float beta;
};

// Tolerance: atol 1e-5, rtol 1e-5 (k = 6 products of values in [-1, 1]; float rounding
// contributes a few 1e-7).
TEST_F(CpuBackendTest, GemmAllTransposesBothBetasWithPaddedLeadingDims) {
  const int64_t m = 5, n = 7, k = 6;
  const float alpha = 0.75f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        const std::string what = std::string("Gemm ta=") + (ta ? "T" : "N") +
                                 " tb=" + (tb ? "T" : "N") + " beta=" + std::to_string(beta);
        // Row-major storage: A is [m, lda] (or [k, lda] when transposed), B is [k, ldb]
        // (or [n, ldb]); every leading dimension is larger than the row it holds.
        const int64_t lda = (ta ? m : k) + 3;
        const int64_t ldb = (tb ? k : n) + 2;
        const int64_t ldc = n + 4;
        const Vec a = Random((ta ? k : m) * lda, "gemm.a");
        const Vec b = Random((tb ? n : k) * ldb, "gemm.b");
        Vec c = Random(m * ldc, "gemm.c");
        const float kPad = 12345.0f;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = n; j < ldc; ++j) c[i * ldc + j] = kPad;
          // With beta == 0, C is write-only: NaN there must not leak into the result.
          if (beta == 0.0f) {
            for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
          }
        }
        DVec want(m * n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double s = 0.0;
            for (int64_t p = 0; p < k; ++p) {
              const double av = ta ? a[p * lda + i] : a[i * lda + p];
              const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
              s += av * bv;
            }
            want[i * n + j] = alpha * s + (beta == 0.0f ? 0.0 : beta * c[i * ldc + j]);
          }
        }
        be_->Gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        Vec got(m * n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) got[i * n + j] = c[i * ldc + j];
          for (int64_t j = n; j < ldc; ++j) {
            EXPECT_EQ(c[i * ldc + j], kPad) << what << ": padding written at " << i << "," << j;
          }
        }
        ExpectClose(got, want, 1e-5, 1e-5, what);
      }
    }
  }
}

// GemmBf16 is Gemm on the widened bf16 values: bit for bit on the portable path, and
// within float32 accumulation's rounding with oneDNN (bf16_gemm.h: another summation
// order). Every transpose, both betas, leading dimensions wider than the rows (only the
// spanned elements are read, and nothing past n in C is written), and a product large
// enough for the row-block threads.
TEST_F(CpuBackendTest, GemmBf16IsGemmOnTheWidenedValues) {
  const bool onednn = CpuBf16Kernels().onednn;
  SCOPED_TRACE(absl::StrCat("bf16 products: ", CpuBf16Kernels().name));
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& cs : {Case{5, 7, 6}, Case{130, 96, 257}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          const std::string what = std::string("GemmBf16 ") + std::to_string(cs.m) + "x" +
                                   std::to_string(cs.n) + "x" + std::to_string(cs.k) +
                                   (ta ? " T" : " N") + (tb ? "T" : "N") +
                                   " beta=" + std::to_string(beta);
          const int64_t lda = (ta ? cs.m : cs.k) + 3, ldb = (tb ? cs.k : cs.n) + 2;
          const int64_t ldc = cs.n + 4;
          const Vec a = Random((ta ? cs.k : cs.m) * lda, "gemm.a");
          const Vec b = Random((tb ? cs.n : cs.k) * ldb, "gemm.b");
          std::vector<uint16_t> a_bits(a.size()), b_bits(b.size());
          be_->ToBf16(static_cast<int64_t>(a.size()), a.data(), a_bits.data());
          be_->ToBf16(static_cast<int64_t>(b.size()), b.data(), b_bits.data());
          Vec a_wide(a.size()), b_wide(b.size());
          be_->FromBf16(static_cast<int64_t>(a.size()), a_bits.data(), a_wide.data());
          be_->FromBf16(static_cast<int64_t>(b.size()), b_bits.data(), b_wide.data());
          const Vec c0 = Random(cs.m * ldc, "gemm.c");
          Vec want = c0, got = c0;
          be_->Gemm(ta, tb, cs.m, cs.n, cs.k, 0.5f, a_wide.data(), lda, b_wide.data(), ldb, beta,
                    want.data(), ldc);
          be_->GemmBf16(ta, tb, cs.m, cs.n, cs.k, 0.5f, a_bits.data(), lda, b_bits.data(), ldb,
                        beta, got.data(), ldc);
          if (onednn) {
            ExpectClose(got, ToDouble(want), 1e-4, 1e-5, what);
            for (int64_t i = 0; i < cs.m; ++i) {
              for (int64_t j = cs.n; j < ldc; ++j) {
                ASSERT_EQ(got[i * ldc + j], c0[i * ldc + j]) << what << ": padding written";
              }
            }
          } else {
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
          }
          EXPECT_NE(std::memcmp(want.data(), c0.data(), want.size() * sizeof(float)), 0) << what;
        }
      }
    }
  }
  // k == 0 scales C by beta, as Gemm does.
  Vec c = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  be_->GemmBf16(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, c.data(), 3);
  EXPECT_EQ(c, (Vec{0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f}));
}

// Tolerance: atol 1e-4, rtol 1e-5 (k = 300 products of values in [-1, 1]).
TEST_F(CpuBackendTest, GemmLargerK) {
  const int64_t m = 33, n = 17, k = 300;
  const Vec a = Random(m * k, "gemm.big.a");
  const Vec b = Random(k * n, "gemm.big.b");
  Vec c(m * n, 0.0f);
  be_->Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  DVec want(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) want[i * n + j] += double{a[i * k + p]} * b[p * n + j];
    }
  }
  ExpectClose(c, want, 1e-4, 1e-5, "Gemm k=300");
}

// Exact: with k == 0 the product is empty and C becomes beta * C (0 when beta == 0).
TEST_F(CpuBackendTest, GemmEmptyInnerDimensionScalesC) {
  Vec c = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  be_->Gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (Vec{0.0f, 0.0f, 0.0f, 0.0f}));
  c = {1.0f, 2.0f, 3.0f, 4.0f};
  be_->Gemm(true, true, 2, 2, 0, 1.0f, nullptr, 2, nullptr, 1, 2.0f, c.data(), 2);
  EXPECT_EQ(c, (Vec{2.0f, 4.0f, 6.0f, 8.0f}));
  be_->Gemm(false, false, 0, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, c.data(), 2);  // no-op
  EXPECT_EQ(c, (Vec{2.0f, 4.0f, 6.0f, 8.0f}));
}

// Runs `product` (which accumulates into C, beta = 1) from C = c0 with 1, 2, 3 and again 1
// GEMM threads, and expects the same bits each time.
template <typename Product>
void ExpectSameBitsForEveryThreadCount(const Vec& c0, const std::string& tag,
                                       const Product& product) {
  std::vector<Vec> out;
  for (int threads : {1, 2, 3, 1}) {
    SetBlasThreads(threads);
    ASSERT_EQ(BlasThreads(), threads);
    Vec c = c0;
    product(c.data());
    out.push_back(std::move(c));
  }
  for (size_t i = 1; i < out.size(); ++i) {
    ExpectBitEqual(out[0], out[i], absl::StrCat(tag, " run ", i, " vs 1 thread"));
  }
}

// Exact: results must not depend on the BLAS thread count (backend.h promises it).
// Shapes where OpenBLAS's own threading changed the bits on Prescott and Haswell kernel
// sets (few rows, wide, long inner sums), shapes past one row block, and every transpose.
TEST_F(CpuBackendTest, GemmBitIdenticalAcrossThreadCounts) {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{192, 160, 256}, {3, 512, 512}, {4, 300, 256}, {17, 129, 512},
                        {300, 96, 100},  {129, 64, 1024}, {520, 130, 64}};
  const int saved = BlasThreads();
  int checked = 0;
  for (const Case& cs : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t m = cs.m, n = cs.n, k = cs.k;
        const int64_t lda = ta ? m : k, ldb = tb ? k : n;
        const std::string tag = absl::StrCat("gemm.thr.", m, ".", n, ".", k, ".", ta, tb);
        const Vec a = Random(m * k, tag + ".a");
        const Vec b = Random(n * k, tag + ".b");
        ExpectSameBitsForEveryThreadCount(Random(m * n, tag + ".c"), tag, [&](float* c) {
          be_->Gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c, n);
        });
        ++checked;
      }
    }
  }
  SetBlasThreads(saved);
  EXPECT_EQ(checked, 28);
}

// The same for GemmBf16, whichever kernels run it (oneDNN's too: bf16_gemm.h runs each row
// block on one thread).
TEST_F(CpuBackendTest, GemmBf16BitIdenticalAcrossThreadCounts) {
  SCOPED_TRACE(absl::StrCat("bf16 products: ", CpuBf16Kernels().name));
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{520, 384, 128}, {3, 512, 512}, {300, 96, 130}, {129, 64, 1024}};
  const int saved = BlasThreads();
  int checked = 0;
  for (const Case& cs : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t m = cs.m, n = cs.n, k = cs.k;
        const int64_t lda = ta ? m : k, ldb = tb ? k : n;
        const std::string tag = absl::StrCat("gemm16.thr.", m, ".", n, ".", k, ".", ta, tb);
        std::vector<uint16_t> a(m * k), b(n * k);
        const Vec a32 = Random(m * k, tag + ".a"), b32 = Random(n * k, tag + ".b");
        be_->ToBf16(m * k, a32.data(), a.data());
        be_->ToBf16(n * k, b32.data(), b.data());
        ExpectSameBitsForEveryThreadCount(Random(m * n, tag + ".c"), tag, [&](float* c) {
          be_->GemmBf16(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c, n);
        });
        ++checked;
      }
    }
  }
  SetBlasThreads(saved);
  EXPECT_EQ(checked, 16);
}

// ---- Element-wise and reductions ----

// The element-wise loops run as the CPU's widest clone (cpu_backend.cc: AVX-512 or AVX2
// where present); each must give the bits of the plain scalar expression, element by
// element, over a vector body and its tail (n = 1037), and through special values.
TEST_F(CpuBackendTest, ElementWiseLoopsGiveTheScalarBitsAtAnyVectorWidth) {
  const int64_t n = 1037, rows = 17, cols = 61;  // rows * cols == n
  Vec x = Random(n, "clones.x", -6.0f, 6.0f);
  const Vec dy = Random(n, "clones.dy"), bias = Random(cols, "clones.bias");
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = 1.00390625f;  // a tie between two bf16 values: to even
  x[3] = 1.01171875f;  // the other tie
  x[4] = 3.4e38f;      // rounds up to infinity
  x[5] = -1e-40f;      // subnormal
  x[6] = -0.0f;
  Vec got(n), want(n);
  be_->BiasGelu(rows, cols, x.data(), bias.data(), want.data(), got.data(), false);  // want: pre
  for (int64_t i = 0; i < n; ++i) {
    const float pre = x[i] + bias[i % cols];
    ASSERT_EQ(std::memcmp(&want[i], &pre, 4), 0) << "BiasGelu pre " << i;
    const float out = gelu_math::GeluOf(pre);
    ASSERT_EQ(std::memcmp(&got[i], &out, 4), 0) << "BiasGelu " << i << " of " << pre;
  }
  be_->GeluBackward(n, x.data(), dy.data(), got.data());
  for (int64_t i = 0; i < n; ++i) want[i] = dy[i] * gelu_math::GeluGrad(x[i]);
  ExpectBitEqual(got, want, "GeluBackward");
  std::vector<uint16_t> bits(n);
  be_->ToBf16(n, x.data(), bits.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits[i], FloatToBf16Bits(x[i])) << "ToBf16 " << i << " of " << x[i];
  }
  be_->FromBf16(n, bits.data(), got.data());
  for (int64_t i = 0; i < n; ++i) want[i] = Bf16BitsToFloat(bits[i]);
  ExpectBitEqual(got, want, "FromBf16");
  be_->RoundToBf16(n, x.data(), got.data());
  for (int64_t i = 0; i < n; ++i) want[i] = RoundToBf16(x[i]);
  ExpectBitEqual(got, want, "RoundToBf16");
  Vec dbias(cols, 0.5f), want_dbias(cols, 0.5f);
  be_->BiasGrad(rows, cols, dy.data(), dbias.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) want_dbias[c] += dy[r * cols + c];
  }
  ExpectBitEqual(dbias, want_dbias, "BiasGrad");
  Vec w = Random(n, "clones.w"), m = Random(n, "clones.m"), v = Random(n, "clones.v", 0.0f, 1.0f);
  Vec ww = w, wm = m, wv = v;
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, bc1 = 0.19f, bc2 = 0.0975f;
  be_->AdamWStep(n, lr, b1, b2, eps, wd, bc1, bc2, w.data(), dy.data(), m.data(), v.data());
  for (int64_t i = 0; i < n; ++i) {
    ww[i] *= 1.0f - lr * wd;
    wm[i] = b1 * wm[i] + (1.0f - b1) * dy[i];
    wv[i] = b2 * wv[i] + (1.0f - b2) * dy[i] * dy[i];
    ww[i] -= lr * (wm[i] / bc1) / (std::sqrt(wv[i] / bc2) + eps);
  }
  ExpectBitEqual(w, ww, "AdamW w");
  ExpectBitEqual(m, wm, "AdamW m");
  ExpectBitEqual(v, wv, "AdamW v");
}

// Exact: one float operation per element, the same one the naive loop does.
TEST_F(CpuBackendTest, AddScaleFillCopy) {
  const int64_t n = 101;
  const Vec a = Random(n, "add.a");
  const Vec b = Random(n, "add.b");
  Vec out(n), want(n);
  be_->Add(n, a.data(), b.data(), out.data());
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  ExpectBitEqual(out, want, "Add");
  Vec alias = a;  // out aliases a
  be_->Add(n, alias.data(), b.data(), alias.data());
  ExpectBitEqual(alias, want, "Add in place");
  alias = b;  // out aliases b
  be_->Add(n, a.data(), alias.data(), alias.data());
  ExpectBitEqual(alias, want, "Add in place (b)");

  be_->Scale(n, -0.3f, a.data(), out.data());
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] * -0.3f;
  ExpectBitEqual(out, want, "Scale");
  alias = a;
  be_->Scale(n, -0.3f, alias.data(), alias.data());
  ExpectBitEqual(alias, want, "Scale in place");

  be_->Fill(n, 2.5f, out.data());
  EXPECT_EQ(out, Vec(n, 2.5f));
  be_->Copy(n, a.data(), out.data());
  ExpectBitEqual(out, a, "Copy");
  be_->Copy(0, nullptr, nullptr);  // empty copy is a no-op
}

// Exact: the sum is accumulated in double in index order, so it equals the naive loop bit
// for bit, and differs from the float-accumulated sum.
TEST_F(CpuBackendTest, SumAccumulatesInDoubleInOrder) {
  const int64_t n = 10007;
  const Vec x = Random(n, "sum.x", -1.0f, 3.0f);
  double want = 0.0;
  for (int64_t i = 0; i < n; ++i) want += x[i];
  EXPECT_EQ(be_->Sum(n, x.data()), want);
  EXPECT_EQ(be_->Sum(0, x.data()), 0.0);
  // 2^24 + 1 + 1 loses both ones in float, not in double.
  const Vec y = {16777216.0f, 1.0f, 1.0f};
  EXPECT_EQ(be_->Sum(3, y.data()), 16777218.0);
}

// MeanInto writes Sum's sum over n, divided in double and rounded to float once.
TEST_F(CpuBackendTest, MeanIntoIsTheSumOverNAsAFloat) {
  const int64_t n = 10007;
  const Vec x = Random(n, "mean.x", -1.0f, 3.0f);
  float out = -1.0f;
  be_->MeanInto(n, x.data(), &out);
  EXPECT_EQ(out, static_cast<float>(be_->Sum(n, x.data()) / static_cast<double>(n)));
  // 2^24 + 1 + 1 over 3: the ones survive in double, so the mean is 5592406 (exact).
  const Vec y = {16777216.0f, 1.0f, 1.0f};
  be_->MeanInto(3, y.data(), &out);
  EXPECT_EQ(out, 5592406.0f);
}

// SquaredErrorMeanInto: SquaredError's differences, and its sum over n rounded to float once.
TEST_F(CpuBackendTest, SquaredErrorMeanIsSquaredErrorsSumOverNAsAFloat) {
  const int64_t n = 10007;
  const Vec pred = Random(n, "sqmean.pred", -1.0f, 3.0f);
  const Vec target = Random(n, "sqmean.target", -2.0f, 2.0f);
  Vec diff(n), want_diff(n);
  float out = -1.0f;
  be_->SquaredErrorMeanInto(n, pred.data(), target.data(), diff.data(), &out);
  const double sse = be_->SquaredError(n, pred.data(), target.data(), want_diff.data());
  EXPECT_EQ(out, static_cast<float>(sse / static_cast<double>(n)));
  EXPECT_EQ(std::memcmp(diff.data(), want_diff.data(), n * sizeof(float)), 0);
  // (3^2 + 4^2) / 2, exactly.
  const Vec p2 = {4.0f, -1.0f}, t2 = {1.0f, 3.0f};
  Vec d2(2);
  be_->SquaredErrorMeanInto(2, p2.data(), t2.data(), d2.data(), &out);
  EXPECT_EQ(out, 12.5f);
  EXPECT_EQ(d2, (Vec{3.0f, -4.0f}));
}

// The same order for the squares, each squared in double (no float rounding of x^2).
TEST_F(CpuBackendTest, SumSquaresAccumulatesInDoubleInOrder) {
  const int64_t n = 10007;
  const Vec x = Random(n, "sumsq.x", -1.0f, 3.0f);
  double want = 0.0;
  for (int64_t i = 0; i < n; ++i) want += static_cast<double>(x[i]) * x[i];
  EXPECT_EQ(be_->SumSquares(n, x.data()), want);
  EXPECT_EQ(be_->SumSquares(0, x.data()), 0.0);
  const Vec y = {3.0f, -4.0f, 1e20f};
  EXPECT_EQ(be_->SumSquares(2, y.data()), 25.0);
  // 1e40 is beyond float's range; the double sum stays finite.
  EXPECT_EQ(be_->SumSquares(3, y.data()), 25.0 + static_cast<double>(y[2]) * y[2]);
}

// SumEach and SumSquaresEach (the default the CPU keeps): each tensor's Sum and SumSquares,
// bit for bit; an empty tensor (a null pointer) gives 0.
TEST_F(CpuBackendTest, SumEachIsSumPerTensor) {
  const Vec a = Random(10007, "sumeach.a"), b = Random(3, "sumeach.b", -2.0f, 5.0f);
  const Vec c = {3.0f, -4.0f, 1e20f};
  const std::vector<const float*> xs = {a.data(), nullptr, b.data(), c.data(), a.data() + 1};
  const std::vector<int64_t> ns = {10007, 0, 3, 3, 5000};
  DVec sums(xs.size(), -1.0), squares(xs.size(), -1.0);
  be_->SumEach(xs, ns, sums.data());
  be_->SumSquaresEach(xs, ns, squares.data());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = ns[i] == 0 ? 0.0 : be_->Sum(ns[i], xs[i]);
    const double want_sq = ns[i] == 0 ? 0.0 : be_->SumSquares(ns[i], xs[i]);
    EXPECT_EQ(std::memcmp(&sums[i], &want, sizeof(double)), 0) << i << ": " << sums[i];
    EXPECT_EQ(std::memcmp(&squares[i], &want_sq, sizeof(double)), 0) << i << ": " << squares[i];
  }
  be_->SumEach({}, {}, nullptr);  // nothing to sum, nothing written
}

// ---- Linear ----

// Exact: y + bias is one float addition; BiasGrad adds rows in order into the existing
// values (checked bit for bit against the same float loop, and within atol 1e-5 of double).
TEST_F(CpuBackendTest, AddBiasAndBiasGradAccumulates) {
  const int64_t rows = 6, cols = 9;
  const Vec bias = Random(cols, "bias");
  Vec y = Random(rows * cols, "bias.y");
  Vec want = y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] += bias[c];
  }
  be_->AddBias(rows, cols, bias.data(), y.data(), false);
  ExpectBitEqual(y, want, "AddBias");

  const Vec dy1 = Random(rows * cols, "biasgrad.dy1");
  const Vec dy2 = Random(rows * cols, "biasgrad.dy2");
  Vec dbias = Random(cols, "biasgrad.init");
  Vec want_f = dbias;
  DVec want_d = ToDouble(dbias);
  for (const Vec* dy : {&dy1, &dy2}) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        want_f[c] += (*dy)[r * cols + c];
        want_d[c] += (*dy)[r * cols + c];
      }
    }
  }
  be_->BiasGrad(rows, cols, dy1.data(), dbias.data());
  be_->BiasGrad(rows, cols, dy2.data(), dbias.data());
  ExpectBitEqual(dbias, want_f, "BiasGrad (row order)");
  ExpectClose(dbias, want_d, 1e-5, 0.0, "BiasGrad vs double");

  // From bf16 bits: the bits BiasGrad gives on the widened floats.
  std::vector<uint16_t> bits(dy1.size());
  be_->ToBf16(static_cast<int64_t>(dy1.size()), dy1.data(), bits.data());
  Vec wide(dy1.size());
  be_->FromBf16(static_cast<int64_t>(dy1.size()), bits.data(), wide.data());
  Vec from_bits = dbias, from_wide = dbias;
  be_->BiasGrad(rows, cols, wide.data(), from_wide.data());
  be_->BiasGradBf16(rows, cols, bits.data(), from_bits.data());
  ExpectBitEqual(from_bits, from_wide, "BiasGradBf16");
  EXPECT_NE(from_bits, dbias) << "it added something";
}

// ---- GELU ----

// pre is exact (one float add); out within atol 1e-6, rtol 1e-6 of gelu in double.
TEST_F(CpuBackendTest, BiasGelu) {
  const int64_t rows = 5, cols = 13;
  const Vec x = Random(rows * cols, "gelu.x", -5.0f, 5.0f);
  const Vec bias = Random(cols, "gelu.bias");
  Vec pre(rows * cols), out(rows * cols);
  be_->BiasGelu(rows, cols, x.data(), bias.data(), pre.data(), out.data(), false);
  Vec want_pre(rows * cols);
  DVec want_out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      want_pre[r * cols + c] = x[r * cols + c] + bias[c];
      want_out[r * cols + c] = GeluRef(want_pre[r * cols + c]);
    }
  }
  ExpectBitEqual(pre, want_pre, "BiasGelu pre");
  ExpectClose(out, want_out, 1e-6, 1e-6, "BiasGelu out");

  // No bias: pre is x; pre may alias x.
  Vec inplace = x;
  be_->BiasGelu(rows, cols, inplace.data(), nullptr, inplace.data(), out.data(), false);
  ExpectBitEqual(inplace, x, "BiasGelu pre without bias");
  DVec want_nobias(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) want_nobias[i] = GeluRef(x[i]);
  ExpectClose(out, want_nobias, 1e-6, 1e-6, "BiasGelu out without bias");

  // A few fixed points: gelu(0) = 0, gelu is ~x for large x and ~0 for very negative x.
  const Vec special = {0.0f, 10.0f, -10.0f};
  Vec sp_pre(3), sp_out(3);
  be_->BiasGelu(1, 3, special.data(), nullptr, sp_pre.data(), sp_out.data(), false);
  EXPECT_EQ(sp_out[0], 0.0f);
  EXPECT_NEAR(sp_out[1], 10.0f, 1e-6f);
  EXPECT_NEAR(sp_out[2], 0.0f, 1e-6f);
}

// round_bf16 rounds the output in the same pass: the bits of the unrounded kernel followed by
// RoundToBf16 (a bf16 job's Linear); GELU's pre-activation stays float32.
TEST_F(CpuBackendTest, BiasKernelsRoundTheirOutputToBf16InTheSamePass) {
  const int64_t rows = 5, cols = 13;
  const Vec x = Random(rows * cols, "round.x", -5.0f, 5.0f);
  const Vec bias = Random(cols, "round.bias");
  Vec pre(rows * cols), out(rows * cols), pre_r(rows * cols), out_r(rows * cols);
  be_->BiasGelu(rows, cols, x.data(), bias.data(), pre.data(), out.data(), false);
  be_->RoundToBf16(rows * cols, out.data(), out.data());
  be_->BiasGelu(rows, cols, x.data(), bias.data(), pre_r.data(), out_r.data(), true);
  ExpectBitEqual(out_r, out, "BiasGelu rounded");
  ExpectBitEqual(pre_r, pre, "BiasGelu pre (not rounded)");
  bool some_unrounded = false;
  for (float v : pre_r) some_unrounded |= RoundToBf16(v) != v;
  EXPECT_TRUE(some_unrounded) << "the check needs pre-activations that bf16 cannot hold";

  Vec y = x, y_r = x;
  be_->AddBias(rows, cols, bias.data(), y.data(), false);
  be_->RoundToBf16(rows * cols, y.data(), y.data());
  be_->AddBias(rows, cols, bias.data(), y_r.data(), true);
  ExpectBitEqual(y_r, y, "AddBias rounded");
}

// dx = dy * gelu'(pre) against central finite differences of gelu in double
// (h = 1e-4, truncation error ~1e-9): atol 1e-6, rtol 1e-5.
TEST_F(CpuBackendTest, GeluBackwardMatchesFiniteDifferences) {
  const int64_t n = 200;
  Vec pre = Random(n, "geluback.pre", -6.0f, 6.0f);
  pre[0] = 0.0f;
  pre[1] = -1.5f;
  pre[2] = 2.0f;
  const Vec dy = Random(n, "geluback.dy", -2.0f, 2.0f);
  Vec dx(n);
  be_->GeluBackward(n, pre.data(), dy.data(), dx.data());
  DVec want(n);
  const double h = 1e-4;
  for (int64_t i = 0; i < n; ++i) {
    const double p = pre[i];
    want[i] = dy[i] * (GeluRef(p + h) - GeluRef(p - h)) / (2.0 * h);
  }
  ExpectClose(dx, want, 1e-6, 1e-5, "GeluBackward");
  Vec alias = dy;  // dx aliases dy
  be_->GeluBackward(n, pre.data(), alias.data(), alias.data());
  ExpectBitEqual(alias, dx, "GeluBackward in place");
}

// ---- LayerNorm ----

struct LayerNormRef {
  DVec y, mean, rstd;
};

LayerNormRef LayerNormDouble(int64_t rows, int64_t cols, double eps, const DVec& x,
                             const Vec& gamma, const Vec& beta) {
  LayerNormRef ref{DVec(rows * cols), DVec(rows), DVec(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0.0;
    for (int64_t c = 0; c < cols; ++c) m += x[r * cols + c];
    m /= cols;
    double var = 0.0;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - m) * (x[r * cols + c] - m);
    var /= cols;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < cols; ++c) {
      ref.y[r * cols + c] = (x[r * cols + c] - m) * s * gamma[c] + beta[c];
    }
    ref.mean[r] = m;
    ref.rstd[r] = s;
  }
  return ref;
}

// mean: atol 1e-6; rstd: rtol 1e-5; y: atol 1e-5, rtol 1e-5 (values of order 1, x offset
// by 3 so the mean matters).
TEST_F(CpuBackendTest, LayerNormForward) {
  const int64_t rows = 4, cols = 48;
  const float eps = 1e-5f;
  const Vec x = Random(rows * cols, "ln.x", 2.0f, 4.0f);
  const Vec gamma = Random(cols, "ln.gamma", 0.5f, 1.5f);
  const Vec beta = Random(cols, "ln.beta");
  Vec y(rows * cols), mean(rows), rstd(rows);
  be_->LayerNormForward(rows, cols, eps, x.data(), gamma.data(), beta.data(), y.data(),
                        mean.data(), rstd.data());
  const LayerNormRef ref = LayerNormDouble(rows, cols, eps, ToDouble(x), gamma, beta);
  ExpectClose(mean, ref.mean, 1e-6, 0.0, "LayerNorm mean");
  ExpectClose(rstd, ref.rstd, 0.0, 1e-5, "LayerNorm rstd");
  ExpectClose(y, ref.y, 1e-5, 1e-5, "LayerNorm y");

  // With gamma = 1 and beta = 0 every row is standardised: mean 0, variance 1 - eps*rstd^2
  // (atol 1e-5).
  const Vec ones(cols, 1.0f), zeros(cols, 0.0f);
  be_->LayerNormForward(rows, cols, eps, x.data(), ones.data(), zeros.data(), y.data(),
                        mean.data(), rstd.data());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < cols; ++c) m += y[r * cols + c];
    m /= cols;
    for (int64_t c = 0; c < cols; ++c) v += (y[r * cols + c] - m) * (y[r * cols + c] - m);
    v /= cols;
    EXPECT_NEAR(m, 0.0, 1e-5) << r;
    EXPECT_NEAR(v, 1.0 - eps * double{rstd[r]} * rstd[r], 1e-5) << r;
  }
}

// dx against central finite differences of L(x) = sum(dy * LayerNorm(x)) in double
// (h = 1e-5): atol 1e-4, rtol 1e-4. dgamma/dbeta accumulate into their initial values:
// atol 1e-5, rtol 1e-5 against double.
TEST_F(CpuBackendTest, LayerNormBackward) {
  const int64_t rows = 3, cols = 16;
  const float eps = 1e-5f;
  const Vec x = Random(rows * cols, "lnb.x", -2.0f, 2.0f);
  const Vec gamma = Random(cols, "lnb.gamma", 0.5f, 1.5f);
  const Vec beta = Random(cols, "lnb.beta");
  const Vec dy = Random(rows * cols, "lnb.dy");
  Vec y(rows * cols), mean(rows), rstd(rows), dx(rows * cols);
  be_->LayerNormForward(rows, cols, eps, x.data(), gamma.data(), beta.data(), y.data(),
                        mean.data(), rstd.data());
  be_->LayerNormBackwardInput(rows, cols, x.data(), mean.data(), rstd.data(), gamma.data(),
                              dy.data(), dx.data());
  auto loss = [&](const DVec& xd) {
    const LayerNormRef ref = LayerNormDouble(rows, cols, eps, xd, gamma, beta);
    double l = 0.0;
    for (int64_t i = 0; i < rows * cols; ++i) l += dy[i] * ref.y[i];
    return l;
  };
  DVec want_dx(rows * cols);
  const double h = 1e-5;
  for (int64_t i = 0; i < rows * cols; ++i) {
    DVec xp = ToDouble(x), xm = ToDouble(x);
    xp[i] += h;
    xm[i] -= h;
    want_dx[i] = (loss(xp) - loss(xm)) / (2.0 * h);
  }
  ExpectClose(dx, want_dx, 1e-4, 1e-4, "LayerNormBackwardInput");

  Vec dgamma = Random(cols, "lnb.dgamma0");
  Vec dbeta = Random(cols, "lnb.dbeta0");
  DVec want_dgamma = ToDouble(dgamma), want_dbeta = ToDouble(dbeta);
  const LayerNormRef ref = LayerNormDouble(rows, cols, eps, ToDouble(x), gamma, beta);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - ref.mean[r]) * ref.rstd[r];
      want_dgamma[c] += dy[r * cols + c] * xhat;
      want_dbeta[c] += dy[r * cols + c];
    }
  }
  be_->LayerNormBackwardWeight(rows, cols, x.data(), mean.data(), rstd.data(), dy.data(),
                               dgamma.data(), dbeta.data());
  ExpectClose(dgamma, want_dgamma, 1e-5, 1e-5, "LayerNormBackwardWeight dgamma");
  ExpectClose(dbeta, want_dbeta, 1e-5, 1e-5, "LayerNormBackwardWeight dbeta");
}

// ---- Attention ----

struct AttentionRef {
  DVec att, y;
};

// Grouped-query attention in double; kvh = 0 means kvh = H (multi-head, qkv [B,T,3C]).
AttentionRef AttentionDouble(int64_t B, int64_t T, int64_t H, int64_t D, const DVec& qkv,
                             int64_t kvh = 0) {
  const int64_t KVH = kvh == 0 ? H : kvh;
  const int64_t C = H * D, W = (H + 2 * KVH) * D, G = H / KVH;
  AttentionRef ref{DVec(B * H * T * T, 0.0), DVec(B * T * C, 0.0)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = h / G;  // transformers' repeat_kv
      for (int64_t i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * W + h * D];
        DVec s(i + 1);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * T + j) * W + C + kv * D];
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        double* arow = &ref.att[((b * H + h) * T + i) * T];
        for (int64_t j = 0; j <= i; ++j) arow[j] = std::exp(s[j] - mx) / sum;
        double* yrow = &ref.y[(b * T + i) * C + h * D];
        for (int64_t j = 0; j <= i; ++j) {
          const double* v = &qkv[(b * T + j) * W + C + KVH * D + kv * D];
          for (int64_t d = 0; d < D; ++d) yrow[d] += arow[j] * v[d];
        }
      }
    }
  }
  return ref;
}

// Rows of att sum to 1 (atol 1e-6) and are exactly 0 above the diagonal; att within
// atol 1e-6 and y within atol 1e-5, rtol 1e-5 of the double reference.
TEST_F(CpuBackendTest, AttentionForwardIsCausalAndMatchesNaive) {
  const int64_t B = 2, T = 7, H = 3, D = 4, C = H * D;
  const Vec qkv = Random(B * T * 3 * C, "attn.qkv", -2.0f, 2.0f);
  Vec att(B * H * T * T, std::numeric_limits<float>::quiet_NaN());
  Vec y(B * T * C, std::numeric_limits<float>::quiet_NaN());
  be_->AttentionForward(B, T, H, D, qkv.data(), att.data(), y.data());
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t i = 0; i < T; ++i) {
      const float* row = &att[(bh * T + i) * T];
      double sum = 0.0;
      for (int64_t j = 0; j < T; ++j) {
        if (j > i) {
          EXPECT_EQ(row[j], 0.0f) << "above the diagonal: bh=" << bh << " i=" << i << " j=" << j;
        } else {
          EXPECT_GT(row[j], 0.0f);
        }
        sum += row[j];
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << "bh=" << bh << " i=" << i;
    }
  }
  const AttentionRef ref = AttentionDouble(B, T, H, D, ToDouble(qkv));
  ExpectClose(att, ref.att, 1e-6, 0.0, "Attention att");
  ExpectClose(y, ref.y, 1e-5, 1e-5, "Attention y");

  // The first position attends only to itself: its output is its own v (exact).
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(y[b * T * C + c], qkv[b * T * 3 * C + 2 * C + c]) << b << "," << c;
    }
  }

  // Deterministic: a second call gives the same bits.
  Vec att2(att.size()), y2(y.size());
  be_->AttentionForward(B, T, H, D, qkv.data(), att2.data(), y2.data());
  ExpectBitEqual(att2, att, "Attention att repeated");
  ExpectBitEqual(y2, y, "Attention y repeated");
}

// dqkv against central finite differences of L(qkv) = sum(dy * y(qkv)) computed in double
// (h = 1e-6): atol 2e-5, rtol 1e-4.
TEST_F(CpuBackendTest, AttentionBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 2, D = 3, C = H * D;
  const Vec qkv = Random(B * T * 3 * C, "attnb.qkv", -1.5f, 1.5f);
  const Vec dy = Random(B * T * C, "attnb.dy");
  Vec att(B * H * T * T), y(B * T * C), dqkv(B * T * 3 * C), scratch(T * T);
  be_->AttentionForward(B, T, H, D, qkv.data(), att.data(), y.data());
  be_->AttentionBackward(B, T, H, D, qkv.data(), att.data(), dy.data(), dqkv.data(),
                         scratch.data());
  auto loss = [&](const DVec& q) {
    const AttentionRef ref = AttentionDouble(B, T, H, D, q);
    double l = 0.0;
    for (size_t i = 0; i < ref.y.size(); ++i) l += dy[i] * ref.y[i];
    return l;
  };
  DVec want(qkv.size());
  const double h = 1e-6;
  for (size_t i = 0; i < qkv.size(); ++i) {
    DVec p = ToDouble(qkv), m = ToDouble(qkv);
    p[i] += h;
    m[i] -= h;
    want[i] = (loss(p) - loss(m)) / (2.0 * h);
  }
  ExpectClose(dqkv, want, 2e-5, 1e-4, "AttentionBackward dqkv");
}

// ---- Grouped-query attention ----

// Against the double reference (tolerances of the multi-head tests): att atol 1e-6, y atol
// 1e-5 rtol 1e-5; dqkv against central differences (h = 1e-6) atol 2e-5, rtol 1e-4.
TEST_F(CpuBackendTest, GqaAttentionMatchesNaiveAndFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 4, KVH = 2, D = 3, C = H * D, W = (H + 2 * KVH) * D;
  const Vec qkv = Random(B * T * W, "gqa.qkv", -1.5f, 1.5f);
  const Vec dy = Random(B * T * C, "gqa.dy");
  Vec att(B * H * T * T), y(B * T * C), dqkv(B * T * W), scratch(H * T * T);
  be_->AttentionForward(B, T, H, KVH, D, qkv.data(), att.data(), y.data());
  const AttentionRef ref = AttentionDouble(B, T, H, D, ToDouble(qkv), KVH);
  ExpectClose(att, ref.att, 1e-6, 0.0, "GQA att");
  ExpectClose(y, ref.y, 1e-5, 1e-5, "GQA y");
  be_->AttentionBackward(B, T, H, KVH, D, qkv.data(), att.data(), dy.data(), dqkv.data(),
                         scratch.data());
  auto loss = [&](const DVec& q) {
    const AttentionRef r = AttentionDouble(B, T, H, D, q, KVH);
    double l = 0.0;
    for (size_t i = 0; i < r.y.size(); ++i) l += dy[i] * r.y[i];
    return l;
  };
  DVec want(qkv.size());
  const double h = 1e-6;
  for (size_t i = 0; i < qkv.size(); ++i) {
    DVec p = ToDouble(qkv), m = ToDouble(qkv);
    p[i] += h;
    m[i] -= h;
    want[i] = (loss(p) - loss(m)) / (2.0 * h);
  }
  ExpectClose(dqkv, want, 2e-5, 1e-4, "GQA AttentionBackward dqkv");
}

// GQA is multi-head attention over k and v heads repeated H / KVH times (repeat_kv): the
// forward and dq give the same bits (the same GEMMs on the same values), and the dk, dv of a
// kv head are the sum of its query heads' (atol 1e-6: the order of two additions). And
// kv_heads == heads is the multi-head kernel (the GPT's call) bit for bit.
TEST_F(CpuBackendTest, GqaIsMultiHeadOverRepeatedKv) {
  const int64_t B = 2, T = 6, H = 6, KVH = 2, G = H / KVH, D = 4, C = H * D;
  const int64_t W = (H + 2 * KVH) * D, C3 = 3 * C;
  const Vec qkv = Random(B * T * W, "gqarep.qkv", -1.5f, 1.5f);
  const Vec dy = Random(B * T * C, "gqarep.dy");
  Vec rep(B * T * C3);  // [q | k repeated | v repeated]
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t c = 0; c < C; ++c) rep[bt * C3 + c] = qkv[bt * W + c];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        rep[bt * C3 + C + h * D + d] = qkv[bt * W + C + (h / G) * D + d];
        rep[bt * C3 + 2 * C + h * D + d] = qkv[bt * W + C + KVH * D + (h / G) * D + d];
      }
    }
  }
  Vec att(B * H * T * T), y(B * T * C), dqkv(B * T * W), scratch(H * T * T);
  Vec ratt(att.size()), ry(y.size()), rdqkv(B * T * C3);
  be_->AttentionForward(B, T, H, KVH, D, qkv.data(), att.data(), y.data());
  be_->AttentionForward(B, T, H, D, rep.data(), ratt.data(), ry.data());
  ExpectBitEqual(att, ratt, "GQA att vs repeated kv");
  ExpectBitEqual(y, ry, "GQA y vs repeated kv");
  be_->AttentionBackward(B, T, H, KVH, D, qkv.data(), att.data(), dy.data(), dqkv.data(),
                         scratch.data());
  be_->AttentionBackward(B, T, H, D, rep.data(), ratt.data(), dy.data(), rdqkv.data(),
                         scratch.data());
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(dqkv[bt * W + c], rdqkv[bt * C3 + c]) << "dq " << bt << "," << c;
    }
    for (int64_t kv = 0; kv < KVH; ++kv) {
      for (int64_t d = 0; d < D; ++d) {
        double dk = 0.0, dv = 0.0;
        for (int64_t g = 0; g < G; ++g) {
          dk += rdqkv[bt * C3 + C + (kv * G + g) * D + d];
          dv += rdqkv[bt * C3 + 2 * C + (kv * G + g) * D + d];
        }
        EXPECT_NEAR(dqkv[bt * W + C + kv * D + d], dk, 1e-6) << "dk " << bt << "," << kv;
        EXPECT_NEAR(dqkv[bt * W + C + KVH * D + kv * D + d], dv, 1e-6) << "dv " << bt << "," << kv;
      }
    }
  }
  // kv_heads == heads: the multi-head entry point is the same kernel, bit for bit.
  Vec a1(B * H * T * T), y1(B * T * C), a2(a1.size()), y2(y1.size());
  Vec d1(B * T * C3), d2(d1.size());
  be_->AttentionForward(B, T, H, H, D, rep.data(), a1.data(), y1.data());
  be_->AttentionForward(B, T, H, D, rep.data(), a2.data(), y2.data());
  ExpectBitEqual(a1, a2, "kv_heads == heads att");
  ExpectBitEqual(y1, y2, "kv_heads == heads y");
  be_->AttentionBackward(B, T, H, H, D, rep.data(), a1.data(), dy.data(), d1.data(),
                         scratch.data());
  be_->AttentionBackward(B, T, H, D, rep.data(), a2.data(), dy.data(), d2.data(), scratch.data());
  ExpectBitEqual(d1, d2, "kv_heads == heads dqkv");
}

// ---- RMSNorm ----

struct RmsNormRef {
  DVec y, rstd;
};

RmsNormRef RmsNormDouble(int64_t rows, int64_t cols, double eps, const DVec& x, const Vec& gamma) {
  RmsNormRef ref{DVec(rows * cols), DVec(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double sq = 0.0;
    for (int64_t c = 0; c < cols; ++c) sq += x[r * cols + c] * x[r * cols + c];
    ref.rstd[r] = 1.0 / std::sqrt(sq / cols + eps);
    for (int64_t c = 0; c < cols; ++c)
      ref.y[r * cols + c] = x[r * cols + c] * ref.rstd[r] * gamma[c];
  }
  return ref;
}

// Forward: rstd rtol 1e-5, y atol 1e-5 rtol 1e-5 against double. Backward: dx against
// central differences in double (h = 1e-5): atol 1e-4, rtol 1e-4; dgamma accumulates into
// its initial values: atol 1e-5, rtol 1e-5.
TEST_F(CpuBackendTest, RmsNormForwardAndBackward) {
  const int64_t rows = 3, cols = 16;
  const float eps = 1e-6f;
  const Vec x = Random(rows * cols, "rms.x", -2.0f, 2.0f);
  const Vec gamma = Random(cols, "rms.gamma", 0.5f, 1.5f);
  const Vec dy = Random(rows * cols, "rms.dy");
  Vec y(rows * cols), rstd(rows), dx(rows * cols);
  be_->RmsNormForward(rows, cols, eps, x.data(), gamma.data(), y.data(), rstd.data());
  const RmsNormRef ref = RmsNormDouble(rows, cols, eps, ToDouble(x), gamma);
  ExpectClose(rstd, ref.rstd, 0.0, 1e-5, "RmsNorm rstd");
  ExpectClose(y, ref.y, 1e-5, 1e-5, "RmsNorm y");
  // The documented float expression: y = (x * rstd) * gamma, exactly.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(y[r * cols + c], (x[r * cols + c] * rstd[r]) * gamma[c]) << r << "," << c;
    }
  }

  be_->RmsNormBackwardInput(rows, cols, x.data(), rstd.data(), gamma.data(), dy.data(), dx.data());
  auto loss = [&](const DVec& xd) {
    const RmsNormRef r = RmsNormDouble(rows, cols, eps, xd, gamma);
    double l = 0.0;
    for (int64_t i = 0; i < rows * cols; ++i) l += dy[i] * r.y[i];
    return l;
  };
  DVec want_dx(rows * cols);
  const double h = 1e-5;
  for (int64_t i = 0; i < rows * cols; ++i) {
    DVec xp = ToDouble(x), xm = ToDouble(x);
    xp[i] += h;
    xm[i] -= h;
    want_dx[i] = (loss(xp) - loss(xm)) / (2.0 * h);
  }
  ExpectClose(dx, want_dx, 1e-4, 1e-4, "RmsNormBackwardInput");

  Vec dgamma = Random(cols, "rms.dgamma0");
  DVec want_dgamma = ToDouble(dgamma);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      want_dgamma[c] += dy[r * cols + c] * x[r * cols + c] * ref.rstd[r];
    }
  }
  be_->RmsNormBackwardWeight(rows, cols, x.data(), rstd.data(), dy.data(), dgamma.data());
  ExpectClose(dgamma, want_dgamma, 1e-5, 1e-5, "RmsNormBackwardWeight dgamma");
}

// ---- Rotary position embedding ----

// A hand-computed case: D = 4, theta = 10000, so inv_freq = {1, 1/100}; position 0 is left
// alone and position 1 rotates pair (0, 2) by 1 radian and pair (1, 3) by 0.01 (atol 1e-6).
TEST_F(CpuBackendTest, RotaryHandComputed) {
  Vec x = {1, 2, 3, 4, 1, 2, 3, 4};  // B = 1, T = 2, one head of D = 4
  be_->RotaryForward(1, 2, 1, 4, 4, 10000.0f, x.data());
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  const DVec want = {
      1, 2, 3, 4, 1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
  ExpectClose(x, want, 1e-6, 0.0, "RotaryForward by hand");
  be_->RotaryBackward(1, 2, 1, 4, 4, 10000.0f, x.data());
  ExpectClose(x, DVec{1, 2, 3, 4, 1, 2, 3, 4}, 1e-6, 0.0, "RotaryBackward undoes it");
}

// Random heads inside wider rows: the rotated columns match a double rotation by the float32
// angle float(t) * float(1 / theta^(2i/D)) (atol 1e-6; the cos/sin are correctly rounded
// floats), and the columns outside the heads are untouched. RotaryBackward is the
// transpose: <R x, y> = <x, R^T y> (atol 1e-5).
TEST_F(CpuBackendTest, RotaryMatchesNaiveAndBackwardIsTheTranspose) {
  const int64_t B = 2, T = 9, heads = 3, D = 8, stride = 40, offset = 5;
  const float theta = 500000.0f;
  const Vec x0 = Random(B * T * stride, "rope.x", -2.0f, 2.0f);
  Vec x = x0;
  be_->RotaryForward(B, T, heads, D, stride, theta, x.data() + offset);
  DVec want = ToDouble(x0);
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    for (int64_t n = 0; n < heads; ++n) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const float inv_freq =
            1.0f / static_cast<float>(std::pow(double{theta}, double{2.0f * i / D}));
        const double angle = static_cast<float>(t) * inv_freq;
        const int64_t lo = bt * stride + offset + n * D + i, hi = lo + D / 2;
        want[lo] = x0[lo] * std::cos(angle) - x0[hi] * std::sin(angle);
        want[hi] = x0[hi] * std::cos(angle) + x0[lo] * std::sin(angle);
      }
    }
  }
  ExpectClose(x, want, 1e-6, 0.0, "RotaryForward");
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t c = 0; c < stride; ++c) {
      if (c < offset || c >= offset + heads * D) {
        EXPECT_EQ(x[bt * stride + c], x0[bt * stride + c]) << "untouched " << bt << "," << c;
      }
    }
  }
  const Vec y0 = Random(B * T * stride, "rope.y", -2.0f, 2.0f);
  Vec ry = y0;
  be_->RotaryBackward(B, T, heads, D, stride, theta, ry.data() + offset);
  double lhs = 0.0, rhs = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += double{x[i]} * y0[i];
    rhs += double{x0[i]} * ry[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-5);
}

// ---- SwiGLU ----

// Forward against double silu(g) * u (atol 1e-6, rtol 1e-6); backward against central
// differences of L = sum(dout * out) in double (h = 1e-6): atol 1e-6, rtol 1e-5.
TEST_F(CpuBackendTest, SwiGluForwardAndBackward) {
  const int64_t rows = 3, I = 5;
  const Vec gu = Random(rows * 2 * I, "swiglu.gu", -6.0f, 6.0f);
  const Vec dout = Random(rows * I, "swiglu.dout");
  Vec out(rows * I), dgu(rows * 2 * I);
  be_->SwiGluForward(rows, I, gu.data(), out.data());
  auto forward = [&](const DVec& g) {
    DVec o(rows * I);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < I; ++i) {
        const double a = g[r * 2 * I + i], u = g[r * 2 * I + I + i];
        o[r * I + i] = a / (1.0 + std::exp(-a)) * u;
      }
    }
    return o;
  };
  ExpectClose(out, forward(ToDouble(gu)), 1e-6, 1e-6, "SwiGluForward");
  be_->SwiGluBackward(rows, I, gu.data(), dout.data(), dgu.data());
  DVec want(gu.size());
  const double h = 1e-6;
  for (size_t i = 0; i < gu.size(); ++i) {
    DVec p = ToDouble(gu), m = ToDouble(gu);
    p[i] += h;
    m[i] -= h;
    const DVec op = forward(p), om = forward(m);
    double l = 0.0;
    for (int64_t j = 0; j < rows * I; ++j) l += dout[j] * (op[j] - om[j]);
    want[i] = l / (2.0 * h);
  }
  ExpectClose(dgu, want, 1e-6, 1e-5, "SwiGluBackward");
}

// ---- Embedding ----

// Exact: out = wte[token] + wpe[t] is one float addition per element; the backward pass
// accumulates in (b, t) row-major order, reproduced here with the same float additions.
TEST_F(CpuBackendTest, EmbeddingForwardAndBackward) {
  const int64_t B = 3, T = 6, C = 5, V = 4;  // V < B*T: tokens repeat
  const std::vector<int32_t> tokens = RandomTokens(B * T, V, "emb.tokens");
  const Vec wte = Random(V * C, "emb.wte");
  const Vec wpe = Random(T * C, "emb.wpe");
  Vec out(B * T * C);
  be_->EmbeddingForward(B, T, C, tokens.data(), wte.data(), wpe.data(), out.data());
  Vec want(B * T * C);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        want[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
      }
    }
  }
  ExpectBitEqual(out, want, "EmbeddingForward");

  const Vec dout = Random(B * T * C, "emb.dout");
  Vec dwte = Random(V * C, "emb.dwte0");
  Vec dwpe = Random(T * C, "emb.dwpe0");
  Vec want_dwte = dwte, want_dwpe = dwpe;
  DVec want_dwte_d = ToDouble(dwte);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        want_dwte[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        want_dwte_d[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        want_dwpe[t * C + c] += dout[(b * T + t) * C + c];
      }
    }
  }
  be_->EmbeddingBackward(B, T, C, tokens.data(), dout.data(), dwte.data(), dwpe.data());
  ExpectBitEqual(dwte, want_dwte, "EmbeddingBackward dwte");
  ExpectBitEqual(dwpe, want_dwpe, "EmbeddingBackward dwpe");
  ExpectClose(dwte, want_dwte_d, 1e-5, 0.0, "EmbeddingBackward dwte vs double");
}

// ---- Softmax cross-entropy ----

// The row statistics: max exact, inverse sum within rtol 1e-6 of 1 / sum exp(z - max) in
// double; probabilities recomputed from them (as the backward does) within atol 1e-7, rtol
// 1e-5 of softmax in double, rows summing to 1 (atol 1e-6); loss within atol 1e-5, rtol 1e-5
// of -log softmax[target] in double, including rows with large logits that overflow a naive
// exp.
TEST_F(CpuBackendTest, SoftmaxCrossEntropyForward) {
  const int64_t rows = 6, V = 11;
  Vec logits = Random(rows * V, "sce.logits", -4.0f, 4.0f);
  for (int64_t v = 0; v < V; ++v) logits[3 * V + v] += 1000.0f;  // exp would overflow
  for (int64_t v = 0; v < V; ++v) logits[4 * V + v] = 0.5f;      // uniform row
  logits[5 * V + 2] = 30.0f;                                     // one dominant logit
  const std::vector<int32_t> targets = {0, 10, 5, 7, 3, 2};
  Vec stats(2 * rows), losses(rows), probs(rows * V);
  be_->SoftmaxCrossEntropyForward(rows, V, V, logits.data(), targets.data(), stats.data(),
                                  losses.data());
  DVec want_p(rows * V), want_l(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double{logits[r * V + v]});
    EXPECT_EQ(stats[2 * r], static_cast<float>(mx)) << r;
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[r * V + v] - mx);
    EXPECT_NEAR(stats[2 * r + 1], 1.0 / sum, 1e-6 / sum) << r;
    for (int64_t v = 0; v < V; ++v) {
      want_p[r * V + v] = std::exp(logits[r * V + v] - mx) / sum;
      probs[r * V + v] = std::exp(logits[r * V + v] - stats[2 * r]) * stats[2 * r + 1];
    }
    want_l[r] = -std::log(want_p[r * V + targets[r]]);
    double psum = 0.0;
    for (int64_t v = 0; v < V; ++v) psum += probs[r * V + v];
    EXPECT_NEAR(psum, 1.0, 1e-6) << r;
  }
  ExpectClose(probs, want_p, 1e-7, 1e-5, "softmax probs");
  ExpectClose(losses, want_l, 1e-5, 1e-5, "cross-entropy loss");
  EXPECT_NEAR(losses[4], std::log(static_cast<double>(V)), 1e-6);
  // -log p for the dominant target is tiny but computed without cancellation to 0 - 0.
  EXPECT_GE(losses[5], 0.0f);
  EXPECT_LT(losses[5], 1e-10f);
}

// The fused loss gives the bits of the materialised softmax it replaced, whose float
// expressions are written out here: p = exp(l - max) stored, summed in column order, each
// p times 1 / sum; loss = log(sum) + max - l[target]; dlogits = scale * (p - onehot). In
// place over the logits too.
TEST_F(CpuBackendTest, SoftmaxCrossEntropyIsTheMaterialisedSoftmaxBitForBit) {
  const int64_t rows = 5, V = 37;
  Vec logits = Random(rows * V, "scem.logits", -8.0f, 8.0f);
  for (int64_t v = 0; v < V; ++v) logits[2 * V + v] += 500.0f;
  const std::vector<int32_t> targets = {36, 0, 17, 17, 5};
  const float scale = 1.0f / 5.0f;
  Vec want_loss(rows), want_d(rows * V), probs(rows * V);
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * V;
    float* p = probs.data() + r * V;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, l[v]);
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      p[v] = std::exp(l[v] - mx);
      sum += p[v];
    }
    const float inv = 1.0f / sum;
    for (int64_t v = 0; v < V; ++v) p[v] *= inv;
    want_loss[r] = std::log(sum) + mx - l[targets[r]];
    for (int64_t v = 0; v < V; ++v) {
      want_d[r * V + v] = scale * (p[v] - (v == targets[r] ? 1.0f : 0.0f));
    }
  }
  Vec stats(2 * rows), losses(rows), d(rows * V);
  be_->SoftmaxCrossEntropyForward(rows, V, V, logits.data(), targets.data(), stats.data(),
                                  losses.data());
  ExpectBitEqual(losses, want_loss, "SoftmaxCrossEntropyForward losses");
  be_->SoftmaxCrossEntropyBackward(rows, V, V, logits.data(), stats.data(), targets.data(), scale,
                                   d.data());
  ExpectBitEqual(d, want_d, "SoftmaxCrossEntropyBackward");
  Vec alias = logits;
  be_->SoftmaxCrossEntropyBackward(rows, V, V, alias.data(), stats.data(), targets.data(), scale,
                                   alias.data());
  ExpectBitEqual(alias, want_d, "SoftmaxCrossEntropyBackward in place");
}

// Rows ld floats apart (the LM head's padded logits) give the packed rows' bits, and the
// columns past V are neither read (NaN there changes nothing) nor written.
TEST_F(CpuBackendTest, SoftmaxCrossEntropyReadsRowsLdApart) {
  const int64_t rows = 3, V = 37, ld = 64;
  const Vec logits = Random(rows * V, "scel.logits", -5.0f, 5.0f);
  const std::vector<int32_t> targets = {1, 36, 0};
  Vec padded(rows * ld, std::nanf(""));
  be_->CopyRows(rows, V, logits.data(), V, padded.data(), ld);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(padded[r * ld + v], logits[r * V + v]);
  }
  Vec stats(2 * rows), losses(rows), pstats(2 * rows), plosses(rows), d(rows * V);
  be_->SoftmaxCrossEntropyForward(rows, V, V, logits.data(), targets.data(), stats.data(),
                                  losses.data());
  be_->SoftmaxCrossEntropyForward(rows, V, ld, padded.data(), targets.data(), pstats.data(),
                                  plosses.data());
  ExpectBitEqual(pstats, stats, "padded statistics");
  ExpectBitEqual(plosses, losses, "padded losses");
  be_->SoftmaxCrossEntropyBackward(rows, V, V, logits.data(), stats.data(), targets.data(), 0.5f,
                                   d.data());
  be_->SoftmaxCrossEntropyBackward(rows, V, ld, padded.data(), stats.data(), targets.data(), 0.5f,
                                   padded.data());
  Vec packed(rows * V);
  be_->CopyRows(rows, V, padded.data(), ld, packed.data(), V);
  ExpectBitEqual(packed, d, "padded gradient");
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = V; v < ld; ++v) ASSERT_TRUE(std::isnan(padded[r * ld + v])) << r << " " << v;
  }
}

// Forward then backward: the gradient of the mean loss sums to 0 over each row (atol 1e-7)
// and matches finite differences of the loss in double (atol 1e-6).
TEST_F(CpuBackendTest, SoftmaxCrossEntropyBackward) {
  const int64_t rows = 4, V = 9;
  const std::vector<int32_t> targets = {8, 0, 4, 4};
  const float scale = 1.0f / 4.0f;
  const Vec logits = Random(rows * V, "sceb.logits", -3.0f, 3.0f);
  Vec stats(2 * rows), l(rows), g(rows * V);
  be_->SoftmaxCrossEntropyForward(rows, V, V, logits.data(), targets.data(), stats.data(),
                                  l.data());
  be_->SoftmaxCrossEntropyBackward(rows, V, V, logits.data(), stats.data(), targets.data(), scale,
                                   g.data());
  auto row_loss = [&](int64_t r, const DVec& z) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, z[v]);
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx);
    return std::log(s) + mx - z[targets[r]];
  };
  DVec want_g(rows * V);
  for (int64_t r = 0; r < rows; ++r) {
    double gsum = 0.0;
    for (int64_t v = 0; v < V; ++v) gsum += g[r * V + v];
    EXPECT_NEAR(gsum, 0.0, 1e-7) << r;
    const DVec z(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    for (int64_t v = 0; v < V; ++v) {
      DVec zp = z, zm = z;
      zp[v] += 1e-6;
      zm[v] -= 1e-6;
      want_g[r * V + v] = scale * (row_loss(r, zp) - row_loss(r, zm)) / 2e-6;
    }
  }
  ExpectClose(g, want_g, 1e-6, 0.0, "cross-entropy gradient vs finite differences");
}

// ---- Optimizers ----

// Hand-computed values; tolerance atol 1e-6.
TEST_F(CpuBackendTest, SgdStepMomentumAndWeightDecay) {
  // lr 0.1, momentum 0.9, weight decay 0.1.
  // Step 1 (buf = g'):         w0 = 1:  g' = 0.5 + 0.1*1 = 0.6;   buf = 0.6;   w = 0.94
  //                            w0 = -2: g' = -1 + 0.1*-2 = -1.2;  buf = -1.2;  w = -1.88
  // Step 2 (buf = .9 buf + g'): g' = 0.5 + 0.094 = 0.594; buf = 0.54 + 0.594 = 1.134;
  //                            w = 0.94 - 0.1134 = 0.8266
  //                            g' = -1 - 0.188 = -1.188; buf = -1.08 - 1.188 = -2.268;
  //                            w = -1.88 + 0.2268 = -1.6532
  Vec w = {1.0f, -2.0f};
  const Vec g = {0.5f, -1.0f};
  Vec buf = {123.0f, -456.0f};  // ignored on the first step
  be_->SgdStep(2, 0.1f, 0.9f, 0.1f, /*first_step=*/true, w.data(), g.data(), buf.data());
  EXPECT_NEAR(buf[0], 0.6f, 1e-6f);
  EXPECT_NEAR(buf[1], -1.2f, 1e-6f);
  EXPECT_NEAR(w[0], 0.94f, 1e-6f);
  EXPECT_NEAR(w[1], -1.88f, 1e-6f);
  be_->SgdStep(2, 0.1f, 0.9f, 0.1f, /*first_step=*/false, w.data(), g.data(), buf.data());
  EXPECT_NEAR(buf[0], 1.134f, 1e-6f);
  EXPECT_NEAR(buf[1], -2.268f, 1e-6f);
  EXPECT_NEAR(w[0], 0.8266f, 1e-6f);
  EXPECT_NEAR(w[1], -1.6532f, 1e-6f);

  // Plain SGD: momentum 0, no buffer. w = 1 - 0.1 * (0.5 + 0.01*1) = 0.949.
  Vec w2 = {1.0f};
  const Vec g2 = {0.5f};
  be_->SgdStep(1, 0.1f, 0.0f, 0.01f, /*first_step=*/true, w2.data(), g2.data(), nullptr);
  EXPECT_NEAR(w2[0], 0.949f, 1e-6f);
  be_->SgdStep(1, 0.1f, 0.0f, 0.0f, /*first_step=*/false, w2.data(), g2.data(), nullptr);
  EXPECT_NEAR(w2[0], 0.899f, 1e-6f);
}

// Hand-computed values for two steps; tolerance atol 1e-6 (w, m) and atol 1e-7 for v,
// which is ~1e-3 in size and carries the float rounding of 1 - 0.999f (relative 1.3e-5).
TEST_F(CpuBackendTest, AdamWStepMatchesHandComputedValues) {
  const float lr = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  Vec w = {1.0f, -0.5f, 2.0f};
  const Vec g = {0.5f, -2.0f, 0.0f};
  Vec m = {0.0f, 0.0f, 0.0f}, v = {0.0f, 0.0f, 0.0f};
  // Step 1: bc1 = 0.1, bc2 = 0.001. Decay: w *= 1 - 0.1*0.01 = 0.999.
  //  [0]: m = 0.05, v = 0.00025, mhat = 0.5, vhat = 0.25 -> w = 0.999 - 0.1*0.5/0.5 = 0.899
  //  [1]: m = -0.2, v = 0.004, mhat = -2, vhat = 4 -> w = -0.4995 + 0.1 = -0.3995
  //  [2]: g = 0: m = v = 0, update 0/(0+eps) = 0 -> w = 1.998
  be_->AdamWStep(3, lr, b1, b2, eps, wd, 1.0f - b1, 1.0f - b2, w.data(), g.data(), m.data(),
                 v.data());
  EXPECT_NEAR(m[0], 0.05f, 1e-6f);
  EXPECT_NEAR(v[0], 0.00025f, 1e-7f);
  EXPECT_NEAR(m[1], -0.2f, 1e-6f);
  EXPECT_NEAR(v[1], 0.004f, 1e-7f);
  EXPECT_NEAR(w[0], 0.899f, 1e-6f);
  EXPECT_NEAR(w[1], -0.3995f, 1e-6f);
  EXPECT_NEAR(w[2], 1.998f, 1e-6f);
  // Step 2: bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999. Decay factor 0.999.
  //  [0]: m = 0.045 + 0.05 = 0.095, v = 0.00024975 + 0.00025 = 0.00049975,
  //       mhat = 0.5, vhat = 0.25 -> w = 0.899*0.999 - 0.1 = 0.798101
  //  [1]: m = -0.18 - 0.2 = -0.38, v = 0.003996 + 0.004 = 0.007996,
  //       mhat = -2, vhat = 4 -> w = -0.3995*0.999 + 0.1 = -0.2991005
  be_->AdamWStep(3, lr, b1, b2, eps, wd, 1.0f - b1 * b1, 1.0f - b2 * b2, w.data(), g.data(),
                 m.data(), v.data());
  EXPECT_NEAR(m[0], 0.095f, 1e-6f);
  EXPECT_NEAR(v[0], 0.00049975f, 1e-7f);
  EXPECT_NEAR(w[0], 0.798101f, 1e-6f);
  EXPECT_NEAR(w[1], -0.2991005f, 1e-6f);
  EXPECT_NEAR(w[2], 1.998f * 0.999f, 1e-6f);
}

// Element-wise against the formula in double on random inputs; atol 1e-6, rtol 1e-5.
TEST_F(CpuBackendTest, AdamWStepMatchesFormulaOnRandomInputs) {
  const int64_t n = 64;
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const float bc1 = 1.0f - std::pow(b1, 3.0f), bc2 = 1.0f - std::pow(b2, 3.0f);
  Vec w = Random(n, "adam.w"), g = Random(n, "adam.g");
  Vec m = Random(n, "adam.m", -0.1f, 0.1f), v = Random(n, "adam.v", 0.0f, 0.01f);
  DVec want_w(n), want_m(n), want_v(n);
  for (int64_t i = 0; i < n; ++i) {
    double wi = w[i] * (1.0 - double{lr} * wd);
    want_m[i] = double{b1} * m[i] + (1.0 - b1) * g[i];
    want_v[i] = double{b2} * v[i] + (1.0 - b2) * double{g[i]} * g[i];
    wi -= double{lr} * (want_m[i] / bc1) / (std::sqrt(want_v[i] / bc2) + eps);
    want_w[i] = wi;
  }
  be_->AdamWStep(n, lr, b1, b2, eps, wd, bc1, bc2, w.data(), g.data(), m.data(), v.data());
  ExpectClose(m, want_m, 1e-7, 1e-5, "AdamW m");
  ExpectClose(v, want_v, 1e-9, 1e-5, "AdamW v");
  ExpectClose(w, want_w, 1e-6, 1e-5, "AdamW w");
}

// bf16 rounding is PyTorch's: nearest, ties to even, NaN kept (quiet), overflow to inf.
TEST(Bf16Test, RoundsToNearestEvenKeepsNanAndOverflowsToInfinity) {
  Backend* be = CpuBackend();
  const float ulp = std::ldexp(1.0f, -7);  // bf16's spacing in [1, 2)
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> x = {1.0f,
                                1.0f + ulp / 2,             // a tie: to even (1)
                                1.0f + 3 * ulp / 2,         // a tie: to even (1 + 2 ulp)
                                1.0f + ulp / 2 + ulp / 64,  // above the tie: up
                                -1.0f - ulp / 4,            // below half: down in magnitude
                                inf, -inf, max, 0.0f, -0.0f, 1e-40f};
  const std::vector<float> want = {1.0f, 1.0f, 1.0f + 2 * ulp, 1.0f + ulp, -1.0f, inf, -inf,
                                   inf, 0.0f, -0.0f, 0.0f};
  std::vector<float> y(x.size());
  be->RoundToBf16(static_cast<int64_t>(x.size()), x.data(), y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    if (i == x.size() - 1) {  // a subnormal keeps its upper bits: not zero, but bf16-exact
      uint32_t u;
      std::memcpy(&u, &y[i], 4);
      EXPECT_EQ(u & 0xffffu, 0u);
      continue;
    }
    EXPECT_EQ(std::signbit(y[i]), std::signbit(want[i])) << i;
    EXPECT_EQ(y[i], want[i]) << "element " << i << " = " << x[i];
  }
  float n = nan;
  be->RoundToBf16(1, &n, &n);
  EXPECT_TRUE(std::isnan(n));
  // The bits and back: exactly the rounded values, half the bytes.
  std::vector<uint16_t> bits(x.size());
  std::vector<float> back(x.size());
  be->ToBf16(static_cast<int64_t>(x.size()), x.data(), bits.data());
  be->FromBf16(static_cast<int64_t>(x.size()), bits.data(), back.data());
  EXPECT_EQ(bits[0], 0x3f80);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(std::memcmp(&back[i], &y[i], 4), 0) << i;
}

}  // namespace
}  // namespace baton
