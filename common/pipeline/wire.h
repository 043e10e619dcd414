// How tensors travel between pipeline ranks: activations and input gradients in the job's
// wire dtype (bf16 bits under bf16 precision, half the bytes; float32 otherwise), and every
// received tensor checked against what the plan implies before any block sees it.
#ifndef BATON_COMMON_PIPELINE_WIRE_H_
#define BATON_COMMON_PIPELINE_WIRE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/core/tensor.h"
#include "common/nn/module.h"
#include "common/schedule/action.h"

namespace baton {

// The dtype of the activations and gradients between stages.
DType WireDType(Precision p);

// What leaves for another stage: `t` itself in fp32; in bf16 its bf16 bits (exact: block
// outputs and input gradients hold bf16 values, module.h), half the bytes.
absl::StatusOr<Tensor> ToWire(const Tensor& t, Precision p);

// A received tensor (already checked) as the float32 tensor on `device` the blocks take.
absl::StatusOr<Tensor> FromWire(const Tensor& t, Device device);

// A received tensor must have the dtype and shape the plan implies before any block sees
// it: a peer's bug (or a forged frame that got past the transport) fails the job with this
// INVALID_ARGUMENT, naming `what` and `a`, instead of reading out of bounds or training on
// garbage. Activations and gradients travel as `wire` (WireDType); the tied and norm
// exchanges are float32.
absl::Status CheckReceived(const Tensor& t, const Shape& want, const char* what, const Action& a,
                           DType wire = DType::kFloat32);

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_WIRE_H_
