#include "common/spec/schedule_spec.h"

#include "common/core/status.h"
#include "common/schedule/vocabulary.h"

namespace baton {

absl::StatusOr<ScheduleKind> ScheduleKindFromSpec(const baton::v1::PipelineSpec& p) {
  BATON_ASSIGN_OR_RETURN(const ScheduleEntry* e,
                         ScheduleEntryForSpecValue(static_cast<int>(p.schedule())));
  return e->kind;
}

}  // namespace baton
