#include "common/nn/attention_core.h"

#include "common/core/status.h"
#include "common/nn/module.h"

namespace baton {

absl::Status AttentionCoreForward(const std::string& who, Backend* be, Device device,
                                  const AttentionShape& s, bool bf16, const Tensor& qkv,
                                  AttentionStash* saved, Tensor* y) {
  BATON_ASSIGN_OR_RETURN(Tensor out, NewTensor(who, {s.B, s.T, s.H * s.D}, device));
  if (bf16 && be->UsesTiledAttention(s.D)) {
    BATON_ASSIGN_OR_RETURN(saved->lse, NewTensor(who, {s.B, s.H, s.T}, device));
    be->TiledAttentionForward(s.B, s.T, s.H, s.KVH, s.D, qkv.f32(), out.f32(), saved->lse.f32());
    saved->out = out;
    saved->tiled = true;
  } else if (be->UsesFusedAttention(s.D) &&
             (bf16 || be->attention_kernel() == AttentionKernel::kFused)) {
    // (A GPU that cannot run the tiled kernels takes these in a bf16 job; an fp32 job under
    // kTiled takes the materialised ones on every device.)
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
