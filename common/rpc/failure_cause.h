// The one table from a failed status to the FailureCause a job's record shows
// (baton.v1.FailureCause, cluster.proto). The coordinator classifies a worker's refusal of
// StartJob with it, and a worker classifies how its rank's run ended.
#ifndef BATON_COMMON_RPC_FAILURE_CAUSE_H_
#define BATON_COMMON_RPC_FAILURE_CAUSE_H_

#include "absl/status/status.h"
#include "baton/v1/cluster.pb.h"

namespace baton {

// Where the status came from, which decides what a lost connection means.
enum class FailureSite {
  kStartCall,  // the coordinator's StartJob call to a worker: the worker is lost
  kRankRun,    // a rank's run on a worker: a link to a peer failed
};

// CONFIG for what running again will not fix (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, PERMISSION_DENIED, DATA_LOSS, OUT_OF_RANGE, UNIMPLEMENTED,
// ALREADY_EXISTS); UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED are WORKER_LOST at a start
// call and PEER in a run; ABORTED is ABORTED (an echo of a failure elsewhere); anything else
// INTERNAL. What only the caller knows (training diverged, the worker was told to stop)
// comes before this table.
baton::v1::FailureCause FailureCauseOf(const absl::Status& s, FailureSite site);

}  // namespace baton

#endif  // BATON_COMMON_RPC_FAILURE_CAUSE_H_
