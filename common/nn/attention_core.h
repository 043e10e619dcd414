// The causal grouped-query attention core between an attention module's qkv projection and
// its output projection, shared by the GPT's CausalSelfAttention and LLaMA's attention.
//
// Two ways to run it, the backend decides per head size (Backend::UsesFusedAttention):
//  - materialised: the softmax probabilities att [B, H, T, T] are stashed for the backward
//    (Backend::AttentionForward/Backward);
//  - fused, flash-style: only each query row's logsumexp [B, H, T] and the output
//    [B, T, H*D] are stashed; the backward recomputes the probabilities
//    (Backend::FusedAttentionForward/Backward).
// The two give the same values to float32 rounding, not the same bits: a job's pipeline and
// its reference trainer run on the same backend, so they always take the same way.
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
};

// y [B, T, H*D] = the core on qkv [B, T, (H + 2 KVH) D]; fills `saved`. Errors (out of
// memory) name `who`.
absl::Status AttentionCoreForward(const std::string& who, Backend* be, Device device,
                                  const AttentionShape& s, const Tensor& qkv,
                                  AttentionStash* saved, Tensor* y);
// dqkv (shaped like qkv) from dy [B, T, H*D] and what the forward saved.
absl::Status AttentionCoreBackward(const std::string& who, Backend* be, Device device,
                                   const AttentionShape& s, const Tensor& qkv,
                                   const AttentionStash& saved, const Tensor& dy, Tensor* dqkv);

}  // namespace baton

#endif  // BATON_COMMON_NN_ATTENTION_CORE_H_
