// The CPU reference backend: OpenBLAS for GEMM, oneDNN for bf16 GEMM where the CPU
// multiplies bf16 (bf16_gemm.h), plain loops for the rest.
//
// Every loop is written so that the compiler cannot reorder a reduction (no -ffast-math, no
// OpenMP reductions): the order of floating-point additions is the order of the loops.
//
// GEMM threads are baton's, not OpenBLAS's. OpenBLAS splits C among its threads differently
// for different thread counts, and on many kernel sets (Prescott, Haswell and so Zen; seen
// on OpenBLAS 0.3.21) the bits of an element depend on where the split falls, so a run with
// 2 threads differed from one with 1. OpenBLAS therefore runs single-threaded, and Gemm
// splits C itself into row blocks of a fixed size (kGemmRowBlock), each one single-threaded
// sgemm call; threads only share out the blocks. The bits depend on the block size, which
// never changes, and not on the number of threads.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/bf16.h"
#include "common/core/bf16_gemm.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_device.h"
#include "common/core/flash_attention_math.h"
#include "common/core/flash_tiles.h"
#include "common/core/gelu_math.h"
#include "common/core/mutex.h"
#include "common/core/rotary_math.h"

namespace baton {
namespace {

using gelu_math::GeluGrad;
using gelu_math::GeluOf;

// The element-wise loops below are also compiled for AVX-512 (x86-64-v4) and AVX2
// (x86-64-v3), and the dynamic loader picks the best the CPU runs (GCC's target_clones; one
// binary for every x86-64). The bits are the same on each: an element-wise float
// operation rounds the same at any vector width, nothing is contracted into an FMA
// (-ffp-contract=off), and a reduction keeps its loop order at any width (no
// -fassociative-math). Other compilers (clang's checks) build the default alone.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define BATON_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BATON_CPU_CLONES
#endif

BATON_CPU_CLONES void AddLoop(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

BATON_CPU_CLONES void ScaleLoop(int64_t n, float scale, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
}

BATON_CPU_CLONES void RoundToBf16Loop(int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = baton::RoundToBf16(x[i]);
}

BATON_CPU_CLONES void ToBf16Loop(int64_t n, const float* x, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = FloatToBf16Bits(x[i]);
}

BATON_CPU_CLONES void FromBf16Loop(int64_t n, const uint16_t* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = Bf16BitsToFloat(x[i]);
}

// Row r of y += bias.
// Each row rounded to bf16 right after its sums, while it is in cache (round_bf16).
BATON_CPU_CLONES void AddBiasLoop(int64_t rows, int64_t cols, const float* bias, float* y,
                                  bool round_bf16) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    if (round_bf16) RoundToBf16Loop(cols, row, row);
  }
}

// dbias[c] += dy[r][c] for r in order: each column's sum in row order, columns side by side.
BATON_CPU_CLONES void BiasGradLoop(int64_t rows, int64_t cols, const float* dy, float* dbias) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) dbias[c] += row[c];
  }
}

// The same sums of bf16 bits, each widened exactly as it is added.
BATON_CPU_CLONES void BiasGradBf16Loop(int64_t rows, int64_t cols, const uint16_t* dy,
                                       float* dbias) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) dbias[c] += Bf16BitsToFloat(row[c]);
  }
}

BATON_CPU_CLONES void BiasGeluLoop(int64_t rows, int64_t cols, const float* x, const float* bias,
                                   float* pre, float* out, bool round_bf16) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* pr = pre + r * cols;
    float* orow = out + r * cols;
    if (bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = xr[c] + bias[c];
        pr[c] = v;
        orow[c] = GeluOf(v);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = xr[c];
        pr[c] = v;
        orow[c] = GeluOf(v);
      }
    }
    if (round_bf16) RoundToBf16Loop(cols, orow, orow);
  }
}

BATON_CPU_CLONES void GeluBackwardLoop(int64_t n, const float* pre, const float* dy, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * GeluGrad(pre[i]);
}

BATON_CPU_CLONES void AdamWLoop(int64_t n, float lr, float beta1, float beta2, float eps,
                                float weight_decay, float bias_correction1, float bias_correction2,
                                float* w, const float* g, float* m, float* v) {
  const float decay = 1.0f - lr * weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    w[i] *= decay;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    const float mhat = m[i] / bias_correction1;
    const float vhat = v[i] / bias_correction2;
    w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
  }
}

// Rows of C per single-threaded sgemm call. Fixed: on some kernel sets changing it changes
// the bits of every GEMM with more rows (and so every digest). Each call packs B again, so
// a larger block
// packs less often: 256 rows ran a GPT's 512-row products 12-15% faster than 128 on one
// AVX-512 core (docs/benchmarks.md) and still gives two threads a block each.
constexpr int64_t kGemmRowBlock = 256;
// Below this many multiply-adds a GEMM runs on the calling thread alone (the bits are the
// same either way; only the hand-off cost differs).
constexpr int64_t kGemmParallelMacs = int64_t{1} << 20;

// The threads Gemm shares row blocks out to. One job at a time: a Gemm that finds the
// pool busy (another stage thread's GEMM) runs its blocks itself, with the same bits.
class GemmPool {
 public:
  static GemmPool& Get() {
    static GemmPool* const pool = new GemmPool();  // never destroyed: threads outlive main
    return *pool;
  }

  // Total threads a GEMM may use, the caller's included; at least 1.
  void SetThreads(int threads) {
    threads = std::max(1, threads);
    std::lock_guard<std::mutex> run(run_mu_);  // no job in flight while workers change
    StopWorkers();
    threads_.store(threads);
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  int threads() const { return threads_.load(); }

  // Calls fn(b) for every b in [0, blocks), each exactly once, on up to threads() threads
  // (the caller among them); returns when all are done.
  void Run(int64_t blocks, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock() || workers_.empty() || blocks < 2) {
      for (int64_t b = 0; b < blocks; ++b) fn(b);
      return;
    }
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->blocks = blocks;
    job->pending = blocks;
    {
      MutexLock lock(mu_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    Work(*job);
    MutexLock lock(mu_);
    done_.wait(lock.native(), [&] { return job->pending == 0; });
    job_.reset();
  }

 private:
  // One Run's blocks. A worker that wakes late holds the Job it saw, whose counter is then
  // exhausted, so it can never run an old job's fn (gone with its Gemm call) on a new
  // job's blocks.
  struct Job {
    const std::function<void(int64_t)>* fn = nullptr;
    int64_t blocks = 0;
    std::atomic<int64_t> next{0};
    int64_t pending = 0;  // guarded by GemmPool::mu_
  };

  GemmPool() {
    // OpenBLAS's own default (OPENBLAS_NUM_THREADS, else the cores) becomes baton's, and
    // OpenBLAS itself goes single-threaded for good.
    const int initial = openblas_get_num_threads();
    openblas_set_num_threads(1);
    SetThreads(initial);
  }

  // Takes blocks of `job` until none is left.
  void Work(Job& job) {
    int64_t finished = 0;
    for (int64_t b; (b = job.next.fetch_add(1)) < job.blocks;) {
      (*job.fn)(b);
      ++finished;
    }
    if (finished == 0) return;
    MutexLock lock(mu_);
    job.pending -= finished;
    if (job.pending == 0) done_.notify_all();
  }

  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        MutexLock lock(mu_);
        wake_.wait(lock.native(),
                   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      if (job != nullptr) Work(*job);
    }
  }

  void StopWorkers() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    MutexLock lock(mu_);
    stop_ = false;
  }

  // Held for a whole job, and while the workers change. A std::mutex: Run only tries it
  // (a GEMM called from inside a job runs inline), which the analysis cannot follow.
  std::mutex run_mu_;
  std::vector<std::thread> workers_;  // guarded by run_mu_
  std::atomic<int> threads_{1};

  Mutex mu_;
  std::condition_variable wake_;  // a new job, or stop
  std::condition_variable done_;  // a job's pending reached 0
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);  // the job in flight, if any
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // counts jobs
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Calls product(i0, rows) for each fixed row block of an m x n x k product: rows
// [i0, i0 + rows) of C and of op(A) (rows of A, or columns of A when it is transposed).
// Small products run on the calling thread; larger ones share the blocks among the pool's
// threads. Either way each block is the same call, so the bits do not depend on threads.
void ForEachRowBlock(int64_t m, int64_t n, int64_t k,
                     const std::function<void(int64_t, int64_t)>& product) {
  const int64_t blocks = (m + kGemmRowBlock - 1) / kGemmRowBlock;
  const std::function<void(int64_t)> block = [&](int64_t r) {
    const int64_t i0 = r * kGemmRowBlock;
    product(i0, std::min(kGemmRowBlock, m - i0));
  };
  if (m * n * k < kGemmParallelMacs) {
    for (int64_t r = 0; r < blocks; ++r) block(r);
  } else {
    GemmPool::Get().Run(blocks, block);
  }
}

// A tile kernel's block run by the calling thread alone (flash_tiles.h).
constexpr flash_tiles::Threads kOneThread{0, 1, 0, 1};

class CpuBackendImpl final : public Backend {
 public:
  CpuBackendImpl() { GemmPool::Get(); }  // OpenBLAS single-threaded before the first GEMM

  Device device() const override { return Device::kCpu; }

  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      // BLAS would still scale C by beta; keep that meaning.
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      }
      return;
    }
    ForEachRowBlock(m, n, k, [&](int64_t i0, int64_t rows) {
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(n), static_cast<int>(k), alpha,
                  trans_a ? a + i0 : a + i0 * lda, static_cast<int>(lda), b,
                  static_cast<int>(ldb), beta, c + i0 * ldc, static_cast<int>(ldc));
    });
  }

  void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                float* c, int64_t ldc) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      Gemm(trans_a, trans_b, m, n, k, alpha, nullptr, lda, nullptr, ldb, beta, c, ldc);
      return;
    }
    if (CpuBf16Kernels().onednn) {
      // The same row blocks as Gemm, each one single-threaded oneDNN product (bf16_gemm.h).
      ForEachRowBlock(m, n, k, [&](int64_t i0, int64_t rows) {
        OnednnGemmBf16(trans_a, trans_b, rows, n, k, alpha, trans_a ? a + i0 : a + i0 * lda, lda,
                       b, ldb, beta, c + i0 * ldc, ldc);
      });
      return;
    }
    // The portable path: the elements each operand spans in memory (op(A) is m x k, op(B)
    // is k x n), widened to float32 and multiplied by sgemm.
    const int64_t a_extent = trans_a ? (k - 1) * lda + m : (m - 1) * lda + k;
    const int64_t b_extent = trans_b ? (n - 1) * ldb + k : (k - 1) * ldb + n;
    // Freed when the product is done; not zeroed first (the widening writes every element).
    std::unique_ptr<float[]> wide_a(new float[a_extent]), wide_b(new float[b_extent]);
    FromBf16(a_extent, a, wide_a.get());
    FromBf16(b_extent, b, wide_b.get());
    Gemm(trans_a, trans_b, m, n, k, alpha, wide_a.get(), lda, wide_b.get(), ldb, beta, c, ldc);
  }

  void Add(int64_t n, const float* a, const float* b, float* out) override {
    AddLoop(n, a, b, out);
  }

  void Scale(int64_t n, float scale, const float* x, float* y) override {
    ScaleLoop(n, scale, x, y);
  }

  void Fill(int64_t n, float value, float* y) override { std::fill(y, y + n, value); }

  void Copy(int64_t n, const float* x, float* y) override {
    if (n > 0) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
  }

  void CopyRows(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y,
                int64_t ldy) override {
    if (cols <= 0) return;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(y + r * ldy, x + r * ldx, static_cast<size_t>(cols) * sizeof(float));
    }
  }

  void RoundToBf16(int64_t n, const float* x, float* y) override { RoundToBf16Loop(n, x, y); }
  void ToBf16(int64_t n, const float* x, uint16_t* y) override { ToBf16Loop(n, x, y); }
  void FromBf16(int64_t n, const uint16_t* x, float* y) override { FromBf16Loop(n, x, y); }

  double Sum(int64_t n, const float* x) override {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }

  double SumSquares(int64_t n, const float* x) override {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  }

  void MeanInto(int64_t n, const float* x, float* out) override {
    out[0] = static_cast<float>(Sum(n, x) / static_cast<double>(n));
  }

  void AddBias(int64_t rows, int64_t cols, const float* bias, float* y, bool round_bf16) override {
    AddBiasLoop(rows, cols, bias, y, round_bf16);
  }

  void BiasGrad(int64_t rows, int64_t cols, const float* dy, float* dbias) override {
    BiasGradLoop(rows, cols, dy, dbias);
  }

  void BiasGradBf16(int64_t rows, int64_t cols, const uint16_t* dy, float* dbias) override {
    BiasGradBf16Loop(rows, cols, dy, dbias);
  }

  void BiasGelu(int64_t rows, int64_t cols, const float* x, const float* bias, float* pre,
                float* out, bool round_bf16) override {
    BiasGeluLoop(rows, cols, x, bias, pre, out, round_bf16);
  }

  void GeluBackward(int64_t n, const float* pre, const float* dy, float* dx) override {
    GeluBackwardLoop(n, pre, dy, dx);
  }

  void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                        const float* gamma, const float* beta, float* y, float* mean,
                        float* rstd) override {
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum += xr[c];
      const float m = sum * inv_cols;
      float var = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float d = xr[c] - m;
        var += d * d;
      }
      const float s = 1.0f / std::sqrt(var * inv_cols + eps);
      float* yr = y + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * s * gamma[c] + beta[c];
      mean[r] = m;
      rstd[r] = s;
    }
  }

  void LayerNormBackwardInput(int64_t rows, int64_t cols, const float* x, const float* mean,
                              const float* rstd, const float* gamma, const float* dy,
                              float* dx) override {
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      const float m = mean[r];
      const float s = rstd[r];
      // dxhat = dy * gamma; dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
      float sum_dxhat = 0.0f;
      float sum_dxhat_xhat = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - m) * s;
        const float dxhat = dyr[c] * gamma[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
      }
      const float mean_dxhat = sum_dxhat * inv_cols;
      const float mean_dxhat_xhat = sum_dxhat_xhat * inv_cols;
      for (int64_t c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - m) * s;
        const float dxhat = dyr[c] * gamma[c];
        dxr[c] = s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
      }
    }
  }

  void LayerNormBackwardWeight(int64_t rows, int64_t cols, const float* x, const float* mean,
                               const float* rstd, const float* dy, float* dgamma,
                               float* dbeta) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float m = mean[r];
      const float s = rstd[r];
      for (int64_t c = 0; c < cols; ++c) {
        dgamma[c] += dyr[c] * ((xr[c] - m) * s);
        dbeta[c] += dyr[c];
      }
    }
  }

  void RmsNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                      float* y, float* rstd) override {
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float sq = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sq += xr[c] * xr[c];
      const float s = 1.0f / std::sqrt(sq * inv_cols + eps);
      float* yr = y + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] * s) * gamma[c];
      rstd[r] = s;
    }
  }

  void RmsNormBackwardInput(int64_t rows, int64_t cols, const float* x, const float* rstd,
                            const float* gamma, const float* dy, float* dx) override {
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      const float s = rstd[r];
      // dxhat = dy * gamma; dx = s * (dxhat - xhat * mean(dxhat * xhat)).
      float sum_dxhat_xhat = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum_dxhat_xhat += (dyr[c] * gamma[c]) * (xr[c] * s);
      const float mean_dxhat_xhat = sum_dxhat_xhat * inv_cols;
      for (int64_t c = 0; c < cols; ++c) {
        dxr[c] = s * (dyr[c] * gamma[c] - (xr[c] * s) * mean_dxhat_xhat);
      }
    }
  }

  void RmsNormBackwardWeight(int64_t rows, int64_t cols, const float* x, const float* rstd,
                             const float* dy, float* dgamma) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      const float s = rstd[r];
      for (int64_t c = 0; c < cols; ++c) dgamma[c] += dyr[c] * (xr[c] * s);
    }
  }

  void RotaryForward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                     float theta, float* x) override {
    Rotate(B, T, heads, D, row_stride, theta, 1.0f, x);
  }

  void RotaryBackward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                      float theta, float* x) override {
    Rotate(B, T, heads, D, row_stride, theta, -1.0f, x);
  }

  using Backend::AttentionBackward;
  using Backend::AttentionForward;

  void AttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, const float* qkv,
                        float* att, float* y) override {
    const int64_t C = H * D;
    const int64_t W = (H + 2 * KVH) * D;  // qkv row width
    const int64_t group = H / KVH;        // query heads per kv head
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / group;
        const float* q = qkv + b * T * W + h * D;
        const float* k = qkv + b * T * W + C + kvh * D;
        const float* v = qkv + b * T * W + C + KVH * D + kvh * D;
        float* a = att + (b * H + h) * T * T;
        // Scores for the whole square; the causal softmax below ignores j > i.
        Gemm(false, true, T, T, D, scale, q, W, k, W, 0.0f, a, T);
        for (int64_t i = 0; i < T; ++i) {
          float* row = a + i * T;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
          float sum = 0.0f;
          for (int64_t j = 0; j <= i; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
          for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
        }
        Gemm(false, false, T, D, T, 1.0f, a, T, v, W, 0.0f, y + b * T * C + h * D, C);
      }
    }
  }

  void SetAttentionKernel(AttentionKernel kernel) override { attention_.store(kernel); }
  AttentionKernel attention_kernel() const override { return attention_.load(); }

  void FusedAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                             const float* qkv, float* y, float* lse) override {
    const int64_t C = H * D, W = (H + 2 * KVH) * D, G = H / KVH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    float acc[flash::kMaxHeadSize];
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const float* base = qkv + b * T * W;
        const float* k = base + C + (h / G) * D;
        const float* v = base + C + KVH * D + (h / G) * D;
        for (int64_t i = 0; i < T; ++i) {
          lse[(b * H + h) * T + i] = flash::ForwardRow(base + i * W + h * D, k, v, W, D, i,
                                                       scale, acc, y + (b * T + i) * C + h * D);
        }
      }
    }
  }

  void FusedAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                              const float* qkv, const float* y, const float* lse,
                              const float* dy, float* dqkv, float* scratch) override {
    const int64_t C = H * D, W = (H + 2 * KVH) * D, G = H / KVH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    float* const delta = scratch;
    for (int64_t b = 0; b < B; ++b) {  // pass 1
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          const int64_t row = (b * T + i) * C + h * D;
          delta[(b * H + h) * T + i] = flash::Dot(dy + row, y + row, D);
        }
      }
    }
    float acc[flash::kMaxHeadSize];
    for (int64_t b = 0; b < B; ++b) {
      const float* base = qkv + b * T * W;
      for (int64_t h = 0; h < H; ++h) {  // pass 2
        const float* k = base + C + (h / G) * D;
        const float* v = base + C + KVH * D + (h / G) * D;
        for (int64_t i = 0; i < T; ++i) {
          const int64_t r = (b * H + h) * T + i;
          flash::BackwardQueryRow(base + i * W + h * D, k, v, W, D, i, scale, lse[r],
                                  dy + (b * T + i) * C + h * D, delta[r], acc,
                                  dqkv + (b * T + i) * W + h * D);
        }
      }
      for (int64_t g = 0; g < KVH; ++g) {  // pass 3, dv summed in place as on CUDA
        for (int64_t j = 0; j < T; ++j) {
          float* row = dqkv + (b * T + j) * W;
          float* const dv = row + C + KVH * D + g * D;
          flash::BackwardKeyRow(base, dy + b * T * C, lse + b * H * T, delta + b * H * T, T, H, KVH,
                                D, g, j, scale, acc, dv, row + C + g * D, dv);
        }
      }
    }
  }

  // The tile kernels' blocks in turn, each as one thread (flash_tiles.h): the contract the
  // CUDA backend runs on tensor cores, so bf16 jobs on either device take the same steps.
  bool RunsTiledAttention(int64_t D) const override { return true; }

  void TiledAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                             const float* qkv, float* y, float* lse) override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int64_t tiles = (T + flash_tiles::kTile - 1) / flash_tiles::kTile;
    std::vector<unsigned char> smem(flash_tiles::ForwardSmemBytes(static_cast<int>(D)));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t qt = 0; qt < tiles; ++qt) {
          flash_tiles::ForwardBlock(kOneThread, smem.data(), T, H, KVH, static_cast<int>(D), scale,
                                    b, h, qt, qkv, y, lse);
        }
      }
    }
  }

  void TiledAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                              const float* qkv, const float* y, const float* lse, const float* dy,
                              float* dqkv, float* scratch) override {
    const int d = static_cast<int>(D);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int64_t tiles = (T + flash_tiles::kTile - 1) / flash_tiles::kTile, C = H * D;
    float* const delta = scratch;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          const int64_t row = (b * T + i) * C + h * D;
          delta[(b * H + h) * T + i] = flash_tiles::DeltaRow(dy + row, y + row, d);
        }
      }
    }
    std::vector<unsigned char> smem(
        std::max(flash_tiles::QueryGradSmemBytes(d), flash_tiles::KeyGradSmemBytes(d)));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t qt = 0; qt < tiles; ++qt) {
          flash_tiles::QueryGradBlock(kOneThread, smem.data(), T, H, KVH, d, scale, b, h, qt, qkv,
                                      dy, lse, delta, dqkv);
        }
      }
      for (int64_t g = 0; g < KVH; ++g) {
        for (int64_t kt = 0; kt < tiles; ++kt) {
          flash_tiles::KeyGradBlock(kOneThread, smem.data(), T, H, KVH, d, scale, b, g, kt, qkv, dy,
                                    lse, delta, dqkv);
        }
      }
    }
  }

  void AttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, const float* qkv,
                         const float* att, const float* dy, float* dqkv, float* scratch) override {
    const int64_t C = H * D;
    const int64_t W = (H + 2 * KVH) * D;
    const int64_t group = H / KVH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / group;
        // The first query head of a group writes its kv head's dk and dv; the others add
        // to them, in ascending order.
        const float beta = h % group == 0 ? 0.0f : 1.0f;
        const float* q = qkv + b * T * W + h * D;
        const float* k = qkv + b * T * W + C + kvh * D;
        const float* v = qkv + b * T * W + C + KVH * D + kvh * D;
        float* dq = dqkv + b * T * W + h * D;
        float* dk = dqkv + b * T * W + C + kvh * D;
        float* dv = dqkv + b * T * W + C + KVH * D + kvh * D;
        const float* a = att + (b * H + h) * T * T;
        const float* dyh = dy + b * T * C + h * D;
        // dv = att^T dy; datt = dy v^T.
        Gemm(true, false, T, D, T, 1.0f, a, T, dyh, C, beta, dv, W);
        float* ds = scratch;
        Gemm(false, true, T, T, D, 1.0f, dyh, C, v, W, 0.0f, ds, T);
        // Softmax backward, row by row: ds = att * (datt - sum_j att * datt).
        for (int64_t i = 0; i < T; ++i) {
          const float* ar = a + i * T;
          float* dr = ds + i * T;
          float dot = 0.0f;
          for (int64_t j = 0; j <= i; ++j) dot += ar[j] * dr[j];
          for (int64_t j = 0; j <= i; ++j) dr[j] = ar[j] * (dr[j] - dot);
          for (int64_t j = i + 1; j < T; ++j) dr[j] = 0.0f;
        }
        // dq = ds k * scale; dk = ds^T q * scale.
        Gemm(false, false, T, D, T, scale, ds, T, k, W, 0.0f, dq, W);
        Gemm(true, false, T, D, T, scale, ds, T, q, W, beta, dk, W);
      }
    }
  }

  void SwiGluForward(int64_t rows, int64_t I, const float* gate_up, float* out) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = gate_up + r * 2 * I;
      const float* u = g + I;
      float* o = out + r * I;
      for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }

  void SwiGluBackward(int64_t rows, int64_t I, const float* gate_up, const float* dout,
                      float* dgate_up) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = gate_up + r * 2 * I;
      const float* u = g + I;
      const float* d = dout + r * I;
      float* dg = dgate_up + r * 2 * I;
      float* du = dg + I;
      for (int64_t i = 0; i < I; ++i) {
        const float sig = 1.0f / (1.0f + std::exp(-g[i]));
        dg[i] = d[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
        du[i] = d[i] * (g[i] / (1.0f + std::exp(-g[i])));
      }
    }
  }

  void EmbeddingForward(int64_t B, int64_t T, int64_t C, const int32_t* tokens,
                        const float* wte, const float* wpe, float* out) override {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float* te = wte + static_cast<int64_t>(tokens[b * T + t]) * C;
        float* o = out + (b * T + t) * C;
        if (wpe == nullptr) {
          for (int64_t c = 0; c < C; ++c) o[c] = te[c];
          continue;
        }
        const float* pe = wpe + t * C;
        for (int64_t c = 0; c < C; ++c) o[c] = te[c] + pe[c];
      }
    }
  }

  void EmbeddingBackward(int64_t B, int64_t T, int64_t C, const int32_t* tokens,
                         const float* dout, float* dwte, float* dwpe) override {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float* d = dout + (b * T + t) * C;
        float* te = dwte + static_cast<int64_t>(tokens[b * T + t]) * C;
        for (int64_t c = 0; c < C; ++c) te[c] += d[c];
        if (dwpe == nullptr) continue;
        float* pe = dwpe + t * C;
        for (int64_t c = 0; c < C; ++c) pe[c] += d[c];
      }
    }
  }

  void SoftmaxCrossEntropyForward(int64_t rows, int64_t V, int64_t ld, const float* logits,
                                  const int32_t* targets, float* stats, float* losses) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits + r * ld;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, l[v]);
      float sum = 0.0f;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
      stats[2 * r] = mx;
      stats[2 * r + 1] = 1.0f / sum;
      losses[r] = std::log(sum) + mx - l[targets[r]];
    }
  }

  void SoftmaxCrossEntropyBackward(int64_t rows, int64_t V, int64_t ld, const float* logits,
                                   const float* stats, const int32_t* targets, float scale,
                                   float* dlogits) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits + r * ld;
      float* d = dlogits + r * ld;
      const float mx = stats[2 * r], inv = stats[2 * r + 1];
      const int64_t target = targets[r];
      for (int64_t v = 0; v < V; ++v) {
        const float p = std::exp(l[v] - mx) * inv;
        d[v] = scale * (p - (v == target ? 1.0f : 0.0f));
      }
    }
  }

  double SquaredError(int64_t n, const float* pred, const float* target,
                      float* diff) override {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      diff[i] = pred[i] - target[i];
      s += static_cast<double>(diff[i]) * diff[i];
    }
    return s;
  }

  void SquaredErrorMeanInto(int64_t n, const float* pred, const float* target, float* diff,
                            float* out) override {
    out[0] = static_cast<float>(SquaredError(n, pred, target, diff) / static_cast<double>(n));
  }

  void SgdStep(int64_t n, float lr, float momentum, float weight_decay, bool first_step,
               float* w, const float* g, float* buf) override {
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + weight_decay * w[i];
      if (momentum != 0.0f) {
        buf[i] = first_step ? d : momentum * buf[i] + d;
        d = buf[i];
      }
      w[i] -= lr * d;
    }
  }

  void AdamWStep(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                 float bias_correction1, float bias_correction2, float* w, const float* g,
                 float* m, float* v) override {
    AdamWLoop(n, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, w, g, m,
              v);
  }

 private:
  std::atomic<AttentionKernel> attention_{DefaultAttentionKernel()};  // SetAttentionKernel's

  // Rotates by +angle (sign 1) or -angle (sign -1): the cos/sin of each position are
  // computed once and applied to every sequence and head.
  static void Rotate(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                     float theta, float sign, float* x) {
    const int64_t half = D / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half)), cs(static_cast<size_t>(half)),
        sn(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = rotary_math::InvFreq(i, D, theta);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        rotary_math::CosSin(t, inv_freq[i], &cs[i], &sn[i]);
        sn[i] *= sign;
      }
      for (int64_t b = 0; b < B; ++b) {
        float* row = x + (b * T + t) * row_stride;
        for (int64_t n = 0; n < heads; ++n) {
          float* lo = row + n * D;
          float* hi = lo + half;
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = lo[i], x2 = hi[i];
            lo[i] = x1 * cs[i] - x2 * sn[i];
            hi[i] = x2 * cs[i] + x1 * sn[i];
          }
        }
      }
    }
  }
};

}  // namespace

Backend* CpuBackend() {
  static Backend* const backend = new CpuBackendImpl();
  return backend;
}

namespace {
// SetBackendOverride's, by device (kCpu, kCuda).
std::atomic<Backend*> g_backend_override[2] = {nullptr, nullptr};
std::atomic<Backend*>& OverrideOf(Device device) {
  return g_backend_override[device == Device::kCuda ? 1 : 0];
}
}  // namespace

void SetBackendOverride(Device device, Backend* be) { OverrideOf(device).store(be); }

absl::StatusOr<Backend*> BackendFor(Device device) {
  if (Backend* be = OverrideOf(device).load(); be != nullptr) return be;
  switch (device) {
    case Device::kCpu:
      return CpuBackend();
    case Device::kCuda:
      if (Backend* be = CudaBackend(); be != nullptr) return be;
      return absl::UnavailableError(BuiltWithCuda()
                                        ? "no CUDA device found for the cuda backend"
                                        : "this build has no CUDA (built with BATON_WITH_CUDA=OFF "
                                          "or without nvcc)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no compute backend for device ", DeviceName(device)));
}

void SetBlasThreads(int threads) { GemmPool::Get().SetThreads(threads); }
int BlasThreads() { return GemmPool::Get().threads(); }

}  // namespace baton
