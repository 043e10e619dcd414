#include "common/rpc/failure_cause.h"

namespace baton {

baton::v1::FailureCause FailureCauseOf(const absl::Status& s, FailureSite site) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kAlreadyExists:
      return baton::v1::FAILURE_CAUSE_CONFIG;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return site == FailureSite::kStartCall ? baton::v1::FAILURE_CAUSE_WORKER_LOST
                                             : baton::v1::FAILURE_CAUSE_PEER;
    case absl::StatusCode::kAborted:
      return baton::v1::FAILURE_CAUSE_ABORTED;
    default:
      return baton::v1::FAILURE_CAUSE_INTERNAL;
  }
}

}  // namespace baton
