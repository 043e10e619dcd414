#include "common/core/device_peak.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/core/backend.h"
#include "common/core/bf16.h"

namespace baton {
namespace {

// Dense TFLOP/s from the datasheets. Matched in order against the upper-cased name: the
// first entry all of whose keys occur in it wins (so "H100 NVL" before "H100 PCIE" before
// the SXM "H100").
struct PeakEntry {
  const char* entry;
  std::vector<const char*> keys;
  double fp32, tf32, bf16;  // TFLOP/s
};

const std::vector<PeakEntry>& Table() {
  static const auto* table = new std::vector<PeakEntry>{
      {"H200", {"H200"}, 67, 494.7, 989.4},
      {"H100 NVL", {"H100", "NVL"}, 60, 417.5, 835},
      {"H100 PCIe", {"H100", "PCIE"}, 51, 378, 756},
      {"H100 SXM", {"H100"}, 67, 494.7, 989.4},
      {"A100", {"A100"}, 19.5, 156, 312},
      {"L40S", {"L40S"}, 91.6, 183, 362},
      {"L40", {"L40"}, 90.5, 90.5, 181},
      {"L4", {"L4"}, 30.3, 60, 121},
      {"A10G", {"A10G"}, 31.2, 62.5, 125},
      {"A10", {"A10"}, 31.2, 62.5, 125},
      {"V100", {"V100"}, 15.7, 0, 0},
      {"T4", {"T4"}, 8.1, 0, 0},
  };
  return *table;
}

const PeakEntry* Find(absl::string_view device_name) {
  const std::string name = absl::AsciiStrToUpper(device_name);
  for (const PeakEntry& e : Table()) {
    if (std::all_of(e.keys.begin(), e.keys.end(),
                    [&](const char* k) { return absl::StrContains(name, k); })) {
      return &e;
    }
  }
  return nullptr;
}

}  // namespace

double GpuPeakFlops(absl::string_view device_name, PeakPrecision precision) {
  const PeakEntry* e = Find(device_name);
  if (e == nullptr) return 0;
  const double tflops = precision == PeakPrecision::kFp32   ? e->fp32
                        : precision == PeakPrecision::kTf32 ? e->tf32
                                                            : e->bf16;
  return tflops * 1e12;
}

std::string GpuPeakEntry(absl::string_view device_name) {
  const PeakEntry* e = Find(device_name);
  return e == nullptr ? "" : e->entry;
}

namespace {

// The best rate of `repeats` runs of `gemm`, an n x n x n product.
template <typename Gemm>
double BestRate(int n, int repeats, const Gemm& gemm) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    gemm();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, 2.0 * n * static_cast<double>(n) * n / s);
  }
  return best;
}

}  // namespace

double MeasureCpuPeakFlopsBf16(int n, int repeats) {
  const int64_t size = static_cast<int64_t>(n) * n;
  std::vector<uint16_t> a(size, FloatToBf16Bits(1.0f / static_cast<float>(n)));
  std::vector<uint16_t> b(size, FloatToBf16Bits(0.5f));
  std::vector<float> c(size, 0.0f);
  Backend* be = CpuBackend();
  return BestRate(n, repeats, [&] {
    be->GemmBf16(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
}

double MeasureCpuPeakFlops(int n, int repeats) {
  const int64_t size = static_cast<int64_t>(n) * n;
  std::vector<float> a(size, 1.0f / static_cast<float>(n)), b(size, 0.5f), c(size, 0.0f);
  Backend* be = CpuBackend();
  return BestRate(n, repeats, [&] {
    be->Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
}

}  // namespace baton
