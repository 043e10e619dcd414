// Tiled causal attention on bf16 matrix units (flash-style), the block-level algorithm both
// backends run: the CUDA backend as one thread block per tile on tensor cores (WMMA,
// bf16 x bf16 products accumulated in float32), the CPU backend as the same blocks in turn,
// one thread each, with the tile products as loops.
//
// The contract, for bf16 jobs (q, k, v and the output gradient hold bf16 values; anything
// else is rounded to bf16 as it is loaded):
//   forward, per (b, h, query tile of kTile rows), key tiles ascending up to the diagonal:
//     S = q k^T (float32 accumulation); the running row max m and sum l (of the float32
//     exp(scale S - m)), as flash_attention_math.h's rows; P = exp(scale S - m) rounded to
//     bf16; O = O * exp(m_old - m) + P v. Then y = O / l and lse = m + log l.
//   backward, delta_i = sum_d bf16(dy_i)[d] y_i[d] per row (DeltaRow), then two passes with
//   no sum into memory another block writes (no atomics):
//     dq: per (b, h, query tile), key tiles ascending: P = exp(scale q k^T - lse) and
//         dS = P (dy v^T - delta), rounded to bf16; dq += dS k; dq *= scale.
//     dk, dv: per (b, kv head g, key tile), the group's query heads ascending, then query
//         tiles ascending from the diagonal: P^T and dS^T as above, rounded to bf16;
//         dv += P^T dy; dk += dS^T q; dk *= scale.
// P and dS are rounded to bf16 because they are the matrix units' operands (as FlashAttention
// does in bf16); that rounding is what sets this kernel apart from the float32 row kernels
// (flash_attention_math.h): the two agree to about 1% of the output's scale, not to float
// rounding. Every sum has a fixed order, so a device gives the same bits on every run; the
// order inside a tensor-core product is the hardware's, so a GPU and the CPU differ in the
// last bits of each product.
//
// Layout as Backend::AttentionForward: qkv [B, T, (H + 2 KVH) D], y and dy [B, T, H*D], lse
// and delta [B, H, T]. Head size D a multiple of 16, at most kMaxD (Supports).
//
// Shared memory: each block carves its tiles out of one buffer (ForwardSmemBytes, ...: at
// D = 64, 71, 97 and 123 KiB for the forward, dq and dk/dv blocks; at D = 128, 111, 145 and
// 187 KiB, within the 227 KiB a block may take on sm_90), every array aligned to 128 bytes
// (WMMA's loads and stores need 32). One block per SM at the larger sizes: four warps, so
// these kernels trade latency hiding for simplicity; their rate is for a GPU run to measure.
#ifndef BATON_COMMON_CORE_FLASH_TILES_H_
#define BATON_COMMON_CORE_FLASH_TILES_H_

#include <cstdint>
#include <type_traits>

#include "common/core/bf16.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <mma.h>
#define BATON_FT_FN __host__ __device__ inline
#else
#include <cmath>
#define BATON_FT_FN inline
#endif

namespace baton {
namespace flash_tiles {

inline constexpr int kTile = 64;  // query rows, and key rows, of a tile
inline constexpr int kFrag = 16;  // the matrix units' fragment: 16 x 16 x 16
inline constexpr int kWarps = 4;  // warps of a CUDA block; warp w owns rows 16w .. 16w+15
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kMaxD = 128;
// Row padding (elements) of the shared tiles, against bank conflicts; keeps every fragment's
// first element 32-byte aligned.
inline constexpr int kPadH = 8;  // bf16 tiles
inline constexpr int kPadF = 4;  // float tiles

BATON_FT_FN bool Supports(int64_t D) { return D > 0 && D <= kMaxD && D % kFrag == 0; }

// The calling thread's place in its block: tid of threads, in warp `warp` of `warps`. The
// CPU runs a block as one thread in one warp.
struct Threads {
  int tid, threads, warp, warps;
};

BATON_FT_FN void Sync() {
#if defined(__CUDA_ARCH__)
  __syncthreads();
#endif
}

BATON_FT_FN float Exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

BATON_FT_FN float Log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

// One warp's product C[16 x n] = (accumulate ? C : 0) + A[16 x k] B[k x n], float32
// accumulation of bf16 operands (bits), n and k multiples of 16. A is row-major (lda); B is
// row-major (ldb) or, with kBColumns, B(kk, nn) = B[nn * ldb + kk] (a row-major matrix read
// transposed). C row-major (ldc). On the CPU: k ascending per element.
template <bool kBColumns>
BATON_FT_FN void WarpGemm(const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc,
                          int n, int k, bool accumulate) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  using BLayout = typename std::conditional<kBColumns, wmma::col_major, wmma::row_major>::type;
  const __nv_bfloat16* a = reinterpret_cast<const __nv_bfloat16*>(A);
  const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(B);
  for (int n0 = 0; n0 < n; n0 += kFrag) {
    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> c;
    if (accumulate) {
      wmma::load_matrix_sync(c, C + n0, ldc, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(c, 0.0f);
    }
    for (int k0 = 0; k0 < k; k0 += kFrag) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, BLayout> fb;
      wmma::load_matrix_sync(fa, a + k0, lda);
      wmma::load_matrix_sync(fb, kBColumns ? b + n0 * ldb + k0 : b + k0 * ldb + n0, ldb);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(C + n0, c, ldc, wmma::mem_row_major);
  }
#else
  __trap();  // the launchers refuse devices before sm_80 (no bf16 matrix units)
#endif
#else
  for (int r = 0; r < kFrag; ++r) {
    for (int c = 0; c < n; ++c) {
      float s = accumulate ? C[r * ldc + c] : 0.0f;
      for (int kk = 0; kk < k; ++kk) {
        const float b = Bf16BitsToFloat(kBColumns ? B[c * ldb + kk] : B[kk * ldb + c]);
        s += Bf16BitsToFloat(A[r * lda + kk]) * b;
      }
      C[r * ldc + c] = s;
    }
  }
#endif
}

// Shared-memory arrays of a block, carved in order from one buffer (`base` null: only counts
// the bytes).
class Carver {
 public:
  BATON_FT_FN explicit Carver(unsigned char* base) : base_(base) {}
  template <typename T>
  BATON_FT_FN T* Take(int64_t n) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (n * static_cast<int64_t>(sizeof(T)) + 127) / 128 * 128;
    return p;
  }
  BATON_FT_FN int64_t used() const { return used_; }

 private:
  unsigned char* base_;
  int64_t used_ = 0;
};

// The leading dimensions of the tiles for head size D.
struct Lds {
  int h, o, f, p;  // bf16 [kTile x D], float [kTile x D], float and bf16 [kTile x kTile]
};
BATON_FT_FN Lds LdsFor(int D) { return {D + kPadH, D + kPadF, kTile + kPadF, kTile + kPadH}; }

// Rows r0 .. r0 + kTile - 1 of a [T, stride] float matrix (src: its row 0 at the head's
// first column), D columns, into dst [kTile x ld] as bf16 bits; rows at or past T are zero.
BATON_FT_FN void LoadTile(const Threads& t, const float* src, int64_t stride, int64_t r0, int64_t T,
                          int D, uint16_t* dst, int ld) {
  for (int e = t.tid; e < kTile * D; e += t.threads) {
    const int r = e / D, d = e % D;
    dst[r * ld + d] = r0 + r < T ? FloatToBf16Bits(src[(r0 + r) * stride + d]) : uint16_t{0};
  }
}

BATON_FT_FN void Fill(const Threads& t, float* dst, int ld, int cols, float value) {
  for (int e = t.tid; e < kTile * cols; e += t.threads) dst[(e / cols) * ld + e % cols] = value;
}

// Per-row values [kTile] of one (b, h): row i = r0 + r of `src` ([T] floats), 0 past T.
BATON_FT_FN void LoadRows(const Threads& t, const float* src, int64_t r0, int64_t T, float* dst) {
  for (int r = t.tid; r < kTile; r += t.threads) dst[r] = r0 + r < T ? src[r0 + r] : 0.0f;
}

// ------------------------------------------------------------------------------ forward

struct ForwardSmem {
  uint16_t *q, *k, *v, *p;
  float *s, *o, *m, *l, *c;
};
BATON_FT_FN ForwardSmem CarveForward(unsigned char* base, int D, int64_t* bytes) {
  const Lds ld = LdsFor(D);
  Carver c(base);
  ForwardSmem s;
  s.q = c.Take<uint16_t>(kTile * ld.h);
  s.k = c.Take<uint16_t>(kTile * ld.h);
  s.v = c.Take<uint16_t>(kTile * ld.h);
  s.p = c.Take<uint16_t>(kTile * ld.p);
  s.s = c.Take<float>(kTile * ld.f);
  s.o = c.Take<float>(kTile * ld.o);
  s.m = c.Take<float>(kTile);
  s.l = c.Take<float>(kTile);
  s.c = c.Take<float>(kTile);
  if (bytes != nullptr) *bytes = c.used();
  return s;
}
BATON_FT_FN int64_t ForwardSmemBytes(int D) {
  int64_t bytes = 0;
  CarveForward(nullptr, D, &bytes);
  return bytes;
}

// Query tile qt of head h of batch element b: y's rows and lse's entries of that tile.
BATON_FT_FN void ForwardBlock(const Threads& t, unsigned char* smem, int64_t T, int64_t H,
                              int64_t KVH, int D, float scale, int64_t b, int64_t h, int64_t qt,
                              const float* qkv, float* y, float* lse) {
  const int64_t C = H * D, W = (H + 2 * KVH) * D, g = h / (H / KVH);
  const float* base = qkv + b * T * W;
  const Lds ld = LdsFor(D);
  const ForwardSmem s = CarveForward(smem, D, nullptr);
  const int64_t q0 = qt * kTile;
  LoadTile(t, base + h * D, W, q0, T, D, s.q, ld.h);
  Fill(t, s.o, ld.o, D, 0.0f);
  for (int r = t.tid; r < kTile; r += t.threads) {
    s.m[r] = -INFINITY;
    s.l[r] = 0.0f;
  }
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    Sync();  // the previous tile's products have read k and v
    LoadTile(t, base + C + g * D, W, k0, T, D, s.k, ld.h);
    LoadTile(t, base + C + KVH * D + g * D, W, k0, T, D, s.v, ld.h);
    Sync();
    for (int w = t.warp; w < kTile / kFrag; w += t.warps) {
      WarpGemm<true>(s.q + w * kFrag * ld.h, ld.h, s.k, ld.h, s.s + w * kFrag * ld.f, ld.f, kTile,
                     D, false);
    }
    Sync();
    for (int r = t.tid; r < kTile; r += t.threads) {
      const int64_t i = q0 + r;
      const float* srow = s.s + r * ld.f;
      uint16_t* prow = s.p + r * ld.p;
      if (i >= T) {  // a row past the sequence: nothing, its output stays 0
        for (int j = 0; j < kTile; ++j) prow[j] = 0;
        s.c[r] = 1.0f;
        continue;
      }
      // Keys k0 .. i are visible (k0 <= q0 <= i: at least one).
      const int n = i - k0 >= kTile - 1 ? kTile : static_cast<int>(i - k0) + 1;
      float m = s.m[r];
      for (int j = 0; j < n; ++j) {
        const float x = srow[j] * scale;
        if (x > m) m = x;
      }
      const float c = Exp(s.m[r] - m);  // 0 on the first tile (m was -inf)
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float p = Exp(srow[j] * scale - m);
        sum += p;
        prow[j] = FloatToBf16Bits(p);
      }
      for (int j = n; j < kTile; ++j) prow[j] = 0;
      s.l[r] = s.l[r] * c + sum;
      s.m[r] = m;
      s.c[r] = c;
    }
    Sync();
    for (int e = t.tid; e < kTile * D; e += t.threads) s.o[(e / D) * ld.o + e % D] *= s.c[e / D];
    Sync();
    for (int w = t.warp; w < kTile / kFrag; w += t.warps) {
      WarpGemm<false>(s.p + w * kFrag * ld.p, ld.p, s.v, ld.h, s.o + w * kFrag * ld.o, ld.o, D,
                      kTile, true);
    }
  }
  Sync();
  for (int e = t.tid; e < kTile * D; e += t.threads) {
    const int r = e / D, d = e % D;
    if (q0 + r < T) y[(b * T + q0 + r) * C + h * D + d] = s.o[r * ld.o + d] * (1.0f / s.l[r]);
  }
  for (int r = t.tid; r < kTile; r += t.threads) {
    if (q0 + r < T) lse[(b * H + h) * T + q0 + r] = s.m[r] + Log(s.l[r]);
  }
}

// ------------------------------------------------------------------------------ backward

// delta of row i of one (b, h): sum_d bf16(dy[d]) * y[d], d ascending.
BATON_FT_FN float DeltaRow(const float* dy, const float* y, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s += RoundToBf16(dy[d]) * y[d];
  return s;
}

struct QueryGradSmem {
  uint16_t *q, *dy, *k, *v, *ds;
  float *s, *dp, *acc, *lse, *delta;
};
BATON_FT_FN QueryGradSmem CarveQueryGrad(unsigned char* base, int D, int64_t* bytes) {
  const Lds ld = LdsFor(D);
  Carver c(base);
  QueryGradSmem s;
  s.q = c.Take<uint16_t>(kTile * ld.h);
  s.dy = c.Take<uint16_t>(kTile * ld.h);
  s.k = c.Take<uint16_t>(kTile * ld.h);
  s.v = c.Take<uint16_t>(kTile * ld.h);
  s.ds = c.Take<uint16_t>(kTile * ld.p);
  s.s = c.Take<float>(kTile * ld.f);
  s.dp = c.Take<float>(kTile * ld.f);
  s.acc = c.Take<float>(kTile * ld.o);
  s.lse = c.Take<float>(kTile);
  s.delta = c.Take<float>(kTile);
  if (bytes != nullptr) *bytes = c.used();
  return s;
}
BATON_FT_FN int64_t QueryGradSmemBytes(int D) {
  int64_t bytes = 0;
  CarveQueryGrad(nullptr, D, &bytes);
  return bytes;
}

// dq of query tile qt of head h of batch element b (dqkv's q columns of those rows).
BATON_FT_FN void QueryGradBlock(const Threads& t, unsigned char* smem, int64_t T, int64_t H,
                                int64_t KVH, int D, float scale, int64_t b, int64_t h, int64_t qt,
                                const float* qkv, const float* dy, const float* lse,
                                const float* delta, float* dqkv) {
  const int64_t C = H * D, W = (H + 2 * KVH) * D, g = h / (H / KVH);
  const float* base = qkv + b * T * W;
  const Lds ld = LdsFor(D);
  const QueryGradSmem s = CarveQueryGrad(smem, D, nullptr);
  const int64_t q0 = qt * kTile;
  LoadTile(t, base + h * D, W, q0, T, D, s.q, ld.h);
  LoadTile(t, dy + b * T * C + h * D, C, q0, T, D, s.dy, ld.h);
  LoadRows(t, lse + (b * H + h) * T, q0, T, s.lse);
  LoadRows(t, delta + (b * H + h) * T, q0, T, s.delta);
  Fill(t, s.acc, ld.o, D, 0.0f);
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    Sync();
    LoadTile(t, base + C + g * D, W, k0, T, D, s.k, ld.h);
    LoadTile(t, base + C + KVH * D + g * D, W, k0, T, D, s.v, ld.h);
    Sync();
    for (int w = t.warp; w < kTile / kFrag; w += t.warps) {
      WarpGemm<true>(s.q + w * kFrag * ld.h, ld.h, s.k, ld.h, s.s + w * kFrag * ld.f, ld.f, kTile,
                     D, false);
      WarpGemm<true>(s.dy + w * kFrag * ld.h, ld.h, s.v, ld.h, s.dp + w * kFrag * ld.f, ld.f, kTile,
                     D, false);
    }
    Sync();
    for (int e = t.tid; e < kTile * kTile; e += t.threads) {
      const int r = e / kTile, j = e % kTile;
      const int64_t i = q0 + r;
      float ds = 0.0f;
      if (i < T && k0 + j <= i) {
        const float p = Exp(s.s[r * ld.f + j] * scale - s.lse[r]);
        ds = p * (s.dp[r * ld.f + j] - s.delta[r]);
      }
      s.ds[r * ld.p + j] = FloatToBf16Bits(ds);
    }
    Sync();
    for (int w = t.warp; w < kTile / kFrag; w += t.warps) {
      WarpGemm<false>(s.ds + w * kFrag * ld.p, ld.p, s.k, ld.h, s.acc + w * kFrag * ld.o, ld.o, D,
                      kTile, true);
    }
  }
  Sync();
  for (int e = t.tid; e < kTile * D; e += t.threads) {
    const int r = e / D, d = e % D;
    if (q0 + r < T) dqkv[(b * T + q0 + r) * W + h * D + d] = s.acc[r * ld.o + d] * scale;
  }
}

struct KeyGradSmem {
  uint16_t *k, *v, *q, *dy, *pt, *dst;
  float *st, *dpt, *dk, *dv, *lse, *delta;
};
BATON_FT_FN KeyGradSmem CarveKeyGrad(unsigned char* base, int D, int64_t* bytes) {
  const Lds ld = LdsFor(D);
  Carver c(base);
  KeyGradSmem s;
  s.k = c.Take<uint16_t>(kTile * ld.h);
  s.v = c.Take<uint16_t>(kTile * ld.h);
  s.q = c.Take<uint16_t>(kTile * ld.h);
  s.dy = c.Take<uint16_t>(kTile * ld.h);
  s.pt = c.Take<uint16_t>(kTile * ld.p);
  s.dst = c.Take<uint16_t>(kTile * ld.p);
  s.st = c.Take<float>(kTile * ld.f);
  s.dpt = c.Take<float>(kTile * ld.f);
  s.dk = c.Take<float>(kTile * ld.o);
  s.dv = c.Take<float>(kTile * ld.o);
  s.lse = c.Take<float>(kTile);
  s.delta = c.Take<float>(kTile);
  if (bytes != nullptr) *bytes = c.used();
  return s;
}
BATON_FT_FN int64_t KeyGradSmemBytes(int D) {
  int64_t bytes = 0;
  CarveKeyGrad(nullptr, D, &bytes);
  return bytes;
}

// dk and dv of key tile kt of kv head g of batch element b (dqkv's k and v columns of those
// rows).
BATON_FT_FN void KeyGradBlock(const Threads& t, unsigned char* smem, int64_t T, int64_t H,
                              int64_t KVH, int D, float scale, int64_t b, int64_t g, int64_t kt,
                              const float* qkv, const float* dy, const float* lse,
                              const float* delta, float* dqkv) {
  const int64_t C = H * D, W = (H + 2 * KVH) * D, G = H / KVH;
  const int64_t tiles = (T + kTile - 1) / kTile;
  const float* base = qkv + b * T * W;
  const Lds ld = LdsFor(D);
  const KeyGradSmem s = CarveKeyGrad(smem, D, nullptr);
  const int64_t k0 = kt * kTile;
  LoadTile(t, base + C + g * D, W, k0, T, D, s.k, ld.h);
  LoadTile(t, base + C + KVH * D + g * D, W, k0, T, D, s.v, ld.h);
  Fill(t, s.dk, ld.o, D, 0.0f);
  Fill(t, s.dv, ld.o, D, 0.0f);
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    for (int64_t qt = kt; qt < tiles; ++qt) {
      const int64_t q0 = qt * kTile;
      Sync();
      LoadTile(t, base + h * D, W, q0, T, D, s.q, ld.h);
      LoadTile(t, dy + b * T * C + h * D, C, q0, T, D, s.dy, ld.h);
      LoadRows(t, lse + (b * H + h) * T, q0, T, s.lse);
      LoadRows(t, delta + (b * H + h) * T, q0, T, s.delta);
      Sync();
      for (int w = t.warp; w < kTile / kFrag; w += t.warps) {
        WarpGemm<true>(s.k + w * kFrag * ld.h, ld.h, s.q, ld.h, s.st + w * kFrag * ld.f, ld.f,
                       kTile, D, false);
        WarpGemm<true>(s.v + w * kFrag * ld.h, ld.h, s.dy, ld.h, s.dpt + w * kFrag * ld.f, ld.f,
                       kTile, D, false);
      }
      Sync();
      for (int e = t.tid; e < kTile * kTile; e += t.threads) {
        const int r = e / kTile, c = e % kTile;  // key row k0 + r, query row q0 + c
        const int64_t i = q0 + c;
        float p = 0.0f, ds = 0.0f;
        if (i < T && k0 + r <= i) {
          p = Exp(s.st[r * ld.f + c] * scale - s.lse[c]);
          ds = p * (s.dpt[r * ld.f + c] - s.delta[c]);
        }
        s.pt[r * ld.p + c] = FloatToBf16Bits(p);
        s.dst[r * ld.p + c] = FloatToBf16Bits(ds);
      }
      Sync();
      for (int w = t.warp; w < kTile / kFrag; w += t.warps) {
        WarpGemm<false>(s.pt + w * kFrag * ld.p, ld.p, s.dy, ld.h, s.dv + w * kFrag * ld.o, ld.o, D,
                        kTile, true);
        WarpGemm<false>(s.dst + w * kFrag * ld.p, ld.p, s.q, ld.h, s.dk + w * kFrag * ld.o, ld.o, D,
                        kTile, true);
      }
    }
  }
  Sync();
  for (int e = t.tid; e < kTile * D; e += t.threads) {
    const int r = e / D, d = e % D;
    if (k0 + r >= T) continue;
    float* row = dqkv + (b * T + k0 + r) * W;
    row[C + g * D + d] = s.dk[r * ld.o + d] * scale;
    row[C + KVH * D + g * D + d] = s.dv[r * ld.o + d];
  }
}

}  // namespace flash_tiles
}  // namespace baton

#undef BATON_FT_FN

#endif  // BATON_COMMON_CORE_FLASH_TILES_H_
