#include "common/pipeline/wire.h"

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/status.h"

namespace baton {

DType WireDType(Precision p) { return p == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat32; }

absl::StatusOr<Tensor> ToWire(const Tensor& t, Precision p) {
  if (p != Precision::kBf16) return t;
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(t.device()));
  BATON_ASSIGN_OR_RETURN(Tensor w, Tensor::TryEmpty(t.shape(), DType::kBFloat16, t.device()));
  be->ToBf16(t.numel(), t.f32(), w.bf16());
  return w;
}

absl::StatusOr<Tensor> FromWire(const Tensor& t, Device device) {
  BATON_ASSIGN_OR_RETURN(Tensor on, t.On(device));
  if (on.dtype() != DType::kBFloat16) return on;
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(device));
  BATON_ASSIGN_OR_RETURN(Tensor f, Tensor::TryEmpty(on.shape(), DType::kFloat32, device));
  be->FromBf16(on.numel(), on.bf16(), f.f32());
  return f;
}

absl::Status CheckReceived(const Tensor& t, const Shape& want, const char* what, const Action& a,
                           DType wire) {
  if (t.dtype() == wire && t.shape() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "received ", what, " for ", a.ToString(), " is ", ShapeString(t.shape()), " of ",
      DTypeName(t.dtype()), "; the plan expects ", ShapeString(want), " of ", DTypeName(wire)));
}

}  // namespace baton
