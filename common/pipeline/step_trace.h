// A rank's executed step as a baton.v1.RankTrace: what workers report to the coordinator
// for `batonctl trace`, and what `batonctl train-local --pipeline --trace` writes.
#ifndef BATON_COMMON_PIPELINE_STEP_TRACE_H_
#define BATON_COMMON_PIPELINE_STEP_TRACE_H_

#include "baton/v1/cluster.pb.h"
#include "common/pipeline/stage_executor.h"

namespace baton {

// The clock's actions in order, then the end-of-step send waits (send_wait set), then the
// gradient all-reduces of the communication thread (allreduce set).
baton::v1::RankTrace RankTraceFromStep(const RankStepResult& step);

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_STEP_TRACE_H_
