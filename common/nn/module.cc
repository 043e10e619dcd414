#include "common/nn/module.h"

#include <algorithm>
#include <vector>

#include "common/core/check.h"
#include "common/core/rng.h"
#include "common/core/status.h"

namespace baton {

namespace {

// Writes the initial values of `init` into `t` (on any device). Drawn on the host, a chunk
// at a time for a device, so every device starts from the same bits and a parameter larger
// than host memory still gets them.
absl::Status Initialise(Tensor& t, const std::string& name, Init init, float stddev,
                        uint64_t seed) {
  const int64_t n = t.numel();
  const RngStream rng(seed, name);
  if (t.device() == Device::kCpu) {
    float* p = t.f32();
    switch (init) {
      case Init::kZeros:
        std::fill(p, p + n, 0.0f);
        break;
      case Init::kOnes:
        std::fill(p, p + n, 1.0f);
        break;
      case Init::kNormal:
        rng.FillNormal(p, n, 0.0f, stddev);
        break;
    }
    return absl::OkStatus();
  }
  if (init == Init::kZeros) {
    t.SetZero();
    return absl::OkStatus();
  }
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<float> host(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    for (int64_t i = 0; i < len; ++i) {
      // The expression of RngStream::FillNormal, element by element.
      host[i] =
          init == Init::kOnes ? 1.0f : 0.0f + stddev * rng.Normal(static_cast<uint64_t>(off + i));
    }
    BATON_RETURN_IF_ERROR(t.CopyFromHost(host.data(), static_cast<size_t>(off) * sizeof(float),
                                         static_cast<size_t>(len) * sizeof(float)));
  }
  return absl::OkStatus();
}

}  // namespace

Parameter MakeParameter(std::string name, const Shape& shape, Init init, float stddev,
                        uint64_t seed, Device device, const std::string& init_name) {
  Parameter p;
  p.name = std::move(name);
  absl::StatusOr<Tensor> value = Tensor::TryEmpty(shape, DType::kFloat32, device);
  absl::Status st = value.status();
  if (st.ok()) st = Initialise(*value, init_name.empty() ? p.name : init_name, init, stddev, seed);
  absl::StatusOr<Tensor> grad = Tensor::TryEmpty(shape, DType::kFloat32, device);
  if (st.ok()) st = grad.status();
  if (!st.ok()) {
    p.init_status = st;
    return p;  // value and grad undefined
  }
  grad->SetZero();
  p.value = *std::move(value);
  p.grad = *std::move(grad);
  return p;
}

absl::Status CheckParameters(const std::vector<Parameter*>& params) {
  for (const Parameter* p : params) {
    if (!p->init_status.ok()) {
      return absl::Status(p->init_status.code(),
                          absl::StrCat("parameter ", p->name, ": ", p->init_status.message()));
    }
  }
  return absl::OkStatus();
}

Backend* BackendOrDie(Device device) {
  absl::StatusOr<Backend*> be = BackendFor(device);
  BATON_CHECK_OK(be.status());
  return *be;
}

absl::StatusOr<Tensor> NewTensor(const std::string& who, const Shape& shape, Device device,
                                 DType dtype) {
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(shape, dtype, device);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(who, ": ", t.status().message()));
  }
  return t;
}

void RoundIfBf16(const MicroBatch& mb, Backend* be, Tensor* t) {
  if (mb.bf16() && t->defined()) be->RoundToBf16(t->numel(), t->f32(), t->f32());
}

absl::StatusOr<float> LossValue(const Tensor& loss) {
  if (!loss.defined() || loss.dtype() != DType::kFloat32 || loss.numel() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a loss is a 1-element float32 tensor, got ", loss.DebugString()));
  }
  float value = 0.0f;
  BATON_RETURN_IF_ERROR(loss.CopyToHost(&value));
  return value;
}

absl::Status AddLosses(const std::vector<Tensor>& losses, StepLoss* into) {
  for (const Tensor& t : losses) {
    absl::StatusOr<float> v = LossValue(t);
    if (!v.ok()) return v.status();
    into->Add(*v);
  }
  return absl::OkStatus();
}

void Product(Backend* be, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             const Tensor& a, const Tensor& b, float beta, float* c) {
  ProductLd(be, trans_a, trans_b, m, n, k, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

void ProductLd(Backend* be, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  if (a.dtype() == DType::kBFloat16 && b.dtype() == DType::kBFloat16) {
    be->GemmBf16(trans_a, trans_b, m, n, k, 1.0f, a.bf16(), lda, b.bf16(), ldb, beta, c, ldc);
    return;
  }
  BATON_CHECK(a.dtype() == DType::kFloat32 && b.dtype() == DType::kFloat32);
  be->Gemm(trans_a, trans_b, m, n, k, 1.0f, a.f32(), lda, b.f32(), ldb, beta, c, ldc);
}

absl::StatusOr<Tensor> PackIfBf16(const std::string& who, const MicroBatch& mb, Backend* be,
                                  const Tensor& t) {
  if (!mb.bf16() || !t.defined()) return t;
  BATON_ASSIGN_OR_RETURN(Tensor packed, NewTensor(who, t.shape(), t.device(), DType::kBFloat16));
  be->ToBf16(t.numel(), t.f32(), packed.bf16());
  return packed;
}

absl::StatusOr<Tensor> Unpacked(const std::string& who, Backend* be, const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::kBFloat16) return t;
  BATON_ASSIGN_OR_RETURN(Tensor f, NewTensor(who, t.shape(), t.device()));
  be->FromBf16(t.numel(), t.bf16(), f.f32());
  return f;
}

}  // namespace baton
