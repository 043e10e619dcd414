// StepLoss: a step's loss, the one rule every trainer and report uses (the reference
// trainer, the pipeline, a worker's report and the coordinator's tally of replicas): the
// losses summed in order (replica, then micro-batch) in double, divided by how many there
// were. Loss tensors on a device are read and added by AddLosses (common/nn/module.h).
#ifndef BATON_COMMON_CORE_STEP_LOSS_H_
#define BATON_COMMON_CORE_STEP_LOSS_H_

#include <cstdint>

namespace baton {

class StepLoss {
 public:
  void Add(float loss) {
    sum_ += loss;
    ++count_;
  }
  // 0 before anything was added.
  float Mean() const {
    return count_ > 0 ? static_cast<float>(sum_ / static_cast<double>(count_)) : 0.0f;
  }

 private:
  double sum_ = 0.0;
  int64_t count_ = 0;
};

}  // namespace baton

#endif  // BATON_COMMON_CORE_STEP_LOSS_H_
