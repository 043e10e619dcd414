// bf16 matrix products on the CPU: oneDNN's matmul where the CPU multiplies bf16 itself
// (AMX-BF16 tiles, or AVX512-BF16's dot products), float32 accumulation and output.
//
// The CPU backend's GemmBf16 (cpu_backend.cc) runs every row block of its product here when
// CpuBf16Kernels().onednn, and otherwise widens both operands to float32 and runs sgemm
// (the portable path: the same bits as a float32 product of the widened values). Which one
// runs is decided once per process:
//   - BATON_BF16_GEMM=widen (the operator's choice) always widens;
//   - otherwise oneDNN runs when the instruction set it would use (its effective ISA, which
//     ONEDNN_MAX_CPU_ISA caps) multiplies bf16 in hardware, and only after a numerical
//     self-test on job-like shapes passed (BATON_BF16_SELFTEST_INJECT=1 makes it fail, to
//     test the fallback); a failure widens, saying why.
//
// Bits: a oneDNN product differs from the widened one in the last bits of its float32 sums
// (another summation order), and from one instruction set to another, so a bf16 job's
// weights digest depends on these kernels (docs/precision.md). It does not depend on the
// number of threads: every call is single-threaded, on a fixed row block.
//
// Thread safety: CpuBf16Kernels decides on first use (any thread; a function-local static);
// OnednnGemmBf16 may run on many threads at once.
#ifndef BATON_COMMON_CORE_BF16_GEMM_H_
#define BATON_COMMON_CORE_BF16_GEMM_H_

#include <cstdint>
#include <string>

namespace baton {

struct Bf16Kernels {
  bool onednn = false;
  // "oneDNN 2.6.3 on AMX-BF16" or "widened to float32 (sgemm)".
  std::string name;
  // Who chose it and why: "baton: the CPU has AMX-BF16, and the self-test passed", "the
  // operator (BATON_BF16_GEMM=widen)", "baton: the CPU has no bf16 multiply (oneDNN's
  // instruction set: avx2)", or the failed self-test.
  std::string chosen_by;
};

// The decision, made on first use.
const Bf16Kernels& CpuBf16Kernels();

// C = alpha * op(A) op(B) + beta * C, row-major, A and B bf16 bits, one thread, with oneDNN.
// Only when CpuBf16Kernels().onednn; m, n, k > 0.
void OnednnGemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                    float* c, int64_t ldc);

}  // namespace baton

#endif  // BATON_COMMON_CORE_BF16_GEMM_H_
