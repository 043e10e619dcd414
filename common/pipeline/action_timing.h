// When an action ran on a rank, as the stage executor and its communication thread record it.
#ifndef BATON_COMMON_PIPELINE_ACTION_TIMING_H_
#define BATON_COMMON_PIPELINE_ACTION_TIMING_H_

#include <cstdint>

#include "common/schedule/action.h"

namespace baton {

// One executed action, times in nanoseconds since the step started on this rank.
struct ActionTiming {
  Action action;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t bytes = 0;  // tensor payload moved by a send or receive action
  // Device time of a compute action or STEP on a rank whose device computes asynchronously
  // (a GPU: there start/end above are issue times); -1 where not measured (the CPU, whose
  // wall time is its compute time, and communication actions).
  int64_t device_ns = -1;
};

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_ACTION_TIMING_H_
