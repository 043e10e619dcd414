// Validation and simulation of lowered schedules.
//
// Validate() proves a clock safe to run before anyone runs it. Its checks, in order:
//  1. shape: num_ranks rank clocks, a stage-to-rank map into [0, num_ranks), M >= 1;
//  2. every action names a stage in [0, S*V) and a micro-batch in [0, M), runs on the rank
//     its stage maps to, appears once, and every rank ends with exactly one STEP;
//  3. every (stage, micro-batch) has exactly one F and either one B or one I and one W, in
//     dependency order on their rank (F before B/I, I before W), and stages on the same rank
//     hand over in order (F of s-1 before F of s; B/I of s+1 before B/I of s);
//  4. communication is exactly what the stage-to-rank map requires: a SEND_F after each F
//     whose next stage is remote and a RECV_F before the consumer's F, a SEND_B after each
//     B/I whose previous stage is remote and a RECV_B before the consumer's B/I, and none
//     between stages on the same rank;
//  5. for every pair of ranks, the order of sends on one side equals the order of receives
//     on the other (NCCL matches point-to-point messages in issue order);
//  6. a simulation with blocking receives and non-blocking sends runs every clock to its
//     end (no deadlock). Termination does not depend on the costs.
// A refusal is INVALID_ARGUMENT whose message is a one-line reason naming the offending
// action(s), then the rank x position grid with each offending cell marked >like this<
// (deadlock: each stuck rank's next action). FAILED_PRECONDITION if the schedule is not
// lowered (run Lower first). Time and memory are linear in the number of actions plus
// S*V*M.
#ifndef BATON_COMMON_SCHEDULE_VALIDATE_H_
#define BATON_COMMON_SCHEDULE_VALIDATE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule/schedule.h"

namespace baton {

absl::Status Validate(const Schedule& s);

// Per-action durations, in any unit (the simulator reports in the same unit).
struct Costs {
  double f = 1;     // forward
  double i = 1;     // input-gradient backward
  double w = 1;     // weight-gradient backward
  double b = -1;    // full backward; negative means i + w
  double send = 0;  // issuing a send (non-blocking)
  double recv = 0;  // a receive, after its message was sent
  double step = 0;  // the optimizer step
  // Optional per-stage costs: when non-empty, per_stage[s] gives stage s's compute and
  // communication costs (its own per_stage is ignored) and must have S*V entries; step
  // stays the top-level one.
  std::vector<Costs> per_stage;

  double backward() const { return b < 0 ? i + w : b; }
};

// Parses "F=1,I=1,W=1" (keys F, B, I, W, SEND, RECV, STEP, case-insensitive; unnamed keys
// keep their defaults). Values must be finite and >= 0.
absl::StatusOr<Costs> ParseCosts(const std::string& text);

struct SimResult {
  double makespan = 0;      // when the last rank finishes
  double bubble_ratio = 0;  // idle rank-time / (S * makespan); 0 when makespan is 0
  // Per rank: the most (stage, micro-batch) pairs whose F has run and whose B (or W) has
  // not, i.e. activations held; chunks count separately under interleaving.
  std::vector<int> peak_inflight;
  std::vector<double> busy;  // per rank: time spent running actions (not waiting)
  struct Span {
    int rank = 0;
    Action action;
    double start = 0;
    double end = 0;
  };
  std::vector<Span> timeline;  // every action, per rank in clock order, ranks in order
};

// Validates `s` (all of Validate's checks, same errors) and simulates it: each rank runs
// its clock in order; an action starts when the previous one on its rank ended, a RECV
// not before its matching SEND ended, and lasts its cost. Sends never block.
// INVALID_ARGUMENT also for negative or non-finite costs or a per_stage of the wrong size.
absl::StatusOr<SimResult> Simulate(const Schedule& s, const Costs& costs = Costs());

}  // namespace baton

#endif  // BATON_COMMON_SCHEDULE_VALIDATE_H_
