#include "common/nn/module.h"

#include "common/core/rng.h"

namespace baton {

Parameter MakeParameter(std::string name, const Shape& shape, Init init, float stddev,
                        uint64_t seed) {
  Parameter p;
  p.value = Tensor::Empty(shape);
  switch (init) {
    case Init::kZeros:
      p.value.SetZero();
      break;
    case Init::kOnes:
      CpuBackend()->Fill(p.value.numel(), 1.0f, p.value.f32());
      break;
    case Init::kNormal:
      RngStream(seed, name).FillNormal(p.value.f32(), p.value.numel(), 0.0f, stddev);
      break;
  }
  p.grad = Tensor::Zeros(shape);
  p.name = std::move(name);
  return p;
}

}  // namespace baton
