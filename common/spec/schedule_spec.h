// The job spec's schedule, in the pipeline vocabulary's terms (common/schedule/vocabulary.h):
// the vocabulary keeps baton.v1.Schedule as a number so that the schedule library needs no
// protobuf; this is where the spec's enum becomes a ScheduleKind.
#ifndef BATON_COMMON_SPEC_SCHEDULE_SPEC_H_
#define BATON_COMMON_SPEC_SCHEDULE_SPEC_H_

#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/schedule/schedule.h"

namespace baton {

// The kind of pipeline.schedule; unspecified is 1F1B, the spec's default. INVALID_ARGUMENT
// naming pipeline.schedule for a number the vocabulary has no entry for.
absl::StatusOr<ScheduleKind> ScheduleKindFromSpec(const baton::v1::PipelineSpec& p);

// The job's own actions added to a lowered clock: REDUCE_GRAD per stage when the job has
// replicas (pipeline.data_parallel > 1) and the clock has none yet; TIE_GRAD on both ends
// when the model ties its embeddings (TokenModel::tie_embeddings) and the clock has none
// yet; CLIP_GRAD on every rank, after those, when the optimizer clips
// (optimizer.clip_grad_norm > 0) and the clock has none yet. The result is validated. Every trainer that runs a job's clock goes through here.
absl::StatusOr<Schedule> AddJobActions(const Schedule& lowered, const baton::v1::JobSpec& spec);

}  // namespace baton

#endif  // BATON_COMMON_SPEC_SCHEDULE_SPEC_H_
