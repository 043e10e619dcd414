// Optimizers over a set of parameters, with per-parameter state.
//
// A pipeline stage creates one optimizer over the parameters of its own blocks; because
// every update is element-wise and per parameter, a stage's update equals the reference
// trainer's update of the same parameters, bit for bit.
#ifndef BATON_COMMON_OPTIM_OPTIMIZER_H_
#define BATON_COMMON_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/nn/module.h"

namespace baton {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' current gradients (it does not zero them).
  virtual void Step() = 0;
  int64_t steps_taken() const { return steps_; }

  // One state tensor of one parameter, named as PyTorch's optimizers name it
  // ("momentum_buffer"; "exp_avg", "exp_avg_sq"). `state` is the optimizer's own tensor: a
  // checkpoint reads it, a resume writes it.
  struct Slot {
    Parameter* param = nullptr;
    std::string name;
    Tensor* state = nullptr;
  };
  // Every slot, parameter by parameter in the order given at construction.
  virtual std::vector<Slot> Slots() = 0;
  // Restores the count of updates taken, with the slots: a resumed run then continues
  // AdamW's bias correction and SGD's first-step momentum rule where the checkpoint left
  // them.
  void set_steps_taken(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;
};

// Builds the optimizer a validated spec names, over `params` (not owned; they must outlive
// the optimizer). Its state lives on the parameters' device (they share one) and is
// allocated here, once: RESOURCE_EXHAUSTED naming the parameter when the device is full,
// INVALID_ARGUMENT when the parameters are on different devices.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const baton::v1::OptimizerSpec& spec,
                                                         std::vector<Parameter*> params);

}  // namespace baton

#endif  // BATON_COMMON_OPTIM_OPTIMIZER_H_
