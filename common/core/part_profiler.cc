#include "common/core/part_profiler.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace baton {

const char* StepPartName(StepPart part) {
  switch (part) {
    case StepPart::kGemm:
      return "gemm";
    case StepPart::kHeadGemm:
      return "lm-head gemm";
    case StepPart::kAttention:
      return "attention";
    case StepPart::kElementwise:
      return "element-wise";
    case StepPart::kNorm:
      return "norm";
    case StepPart::kLoss:
      return "loss";
    case StepPart::kEmbedding:
      return "embedding";
    case StepPart::kSums:
      return "sums";
    case StepPart::kOptimizer:
      return "optimizer";
  }
  return "?";
}

PartProfiler::PartProfiler(Backend* inner, int64_t vocab)
    : inner_(inner), vocab_(vocab), timer_(NewDeviceTimer(inner->device())) {}

template <typename Run>
auto PartProfiler::Timed(StepPart part, const char* kernel, Run&& run) {
  Part& total = totals_[static_cast<int>(part)];
  auto& kernels = kernels_[static_cast<int>(part)];
  auto it = kernels.find(kernel);
  if (it == kernels.end()) it = kernels.emplace(kernel, Part{}).first;
  Part& each = it->second;
  if (timer_ == nullptr) {  // the CPU: the call's wall time
    const auto t0 = std::chrono::steady_clock::now();
    struct Count {  // on the way out, also for a call that returns a value
      Part& total;
      Part& each;
      std::chrono::steady_clock::time_point t0;
      ~Count() {
        const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - t0)
                               .count();
        ++total.calls;
        total.ns += ns;
        ++each.calls;
        each.ns += ns;
      }
    } count{total, each, t0};
    return run();
  }
  const int from = timer_->Mark();
  struct Mark {
    PartProfiler* self;
    StepPart part;
    Part* each;
    int from;
    ~Mark() { self->pending_.push_back({part, each, from, self->timer_->Mark()}); }
  } mark{this, part, &each, from};
  return run();
}

StepPart PartProfiler::GemmPart(int64_t m, int64_t n, int64_t k) const {
  return vocab_ > 0 && (m == vocab_ || n == vocab_ || k == vocab_) ? StepPart::kHeadGemm
                                                                   : StepPart::kGemm;
}

absl::Status PartProfiler::Collect() {
  absl::Status status;
  for (const Pending& p : pending_) {
    Part& total = totals_[static_cast<int>(p.part)];
    ++total.calls;
    ++p.kernel->calls;
    if (p.from < 0 || p.to < 0) {
      if (status.ok()) {
        status = absl::UnavailableError(absl::StrCat("could not mark the device's stream around a ",
                                                     StepPartName(p.part), " call"));
      }
      continue;
    }
    absl::StatusOr<int64_t> ns = timer_->ElapsedNs(p.from, p.to);
    if (!ns.ok()) {
      if (status.ok()) status = ns.status();
      continue;
    }
    total.ns += *ns;
    p.kernel->ns += *ns;
  }
  pending_.clear();
  if (timer_ != nullptr) timer_->Reset();
  return status;
}

void PartProfiler::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                        float* c, int64_t ldc) {
  Timed(GemmPart(m, n, k), "Gemm",
        [&] { inner_->Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}
void PartProfiler::GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const uint16_t* a, int64_t lda, const uint16_t* b,
                            int64_t ldb, float beta, float* c, int64_t ldc) {
  Timed(GemmPart(m, n, k), "GemmBf16",
        [&] { inner_->GemmBf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

void PartProfiler::Add(int64_t n, const float* a, const float* b, float* out) {
  Timed(StepPart::kElementwise, "Add", [&] { inner_->Add(n, a, b, out); });
}
void PartProfiler::Scale(int64_t n, float scale, const float* x, float* y) {
  Timed(StepPart::kElementwise, "Scale", [&] { inner_->Scale(n, scale, x, y); });
}
void PartProfiler::Fill(int64_t n, float value, float* y) {
  Timed(StepPart::kElementwise, "Fill", [&] { inner_->Fill(n, value, y); });
}
void PartProfiler::Copy(int64_t n, const float* x, float* y) {
  Timed(StepPart::kElementwise, "Copy", [&] { inner_->Copy(n, x, y); });
}
void PartProfiler::CopyRows(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* y,
                            int64_t ldy) {
  Timed(StepPart::kElementwise, "CopyRows", [&] { inner_->CopyRows(rows, cols, x, ldx, y, ldy); });
}

double PartProfiler::Sum(int64_t n, const float* x) {
  return Timed(StepPart::kSums, "Sum", [&] { return inner_->Sum(n, x); });
}
double PartProfiler::SumSquares(int64_t n, const float* x) {
  return Timed(StepPart::kSums, "SumSquares", [&] { return inner_->SumSquares(n, x); });
}
void PartProfiler::SumEach(absl::Span<const float* const> xs, absl::Span<const int64_t> ns,
                           double* out) {
  Timed(StepPart::kSums, "SumEach", [&] { inner_->SumEach(xs, ns, out); });
}
void PartProfiler::SumSquaresEach(absl::Span<const float* const> xs, absl::Span<const int64_t> ns,
                                  double* out) {
  Timed(StepPart::kSums, "SumSquaresEach", [&] { inner_->SumSquaresEach(xs, ns, out); });
}
void PartProfiler::MeanInto(int64_t n, const float* x, float* out) {
  Timed(StepPart::kSums, "MeanInto", [&] { inner_->MeanInto(n, x, out); });
}

void PartProfiler::RoundToBf16(int64_t n, const float* x, float* y) {
  Timed(StepPart::kElementwise, "RoundToBf16", [&] { inner_->RoundToBf16(n, x, y); });
}
void PartProfiler::ToBf16(int64_t n, const float* x, uint16_t* y) {
  Timed(StepPart::kElementwise, "ToBf16", [&] { inner_->ToBf16(n, x, y); });
}
void PartProfiler::FromBf16(int64_t n, const uint16_t* x, float* y) {
  Timed(StepPart::kElementwise, "FromBf16", [&] { inner_->FromBf16(n, x, y); });
}
void PartProfiler::AddBias(int64_t rows, int64_t cols, const float* bias, float* y,
                           bool round_bf16) {
  Timed(StepPart::kElementwise, "AddBias",
        [&] { inner_->AddBias(rows, cols, bias, y, round_bf16); });
}
void PartProfiler::BiasGrad(int64_t rows, int64_t cols, const float* dy, float* dbias) {
  Timed(StepPart::kElementwise, "BiasGrad", [&] { inner_->BiasGrad(rows, cols, dy, dbias); });
}
void PartProfiler::BiasGradBf16(int64_t rows, int64_t cols, const uint16_t* dy, float* dbias) {
  Timed(StepPart::kElementwise, "BiasGradBf16",
        [&] { inner_->BiasGradBf16(rows, cols, dy, dbias); });
}
void PartProfiler::BiasGelu(int64_t rows, int64_t cols, const float* x, const float* bias,
                            float* pre, float* out, bool round_bf16) {
  Timed(StepPart::kElementwise, "BiasGelu",
        [&] { inner_->BiasGelu(rows, cols, x, bias, pre, out, round_bf16); });
}
void PartProfiler::GeluBackward(int64_t n, const float* pre, const float* dy, float* dx) {
  Timed(StepPart::kElementwise, "GeluBackward", [&] { inner_->GeluBackward(n, pre, dy, dx); });
}

void PartProfiler::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                                    const float* gamma, const float* beta, float* y, float* mean,
                                    float* rstd) {
  Timed(StepPart::kNorm, "LayerNormForward",
        [&] { inner_->LayerNormForward(rows, cols, eps, x, gamma, beta, y, mean, rstd); });
}
void PartProfiler::AddLayerNormForward(int64_t rows, int64_t cols, float eps, const float* a,
                                       const float* b, bool round_bf16, const float* gamma,
                                       const float* beta, float* sum, float* y, float* mean,
                                       float* rstd) {
  Timed(StepPart::kNorm, "AddLayerNormForward", [&] {
    inner_->AddLayerNormForward(rows, cols, eps, a, b, round_bf16, gamma, beta, sum, y, mean, rstd);
  });
}
void PartProfiler::LayerNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                                          const float* mean, const float* rstd, const float* gamma,
                                          const float* dy, float* dx) {
  Timed(StepPart::kNorm, "LayerNormBackwardInput",
        [&] { inner_->LayerNormBackwardInput(rows, cols, x, mean, rstd, gamma, dy, dx); });
}
void PartProfiler::LayerNormBackwardWeight(int64_t rows, int64_t cols, const float* x,
                                           const float* mean, const float* rstd, const float* dy,
                                           float* dgamma, float* dbeta) {
  Timed(StepPart::kNorm, "LayerNormBackwardWeight",
        [&] { inner_->LayerNormBackwardWeight(rows, cols, x, mean, rstd, dy, dgamma, dbeta); });
}
void PartProfiler::RmsNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                                  const float* gamma, float* y, float* rstd) {
  Timed(StepPart::kNorm, "RmsNormForward",
        [&] { inner_->RmsNormForward(rows, cols, eps, x, gamma, y, rstd); });
}
void PartProfiler::RmsNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                                        const float* rstd, const float* gamma, const float* dy,
                                        float* dx) {
  Timed(StepPart::kNorm, "RmsNormBackwardInput",
        [&] { inner_->RmsNormBackwardInput(rows, cols, x, rstd, gamma, dy, dx); });
}
void PartProfiler::RmsNormBackwardWeight(int64_t rows, int64_t cols, const float* x,
                                         const float* rstd, const float* dy, float* dgamma) {
  Timed(StepPart::kNorm, "RmsNormBackwardWeight",
        [&] { inner_->RmsNormBackwardWeight(rows, cols, x, rstd, dy, dgamma); });
}

void PartProfiler::RotaryForward(int64_t B, int64_t T, int64_t heads, int64_t D, int64_t row_stride,
                                 float theta, float* x) {
  Timed(StepPart::kElementwise, "RotaryForward",
        [&] { inner_->RotaryForward(B, T, heads, D, row_stride, theta, x); });
}
void PartProfiler::RotaryBackward(int64_t B, int64_t T, int64_t heads, int64_t D,
                                  int64_t row_stride, float theta, float* x) {
  Timed(StepPart::kElementwise, "RotaryBackward",
        [&] { inner_->RotaryBackward(B, T, heads, D, row_stride, theta, x); });
}

void PartProfiler::AttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                    const float* qkv, float* att, float* y) {
  Timed(StepPart::kAttention, "AttentionForward",
        [&] { inner_->AttentionForward(B, T, H, KVH, D, qkv, att, y); });
}
void PartProfiler::AttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                     const float* qkv, const float* att, const float* dy,
                                     float* dqkv, float* scratch) {
  Timed(StepPart::kAttention, "AttentionBackward",
        [&] { inner_->AttentionBackward(B, T, H, KVH, D, qkv, att, dy, dqkv, scratch); });
}
void PartProfiler::FusedAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                         const float* qkv, float* y, float* lse) {
  Timed(StepPart::kAttention, "FusedAttentionForward",
        [&] { inner_->FusedAttentionForward(B, T, H, KVH, D, qkv, y, lse); });
}
void PartProfiler::FusedAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                          const float* qkv, const float* y, const float* lse,
                                          const float* dy, float* dqkv, float* scratch) {
  Timed(StepPart::kAttention, "FusedAttentionBackward",
        [&] { inner_->FusedAttentionBackward(B, T, H, KVH, D, qkv, y, lse, dy, dqkv, scratch); });
}
void PartProfiler::TiledAttentionForward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                         const float* qkv, float* y, float* lse) {
  Timed(StepPart::kAttention, "TiledAttentionForward",
        [&] { inner_->TiledAttentionForward(B, T, H, KVH, D, qkv, y, lse); });
}
void PartProfiler::TiledAttentionBackward(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                          const float* qkv, const float* y, const float* lse,
                                          const float* dy, float* dqkv, float* scratch) {
  Timed(StepPart::kAttention, "TiledAttentionBackward",
        [&] { inner_->TiledAttentionBackward(B, T, H, KVH, D, qkv, y, lse, dy, dqkv, scratch); });
}

void PartProfiler::SwiGluForward(int64_t rows, int64_t I, const float* gate_up, float* out) {
  Timed(StepPart::kElementwise, "SwiGluForward",
        [&] { inner_->SwiGluForward(rows, I, gate_up, out); });
}
void PartProfiler::SwiGluBackward(int64_t rows, int64_t I, const float* gate_up, const float* dout,
                                  float* dgate_up) {
  Timed(StepPart::kElementwise, "SwiGluBackward",
        [&] { inner_->SwiGluBackward(rows, I, gate_up, dout, dgate_up); });
}

void PartProfiler::EmbeddingForward(int64_t B, int64_t T, int64_t C, const int32_t* tokens,
                                    const float* wte, const float* wpe, float* out) {
  Timed(StepPart::kEmbedding, "EmbeddingForward",
        [&] { inner_->EmbeddingForward(B, T, C, tokens, wte, wpe, out); });
}
void PartProfiler::EmbeddingBackward(int64_t B, int64_t T, int64_t C, const int32_t* tokens,
                                     const float* dout, float* dwte, float* dwpe) {
  Timed(StepPart::kEmbedding, "EmbeddingBackward",
        [&] { inner_->EmbeddingBackward(B, T, C, tokens, dout, dwte, dwpe); });
}

void PartProfiler::SoftmaxCrossEntropyForward(int64_t rows, int64_t V, int64_t ld,
                                              const float* logits, const int32_t* targets,
                                              float* stats, float* losses) {
  Timed(StepPart::kLoss, "SoftmaxCrossEntropyForward",
        [&] { inner_->SoftmaxCrossEntropyForward(rows, V, ld, logits, targets, stats, losses); });
}
void PartProfiler::SoftmaxCrossEntropyBackward(int64_t rows, int64_t V, int64_t ld,
                                               const float* logits, const float* stats,
                                               const int32_t* targets, float scale,
                                               float* dlogits) {
  Timed(StepPart::kLoss, "SoftmaxCrossEntropyBackward", [&] {
    inner_->SoftmaxCrossEntropyBackward(rows, V, ld, logits, stats, targets, scale, dlogits);
  });
}
double PartProfiler::SquaredError(int64_t n, const float* pred, const float* target, float* diff) {
  return Timed(StepPart::kLoss, "SquaredError",
               [&] { return inner_->SquaredError(n, pred, target, diff); });
}
void PartProfiler::SquaredErrorMeanInto(int64_t n, const float* pred, const float* target,
                                        float* diff, float* out) {
  Timed(StepPart::kLoss, "SquaredErrorMeanInto",
        [&] { inner_->SquaredErrorMeanInto(n, pred, target, diff, out); });
}

void PartProfiler::SgdStep(int64_t n, float lr, float momentum, float weight_decay, bool first_step,
                           float* w, const float* g, float* buf) {
  Timed(StepPart::kOptimizer, "SgdStep",
        [&] { inner_->SgdStep(n, lr, momentum, weight_decay, first_step, w, g, buf); });
}
void PartProfiler::AdamWStep(int64_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bias_correction1, float bias_correction2,
                             float* w, const float* g, float* m, float* v) {
  Timed(StepPart::kOptimizer, "AdamWStep", [&] {
    inner_->AdamWStep(n, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, w,
                      g, m, v);
  });
}

}  // namespace baton
