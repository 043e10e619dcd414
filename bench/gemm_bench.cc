// The CPU backend's products, float32 (Gemm) against bf16 (GemmBf16), on the shapes a GPT
// job's Linears give, one thread, on the kernels the process chose (the worker's):
//
//   build/bin/gemm_bench [--seconds 0.3]                   # bf16 on the chosen kernels
//   BATON_BF16_GEMM=widen build/bin/gemm_bench             # bf16 widened to float32
//
// Prints the CPU, the kernels, the machine's load, and GFLOP/s per shape (the best of runs
// filling --seconds each). docs/benchmarks.md, "CPU matrix kernels".
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/core/backend.h"
#include "common/core/bf16.h"
#include "common/core/blas_kernels.h"
#include "common/core/host_info.h"

namespace {

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// The best GFLOP/s of `run` (an m x n x k product) over runs filling `seconds`.
template <typename Run>
double BestGflops(int64_t m, int64_t n, int64_t k, double seconds, const Run& run) {
  run();  // warm-up: first-call set-up (oneDNN's kernel generation) is not the rate
  double best = 0, spent = 0;
  while (spent < seconds) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    spent += s;
    if (s > 0) best = std::max(best, 2.0 * m * n * k / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  baton::ChooseBlasKernels(argv);  // the kernels a worker runs (may re-execute)
  double seconds = 0.3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) {
      seconds = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "gemm_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  baton::SetBlasThreads(1);
  baton::Backend* be = baton::CpuBackend();
  const std::string load0 = LoadAverage();
  std::printf("gemm_bench: %s, one thread, load average %s (start)\n",
              baton::CpuModelName().c_str(), load0.c_str());
  std::printf("matrix kernels: %s\n\n", baton::CurrentBlasKernels().Describe().c_str());
  struct Shape {
    const char* what;
    int64_t m, n, k;
    bool ta, tb;
  };
  // gpt.json with 4 micro-batches: 8 sequences x 64 tokens = 512 rows, d_model 128.
  const Shape shapes[] = {
      {"384^3", 384, 384, 384, false, false},
      {"qkv forward 512x384x128", 512, 384, 128, false, true},
      {"mlp.fc forward 512x512x128", 512, 512, 128, false, true},
      {"mlp.proj forward 512x128x512", 512, 128, 512, false, true},
      {"mlp.fc dX 512x128x512", 512, 128, 512, false, false},
      {"mlp.fc dW 512x128x512 (A^T)", 512, 128, 512, true, false},
      {"gpt2-small qkv 1024x2304x768", 1024, 2304, 768, false, true},
  };
  std::printf("| product | fp32 Gemm GFLOP/s | bf16 GemmBf16 GFLOP/s | bf16 / fp32 |\n");
  std::printf("|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const int64_t a_size = s.m * s.k, b_size = s.k * s.n;
    std::vector<float> a(a_size), b(b_size), c(s.m * s.n, 0.0f);
    for (int64_t i = 0; i < a_size; ++i) a[i] = static_cast<float>((i * 37 % 101) - 50) / 64.0f;
    for (int64_t i = 0; i < b_size; ++i) b[i] = static_cast<float>((i * 53 % 97) - 48) / 64.0f;
    std::vector<uint16_t> a16(a_size), b16(b_size);
    be->ToBf16(a_size, a.data(), a16.data());
    be->ToBf16(b_size, b.data(), b16.data());
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const double fp32 = BestGflops(s.m, s.n, s.k, seconds, [&] {
      be->Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
    });
    const double bf16 = BestGflops(s.m, s.n, s.k, seconds, [&] {
      be->GemmBf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(), ldb, 0.0f,
                   c.data(), s.n);
    });
    std::printf("| %s | %.1f | %.1f | %.2f |\n", s.what, fp32, bf16, bf16 / fp32);
  }
  std::printf("\nload average %s (end)\n", LoadAverage().c_str());
  return 0;
}
