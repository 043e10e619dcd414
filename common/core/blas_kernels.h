// Which matrix kernels the process runs, and choosing better ones than OpenBLAS picks.
//
// Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernel set once, when the library
// loads: OPENBLAS_CORETYPE when set, else its CPUID table. A CPU newer than the table (an
// Intel Xeon of family 6 model 207, say) gets the generic "Prescott" (SSE3) kernels, about
// an eighth of what the AVX-512 ones do on the same core (docs/benchmarks.md, "CPU matrix
// kernels"). ChooseBlasKernels, called first thing in main(), sees that fallback and
// re-executes the process with OPENBLAS_CORETYPE naming the set the CPU supports
// ("Cooperlake" with AVX512-BF16, "SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA).
// The re-executed process checks the chosen set with a numerical self-test (sgemm against
// a plain float64 product on the shapes below) before anything else runs; a failure
// re-executes once more on the generic set, saying why. An OPENBLAS_CORETYPE the operator
// set is always kept as it is (older OpenBLAS builds are pinned that way on purpose).
//
// Weights digests depend on the kernel set (docs/precision.md): every process of a job,
// and the reference trainer it is compared with, must run the same one. Each binary that
// computes calls ChooseBlasKernels, so on one machine they all do.
//
// Thread safety: ChooseBlasKernels runs before any thread starts; CurrentBlasKernels may be
// read from any thread after it.
#ifndef BATON_COMMON_CORE_BLAS_KERNELS_H_
#define BATON_COMMON_CORE_BLAS_KERNELS_H_

#include <functional>
#include <string>

namespace baton {

struct BlasKernels {
  std::string library;  // "OpenBLAS 0.3.21"
  std::string core;     // the kernel set in use, as OpenBLAS names it: "SkylakeX"
  // Who chose it: "the operator (OPENBLAS_CORETYPE)", "baton (the library chose Prescott on
  // a CPU with AVX-512)", "the library", or the fallback and its reason.
  std::string chosen_by;
  // One line for logs and reports, with the bf16 products' kernels (bf16_gemm.h), which a
  // bf16 job's digest depends on: "OpenBLAS 0.3.21, SkylakeX kernels (chosen by ...); bf16
  // products oneDNN 2.6.3 on AMX-BF16 (chosen by ...)".
  std::string Describe() const;
};

// Decides the kernel set, re-executing the process (execv of /proc/self/exe with argv)
// when it chooses another one or when the chosen one fails its self-test; returns in the
// process that keeps its kernels. BATON_BLAS_SELFTEST_INJECT=1 makes the self-test see a
// wrong product (how the fallback is tested). Never fails: a re-exec that cannot happen
// keeps the library's set and says so in chosen_by.
void ChooseBlasKernels(char** argv);

// What ChooseBlasKernels decided (the library's own choice when it was not called).
const BlasKernels& CurrentBlasKernels();

// The self-test alone: OK when cblas_sgemm agrees with a float64 product, within a bound
// from the shapes, on a few shapes like a job's (square, tall, wide, odd sizes, each
// transpose). Otherwise the first disagreement, for the log.
std::string SelfTestSgemm();

// The same test of any product: `product` writes c [m,n] = op(a) op(b), row-major, a [m,k]
// (stored [k,m] when ta) and b [k,n] (stored [n,k] when tb). With bf16_inputs every operand
// is a bf16 value (bf16.h). `inject` corrupts one result, to test a caller's fallback.
// Returns "" when every element agrees, else "NAME MxNxK...: element (i, j) is ...".
using TestProduct = std::function<void(bool ta, bool tb, int m, int n, int k, const float* a,
                                       int lda, const float* b, int ldb, float* c)>;
std::string SelfTestProduct(const std::string& name, const TestProduct& product, bool bf16_inputs,
                            bool inject);

}  // namespace baton

#endif  // BATON_COMMON_CORE_BLAS_KERNELS_H_
