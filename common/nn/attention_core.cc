#include "common/nn/attention_core.h"

#include "common/core/flash_attention_math.h"
#include "common/core/flash_tiles.h"
#include "common/core/status.h"
#include "common/nn/module.h"

namespace baton {

AttentionKernel PlannedAttentionKernel(AttentionKernel requested, int64_t D, bool bf16) {
  const bool fused = D <= flash::kMaxHeadSize;
  switch (requested) {
    case AttentionKernel::kTiled:
      if (!bf16) return AttentionKernel::kMaterialised;
      if (flash_tiles::Supports(D)) return AttentionKernel::kTiled;
      return fused ? AttentionKernel::kFused : AttentionKernel::kMaterialised;
    case AttentionKernel::kFused:
      return fused ? AttentionKernel::kFused : AttentionKernel::kMaterialised;
    case AttentionKernel::kMaterialised:
      break;
  }
  return AttentionKernel::kMaterialised;
}

AttentionKernel AttentionKernelFor(const Backend& be, int64_t D, bool bf16) {
  const AttentionKernel k = PlannedAttentionKernel(be.attention_kernel(), D, bf16);
  return k == AttentionKernel::kTiled && !be.RunsTiledAttention(D) ? AttentionKernel::kFused : k;
}

absl::Status AttentionCoreForward(const std::string& who, Backend* be, Device device,
                                  const AttentionShape& s, bool bf16, const Tensor& qkv,
                                  AttentionStash* saved, Tensor* y) {
  BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(who, {s.B, s.T, s.H * s.D}, device));
  const AttentionKernel kernel = AttentionKernelFor(*be, s.D, bf16);
  if (kernel == AttentionKernel::kTiled) {
    BATON_ASSIGN_OR_RETURN(saved->lse, NewTensor(who, {s.B, s.H, s.T}, device));
    be->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), out.f32(), saved->lse.f32());
    saved->out = out;
    saved->tiled = true;
  } else if (kernel == AttentionKernel::kFused) {
    BATON_ASSIGN_OR_RETURN(saved->lse, NewTensor(who, {s.B, s.H, s.T}, device));
    be->FusedAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), out.f32(), saved->lse.f32());
    saved->out = out;
  } else {
    BATON_ASSIGN_OR_RETURN(saved->att, NewTensor(who, {s.B, s.H, s.T, s.T}, device));
    be->AttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), saved->att.f32(), out.f32());
  }
  *y = std::move(out);
  return absl::OkStatus();
}

absl::Status AttentionCoreBackward(const std::string& who, Backend* be, Device device,
                                   const AttentionShape& s, const Tensor& qkv,
                                   const AttentionStash& saved, const Tensor& dy, Tensor* dqkv) {
  BATON_ASSIGN_OR_RETURN(Tensor g, NewTensor(who, qkv.shape(), device));
  if (saved.lse.defined()) {
    BATON_ASSIGN_OR_RETURN(Tensor scratch, NewTensor(who, {s.B, s.H, s.T}, device));
    if (saved.tiled) {
      be->TiledAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), saved.out.f32(),
                                 saved.lse.f32(), dy.f32(), g.f32(), scratch.f32());
      *dqkv = std::move(g);
      return absl::OkStatus();
    }
    be->FusedAttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), saved.out.f32(),
                               saved.lse.f32(), dy.f32(), g.f32(), scratch.f32());
  } else {
    BATON_ASSIGN_OR_RETURN(Tensor scratch, NewTensor(who, {s.H, s.T, s.T}, device));
    be->AttentionBackward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), saved.att.f32(), dy.f32(),
                          g.f32(), scratch.f32());
  }
  *dqkv = std::move(g);
  return absl::OkStatus();
}

}  // namespace baton
