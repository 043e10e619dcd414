#include "common/core/bf16_gemm.h"

#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/core/bf16.h"
#include "common/core/blas_kernels.h"
#include "common/core/mutex.h"
#include "oneapi/dnnl/dnnl.hpp"

// OpenMP's runtime, which Debian's oneDNN runs on (libgomp), linked directly: these two are
// all baton uses of it, and omp.h is GCC's alone (clang brings its own runtime's).
extern "C" int omp_get_max_threads(void);
extern "C" void omp_set_num_threads(int threads);

namespace baton {
namespace {

// A product's shape, strides and scalars: one oneDNN primitive each.
using Key =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

struct Cached {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratchpad;
};

// The engine and the primitives made so far. Primitives are made under the mutex and run
// outside it: a oneDNN primitive may execute on many threads at once, each with its own
// stream and scratchpad (the attributes ask for a user scratchpad, so none is shared).
class Onednn {
 public:
  static Onednn& Get() {
    static Onednn* const o = new Onednn();  // never destroyed: used until exit
    return *o;
  }

  const dnnl::engine& engine() const { return engine_; }

  const Cached& Find(const Key& key) {
    MutexLock lock(mu_);
    std::unique_ptr<Cached>& slot = cache_[key];
    if (slot == nullptr) slot = Make(key);
    return *slot;
  }

 private:
  Onednn() : engine_(dnnl::engine::kind::cpu, 0) {}

  std::unique_ptr<Cached> Make(const Key& key) const {
    const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta] = key;
    using dt = dnnl::memory::data_type;
    auto out = std::make_unique<Cached>();
    // op(A) is m x k: rows lda apart, or (transposed) columns lda apart. Likewise op(B).
    out->a = dnnl::memory::desc({m, k}, dt::bf16,
                                ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
    out->b = dnnl::memory::desc({k, n}, dt::bf16,
                                tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
    out->c = dnnl::memory::desc({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(out->a, out->b, out->c), attr,
                                          engine_);
    out->scratchpad = pd.scratchpad_desc();
    out->primitive = dnnl::matmul(pd);
    return out;
  }

  dnnl::engine engine_;
  Mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Cached>, absl::Hash<Key>> cache_ ABSL_GUARDED_BY(mu_);
};

// oneDNN's instruction set, as its docs name it, and whether it multiplies bf16 itself.
std::string IsaName(dnnl::cpu_isa isa, bool* bf16_in_hardware) {
  const auto has = [&](dnnl::cpu_isa want) {
    return (static_cast<unsigned>(isa) & static_cast<unsigned>(want)) ==
           static_cast<unsigned>(want);
  };
  *bf16_in_hardware = true;
  if (has(dnnl::cpu_isa::avx512_core_amx)) return "AMX-BF16";
  if (has(dnnl::cpu_isa::avx512_core_bf16)) return "AVX512-BF16";
  *bf16_in_hardware = false;
  if (has(dnnl::cpu_isa::avx512_core)) return "avx512_core";
  if (has(dnnl::cpu_isa::avx2)) return "avx2";
  return "sse41 or older";
}

bool EnvIs(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e != nullptr && std::string(e) == value;
}

Bf16Kernels Decide() {
  Bf16Kernels widen;
  widen.name = "widened to float32 (sgemm)";
  if (EnvIs("BATON_BF16_GEMM", "widen")) {
    widen.chosen_by = "the operator (BATON_BF16_GEMM=widen)";
    return widen;
  }
  bool hardware = false;
  const std::string isa = IsaName(dnnl::get_effective_cpu_isa(), &hardware);
  if (!hardware) {
    widen.chosen_by =
        absl::StrCat("baton: the CPU has no bf16 multiply (oneDNN's instruction set: ", isa, ")");
    return widen;
  }
  const dnnl_version_t* v = dnnl_version();
  Bf16Kernels onednn;
  onednn.onednn = true;
  onednn.name = absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " on ", isa);
  // Proven before use, on the calls a job makes.
  std::string failed;
  try {
    failed = SelfTestProduct(
        "oneDNN bf16 matmul",
        [](bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
           float* c) {
          const int64_t a_size = static_cast<int64_t>(ta ? k : m) * lda;
          const int64_t b_size = static_cast<int64_t>(tb ? n : k) * ldb;
          std::vector<uint16_t> a16(a_size), b16(b_size);
          for (int64_t i = 0; i < a_size; ++i) a16[i] = FloatToBf16Bits(a[i]);
          for (int64_t i = 0; i < b_size; ++i) b16[i] = FloatToBf16Bits(b[i]);
          OnednnGemmBf16(ta, tb, m, n, k, 1.0f, a16.data(), lda, b16.data(), ldb, 0.0f, c, n);
        },
        /*bf16_inputs=*/true, EnvIs("BATON_BF16_SELFTEST_INJECT", "1"));
  } catch (const std::exception& e) {
    failed = absl::StrCat("oneDNN: ", e.what());
  }
  if (!failed.empty()) {
    widen.chosen_by = absl::StrCat("baton: ", onednn.name, " failed its self-test: ", failed);
    return widen;
  }
  onednn.chosen_by = absl::StrCat("baton: the CPU has ", isa, ", and the self-test passed");
  return onednn;
}

}  // namespace

const Bf16Kernels& CpuBf16Kernels() {
  static const Bf16Kernels* const kernels = new Bf16Kernels(Decide());
  return *kernels;
}

void OnednnGemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                    float* c, int64_t ldc) {
  // One thread: oneDNN (built on OpenMP) would otherwise share this product among the
  // machine's cores, on top of baton's own GEMM threads, and some of its kernels split the
  // k sum among threads, which would make the bits depend on their number. The setting is
  // the calling thread's own (OpenMP's nthreads-var).
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  Onednn& o = Onednn::Get();
  const Cached& p = o.Find(Key{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta});
  thread_local dnnl::stream stream(o.engine());
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < p.scratchpad.get_size()) scratch.resize(p.scratchpad.get_size());
  const dnnl::memory ma(p.a, o.engine(), const_cast<uint16_t*>(a));
  const dnnl::memory mb(p.b, o.engine(), const_cast<uint16_t*>(b));
  const dnnl::memory mc(p.c, o.engine(), c);
  const dnnl::memory ms(p.scratchpad, o.engine(), scratch.data());
  p.primitive.execute(
      stream,
      {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}});
  stream.wait();
}

}  // namespace baton
