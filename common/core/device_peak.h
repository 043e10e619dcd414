// The peak arithmetic rate of a device, the denominator of model FLOPs utilisation (MFU).
//
// A GPU's peak comes from its vendor's datasheet (dense, no sparsity), keyed by the name
// CUDA reports and the precision the job computes in. A CPU has no such table: its peak is
// measured, once, by a short single-precision GEMM through the CPU backend (the kernel the
// jobs use, with its threads), and stated wherever it is used as "measured".
#ifndef BATON_COMMON_CORE_DEVICE_PEAK_H_
#define BATON_COMMON_CORE_DEVICE_PEAK_H_

#include <string>

#include "absl/strings/string_view.h"

namespace baton {

enum class PeakPrecision {
  kFp32,  // IEEE fp32 on the CUDA cores (TF32 off: what baton computes today)
  kTf32,  // fp32 GEMMs on the tensor cores
  kBf16,  // bf16 inputs, fp32 accumulation, on the tensor cores
};

// FLOP/s of the GPU named `device_name` ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB")
// at `precision`, from the table in device_peak.cc; 0 when the table does not know the
// device (MFU is then reported as unknown, never guessed).
double GpuPeakFlops(absl::string_view device_name, PeakPrecision precision);

// The table entry `device_name` matched ("H100 SXM"), or "" when none did.
std::string GpuPeakEntry(absl::string_view device_name);

// FLOP/s of this host's CPU through the CPU backend's GEMM: the best of a few square
// single-precision GEMMs of `n` (a few milliseconds at the default). Deterministic in what
// it runs, not in what it measures.
double MeasureCpuPeakFlops(int n = 384, int repeats = 5);
// The same through the CPU backend's GemmBf16: the peak of bf16 jobs, whose Linears run it.
double MeasureCpuPeakFlopsBf16(int n = 384, int repeats = 5);

}  // namespace baton

#endif  // BATON_COMMON_CORE_DEVICE_PEAK_H_
