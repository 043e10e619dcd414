#include "common/pipeline/step_trace.h"

namespace baton {

baton::v1::RankTrace RankTraceFromStep(const RankStepResult& step) {
  baton::v1::RankTrace out;
  out.set_rank(step.rank);
  out.set_start_unix_nanos(absl::ToUnixNanos(step.start));
  out.set_end_ns(step.end_ns);
  auto add = [&out](const ActionTiming& t, bool send_wait, bool allreduce = false) {
    baton::v1::ActionSpan* span = out.add_actions();
    span->set_action(t.action.ToString());
    span->set_start_ns(t.start_ns);
    span->set_end_ns(t.end_ns);
    span->set_bytes(t.bytes);
    span->set_send_wait(send_wait);
    span->set_allreduce(allreduce);
    if (t.device_ns >= 0) span->set_device_ns(t.device_ns);
  };
  for (const ActionTiming& t : step.timeline) add(t, false);
  for (const ActionTiming& t : step.send_waits) add(t, true);
  for (const ActionTiming& t : step.reductions) add(t, false, true);
  return out;
}

}  // namespace baton
