// What SubmitJob checks before it takes the coordinator's lock, as one function with no
// lock and no coordinator state: the request's shape, the spec validated and defaulted,
// the pipeline built as placement will build it (the auto-planner run once on trial),
// every path confined to its roots, the data this host can see read, and what each rank
// needs of a worker. What needs the coordinator's state (the resume source, checkpoint
// directory owners, quotas, submission ids) is checked under its lock, on the AdmittedJob.
// Tests: job_admission_test.cc.
#ifndef BATON_COORDINATOR_JOB_ADMISSION_H_
#define BATON_COORDINATOR_JOB_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/jobs.pb.h"
#include "common/plan/planner.h"
#include "common/spec/spec.h"
#include "coordinator/quotas.h"

namespace baton {

// The cluster's roots and bounds a spec is checked against (CoordinatorOptions' fields of
// the same names).
struct AdmissionOptions {
  std::string checkpoint_root;          // "": checkpoint.dir is not confined
  std::vector<std::string> data_roots;  // empty: any data path
  int64_t max_data_file_bytes = 0;
};

// A spec that passed every check that needs no coordinator state. Only Admit makes one.
struct AdmittedJob {
  std::string submission_id;
  // Validated and defaulted, once: an evaluation-only job is one step without checkpoint;
  // an empty checkpoint.dir is the submitter's own (DefaultCheckpointDir), and a
  // checkpoint dir is resolved under the checkpoint root.
  ValidatedJobSpec spec;
  // What each pipeline rank needs of a worker (RankNeeds).
  std::vector<int64_t> rank_needs;
  // SCHEDULE_AUTO: the earlier runs the planner calibrates from at placement.
  std::vector<MeasuredRun> auto_costs;
};

// Checks `request` for `submitted_by`. INVALID_ARGUMENT naming the field for a request or
// spec that cannot run (a submission_id over 128 characters, no spec, a spec
// ValidateAndDefaultJobSpec or the pipeline refuses, a path outside its roots, data that
// does not fit the model); the data checks' own codes for files this host sees. For a
// SCHEDULE_AUTO spec, `earlier_runs` (may be empty) gives the calibration runs; it is
// called without any lock of the caller's held by Admit.
absl::StatusOr<AdmittedJob> Admit(
    const baton::v1::SubmitJobRequest& request, const std::string& submitted_by,
    const AdmissionOptions& options,
    const std::function<std::vector<MeasuredRun>(const baton::v1::JobSpec&)>& earlier_runs);

// Whether a submission repeated under the same submission_id asks for the job `stored`
// recorded: the specs are equal, a placed SCHEDULE_AUTO job's spec (which holds the
// planner's choice) compared with the choice filled in where `asked` left it open.
bool SameSubmission(const baton::v1::JobSpec& stored, const baton::v1::JobSpec& asked);

// The quotas of `user` with `role` against a submission of `priority` when the user has
// `queued` jobs QUEUED: PERMISSION_DENIED above max_priority, RESOURCE_EXHAUSTED at
// max_queued, each naming the limit; OK otherwise.
absl::Status CheckQuota(const QuotaLimits& limits, const std::string& user, const std::string& role,
                        int32_t priority, int queued);

// The record of a job just submitted: QUEUED at `now`, history "submitted", the spec and
// submission id of `admitted` (the id moved out), `checkpoints` (the resume source's, when it
// resumes) with its job directory when it writes checkpoints, and steps_done at the step
// it resumes from (0 for an evaluation-only job: its one step is still to come).
baton::v1::Job NewJobRecord(const std::string& id, const std::string& submitted_by,
                            const std::string& role, baton::v1::JobCheckpoints checkpoints,
                            absl::Time now, AdmittedJob* admitted);

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_ADMISSION_H_
