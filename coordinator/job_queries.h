// The pure parts of the coordinator's read-only queries: checking a request, and turning
// what the job store returned into the answer. No lock, no store (the caller reads it);
// Coordinator::GetJobTrace and GetJobHistory read and call these (tests:
// job_queries_test.cc).
#ifndef BATON_COORDINATOR_JOB_QUERIES_H_
#define BATON_COORDINATOR_JOB_QUERIES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/jobs.pb.h"
#include "coordinator/job_store.h"

namespace baton {

// GetJobHistory's page size for `request` (0: `max`, larger ones cut to it);
// INVALID_ARGUMENT naming the field for a negative from_step or page_size.
absl::StatusOr<int64_t> HistoryPageSize(const baton::v1::GetJobHistoryRequest& request,
                                        int64_t max);

// A history page of `job_id` from `steps`, read with one row more than `page_size`: that
// row, when there, is not on the page but says where the next one starts.
baton::v1::JobHistory HistoryPage(const std::string& job_id,
                                  std::vector<baton::v1::StepProgress> steps, int64_t page_size);

// The trace of `step` of `job` from its ranks' stored `traces`: the kept steps, the
// pipeline's layout as placement built it (with the stages it ran on), and each rank's
// worker. NOT_FOUND, naming the kept steps, when there are no traces of it.
absl::StatusOr<baton::v1::JobTrace> AssembleTrace(const baton::v1::Job& job, int64_t step,
                                                  const JobStore::TraceSteps& kept,
                                                  std::vector<baton::v1::RankTrace> traces);

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_QUERIES_H_
