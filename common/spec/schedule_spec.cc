#include "common/spec/schedule_spec.h"

#include <optional>

#include "common/core/status.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"

namespace baton {

absl::StatusOr<ScheduleKind> ScheduleKindFromSpec(const baton::v1::PipelineSpec& p) {
  BATON_ASSIGN_OR_RETURN(const ScheduleEntry* e,
                         ScheduleEntryForSpecValue(static_cast<int>(p.schedule())));
  return e->kind;
}

absl::StatusOr<Schedule> AddJobActions(const Schedule& lowered, const baton::v1::JobSpec& spec) {
  Schedule out = lowered;
  if (spec.pipeline().data_parallel() > 1 && !out.reduces_grads()) {
    BATON_ASSIGN_OR_RETURN(out, AddGradReductions(out));
  }
  const std::optional<TokenModel> model = TokenModelOf(spec.model());
  if (model && model->tie_embeddings && !out.ties_grads()) {
    BATON_ASSIGN_OR_RETURN(out, AddTiedGradSums(out));
  }
  // Clipping, after both: the norm is of the replica-summed, tied-summed gradients.
  if (spec.optimizer().clip_grad_norm() > 0.0f && !out.clips_grads()) {
    BATON_ASSIGN_OR_RETURN(out, AddGradClips(out));
  }
  BATON_RETURN_IF_ERROR(Validate(out));
  return out;
}

}  // namespace baton
