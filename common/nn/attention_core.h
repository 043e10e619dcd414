// The causal grouped-query attention core between an attention module's qkv projection and
// its output projection, shared by the GPT's CausalSelfAttention and LLaMA's attention.
//
// Three ways to run it, chosen per head size and precision by AttentionKernelFor:
//  - materialised: the softmax probabilities att [B, H, T, T] are stashed for the backward
//    (Backend::AttentionForward/Backward);
//  - fused, flash-style: only each query row's logsumexp [B, H, T] and the output
//    [B, T, H*D] are stashed; the backward recomputes the probabilities
//    (Backend::FusedAttentionForward/Backward, float32 rows);
//  - tiled, bf16 jobs only: the same stash, the bf16 tile kernels on matrix units
//    (Backend::TiledAttentionForward/Backward, flash_tiles.h).
// The first two give the same values to float32 rounding, the tiled one to bf16 rounding of
// its probabilities; none gives another's bits. A job's pipeline and its reference trainer
// run on the same backend and process settings, so they always take the same way.
#ifndef BATON_COMMON_NN_ATTENTION_CORE_H_
#define BATON_COMMON_NN_ATTENTION_CORE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/core/backend.h"
#include "common/core/tensor.h"

namespace baton {

struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, KVH = 0, D = 0;
};

// What the backward needs of one micro-batch's attention core.
struct AttentionStash {
  Tensor att;  // materialised: [B, H, T, T] probabilities
  Tensor lse;  // fused: [B, H, T] logsumexp of each query row's scaled scores
  Tensor out;  // fused: [B, T, H*D], the core's output
  bool tiled = false;  // lse and out came from the tiled kernels
};

// The kernels the core runs for head size D when `requested`, on a device that runs the
// tiled kernels (the planner's view, DescribeBlocks):
//  - kFused: the fused kernels where D <= flash::kMaxHeadSize, else the materialised ones;
//  - kTiled, in a bf16 job (`bf16`): the tiled kernels where flash_tiles::Supports(D), else
//    as kFused; in a float32 job the materialised ones (the tiled contract rounds the
//    probabilities to bf16);
//  - kMaterialised: the materialised ones.
AttentionKernel PlannedAttentionKernel(AttentionKernel requested, int64_t D, bool bf16);
// What runs on `be` under its attention_kernel(): PlannedAttentionKernel, with the fused
// kernels (the same stash) where it says tiled and the device cannot run them
// (Backend::RunsTiledAttention).
AttentionKernel AttentionKernelFor(const Backend& be, int64_t D, bool bf16);

// y [B, T, H*D] = the core on qkv [B, T, (H + 2 KVH) D]; fills `saved`. `bf16`: the job's
// precision is bf16 (q, k and v hold bf16 values), which lets the tiled kernels run. Errors
// (out of memory) name `who`.
absl::Status AttentionCoreForward(const std::string& who, Backend* be, Device device,
                                  const AttentionShape& s, bool bf16, const Tensor& qkv,
                                  AttentionStash* saved, Tensor* y);
// dqkv (shaped like qkv) from dy [B, T, H*D] and what the forward saved.
absl::Status AttentionCoreBackward(const std::string& who, Backend* be, Device device,
                                   const AttentionShape& s, const Tensor& qkv,
                                   const AttentionStash& saved, const Tensor& dy, Tensor* dqkv);

}  // namespace baton

#endif  // BATON_COMMON_NN_ATTENTION_CORE_H_
