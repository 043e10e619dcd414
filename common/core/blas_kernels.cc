#include "common/core/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/bf16.h"
#include "common/core/bf16_gemm.h"

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace baton {
namespace {

constexpr char kCoreType[] = "OPENBLAS_CORETYPE";
// Set in the environment of a process baton re-executed: what it chose, or why it fell
// back ("fallback:REASON"). Its presence stops a second choice.
constexpr char kChoiceMarker[] = "BATON_BLAS_CHOICE";

BlasKernels& Current() {
  static BlasKernels* k = new BlasKernels;
  return *k;
}

std::string Library() {
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64": name and version.
  const std::string config = openblas_get_config();
  const size_t first = config.find(' ');
  const size_t second = first == std::string::npos ? first : config.find(' ', first + 1);
  return config.substr(0, second);
}

// The generic sets OpenBLAS falls back to when it does not know the CPU.
bool Generic(const std::string& core) {
  return core == "Prescott" || core == "Core2" || core == "Nehalem" || core == "Atom" ||
         core == "Katmai" || core == "Coppermine" || core == "Northwood" || core == "Banias";
}

// The best set this CPU runs, by its instruction sets; empty when none beats the generic.
std::string BestCoreForThisCpu(std::string* why) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) {
    *why = "AVX-512 with BF16";
    return "Cooperlake";
  }
  if (avx512) {
    *why = "AVX-512";
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *why = "AVX2 and FMA";
    return "Haswell";
  }
  return "";
}

// Replaces this process with itself under `core` (empty: the library's own choice) and the
// marker; returns only when execv fails.
void Reexec(char** argv, const std::string& core, const std::string& marker) {
  if (core.empty()) {
    unsetenv(kCoreType);
  } else {
    setenv(kCoreType, core.c_str(), 1);
  }
  setenv(kChoiceMarker, marker.c_str(), 1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
}

}  // namespace

std::string BlasKernels::Describe() const {
  const Bf16Kernels& bf16 = CpuBf16Kernels();
  return absl::StrCat(library, ", ", core, " kernels (chosen by ", chosen_by, "); bf16 products ",
                      bf16.name, " (chosen by ", bf16.chosen_by, ")");
}

std::string SelfTestProduct(const std::string& name, const TestProduct& product, bool bf16_inputs,
                            bool inject) {
  struct Shape {
    int m, n, k;
    bool ta, tb;
  };
  const Shape shapes[] = {{64, 64, 64, false, false}, {192, 48, 130, false, true},
                          {33, 257, 65, true, false}, {128, 384, 96, false, true},
                          {7, 5, 300, true, true},    {512, 16, 128, false, false}};
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    const float x = static_cast<float>((state >> 8) & 0xffff) / 32768.0f - 1.0f;  // [-1, 1)
    return bf16_inputs ? RoundToBf16(x) : x;
  };
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.m) * s.k), b(static_cast<size_t>(s.k) * s.n),
        c(static_cast<size_t>(s.m) * s.n, 0.0f);
    for (float& x : a) x = next();
    for (float& x : b) x = next();
    // Row-major A [m,k] (or its transpose stored [k,m]), B [k,n] (or [n,k]).
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    product(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data());
    if (inject) c[c.size() / 2] += 0.5f;
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        double want = 0, scale = 0;
        for (int p = 0; p < s.k; ++p) {
          const double x =
              s.ta ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
          const double y =
              s.tb ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
          want += x * y;
          scale += std::fabs(x * y);
        }
        // float32 accumulation in any order is within k * eps * sum|x*y| of the exact sum
        // (the products of bf16 values are exact in float32).
        const double bound = 2.0 * s.k * 1.2e-7 * scale + 1e-30;
        const double got = c[static_cast<size_t>(i) * s.n + j];
        if (!(std::fabs(got - want) <= bound)) {
          return absl::StrFormat(
              "%s %dx%dx%d%s%s: element (%d, %d) is %.9g, a float64 product gives %.9g", name, s.m,
              s.n, s.k, s.ta ? " (A transposed)" : "", s.tb ? " (B transposed)" : "", i, j, got,
              want);
        }
      }
    }
  }
  return "";
}

std::string SelfTestSgemm() {
  const char* inject = std::getenv("BATON_BLAS_SELFTEST_INJECT");
  return SelfTestProduct(
      "sgemm",
      [](bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
         float* c) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
      },
      /*bf16_inputs=*/false, inject != nullptr && std::string(inject) == "1");
}

void ChooseBlasKernels(char** argv) {
  BlasKernels& k = Current();
  k.library = Library();
  k.core = openblas_get_corename();
  const char* marker_env = std::getenv(kChoiceMarker);
  const std::string marker = marker_env == nullptr ? "" : marker_env;
  if (absl::StartsWith(marker, "fallback:")) {
    k.chosen_by =
        absl::StrCat("the library, after baton's choice failed its self-test: ", marker.substr(9));
    return;
  }
  if (!marker.empty()) {
    // Re-executed under baton's choice: prove it before anything uses it.
    const std::string failed = SelfTestSgemm();
    if (!failed.empty()) {
      Reexec(argv, "", absl::StrCat("fallback:", k.core, " ", failed));
      k.chosen_by =
          absl::StrCat("baton, though its self-test failed and re-executing did not: ", failed);
      return;
    }
    k.chosen_by = absl::StrCat("baton: ", marker);
    return;
  }
  if (std::getenv(kCoreType) != nullptr) {
    k.chosen_by = "the operator (OPENBLAS_CORETYPE)";
    return;
  }
  std::string why;
  const std::string best = BestCoreForThisCpu(&why);
  if (!Generic(k.core) || best.empty()) {
    k.chosen_by = "the library";
    return;
  }
  Reexec(argv, best, absl::StrCat("the library chose ", k.core, " on a CPU with ", why));
  k.chosen_by =
      absl::StrCat("the library (re-executing with ", best, " failed: ", std::strerror(errno), ")");
}

const BlasKernels& CurrentBlasKernels() {
  if (!Current().core.empty()) return Current();  // ChooseBlasKernels decided
  // A process that never chose (a test, a benchmark): the library's set, read once.
  static const BlasKernels* const library = [] {
    auto* k = new BlasKernels;
    k->library = Library();
    k->core = openblas_get_corename();
    k->chosen_by = "the library";
    return k;
  }();
  return *library;
}

}  // namespace baton
