#include "common/rpc/failure_cause.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(FailureCauseTest, OneTableForStartCallsAndRuns) {
  for (FailureSite site : {FailureSite::kStartCall, FailureSite::kRankRun}) {
    for (absl::Status s :
         {absl::InvalidArgumentError("x"), absl::NotFoundError("x"),
          absl::FailedPreconditionError("x"), absl::PermissionDeniedError("x"),
          absl::DataLossError("x"), absl::OutOfRangeError("x"), absl::UnimplementedError("x"),
          absl::AlreadyExistsError("x")}) {
      EXPECT_EQ(FailureCauseOf(s, site), baton::v1::FAILURE_CAUSE_CONFIG) << s;
    }
    EXPECT_EQ(FailureCauseOf(absl::AbortedError("x"), site), baton::v1::FAILURE_CAUSE_ABORTED);
    EXPECT_EQ(FailureCauseOf(absl::ResourceExhaustedError("x"), site),
              baton::v1::FAILURE_CAUSE_INTERNAL);
    EXPECT_EQ(FailureCauseOf(absl::InternalError("x"), site), baton::v1::FAILURE_CAUSE_INTERNAL);
  }
  // A lost connection: the worker itself at a start call, a peer's link in a run.
  for (absl::Status s : {absl::UnavailableError("x"), absl::DeadlineExceededError("x"),
                         absl::CancelledError("x")}) {
    EXPECT_EQ(FailureCauseOf(s, FailureSite::kStartCall), baton::v1::FAILURE_CAUSE_WORKER_LOST)
        << s;
    EXPECT_EQ(FailureCauseOf(s, FailureSite::kRankRun), baton::v1::FAILURE_CAUSE_PEER) << s;
  }
}

}  // namespace
}  // namespace baton
