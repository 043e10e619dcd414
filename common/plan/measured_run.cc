#include "common/plan/measured_run.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/core/status.h"
#include "common/schedule/action.h"

namespace baton {
namespace {

struct Mean {
  double sum = 0;
  int n = 0;
  void Add(double v) {
    sum += v;
    ++n;
  }
  double Get(double otherwise) const { return n > 0 ? sum / n : otherwise; }
};

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

}  // namespace

absl::StatusOr<Costs> CostsFromTrace(const baton::v1::JobTrace& trace) {
  const int stages = trace.num_stages();
  if (stages < 1) return absl::InvalidArgumentError("the trace names no stages");
  std::vector<Mean> f(stages), b(stages), i(stages), w(stages), send(stages);
  std::vector<double> recv(stages, std::numeric_limits<double>::infinity());
  Mean step;
  for (const baton::v1::RankTrace& r : trace.ranks()) {
    for (const baton::v1::ActionSpan& span : r.actions()) {
      if (span.send_wait() || span.allreduce()) continue;
      absl::StatusOr<Action> a = Action::Parse(span.action());
      if (!a.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), ": action \"",
                                                       span.action(), "\": ",
                                                       a.status().message()));
      }
      const double wall = Ms(span.end_ns() - span.start_ns());
      const double took = span.device_ns() > 0 ? Ms(span.device_ns()) : wall;
      if (a->kind == ActionKind::kStep) {
        step.Add(took);
        continue;
      }
      if (a->stage < 0 || a->stage >= stages) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), ": action ",
                                                       span.action(), " names stage ",
                                                       a->stage, " of ", stages));
      }
      const int s = a->stage;
      switch (a->kind) {
        case ActionKind::kForward: f[s].Add(took); break;
        case ActionKind::kBackward: b[s].Add(took); break;
        case ActionKind::kBackwardInput: i[s].Add(took); break;
        case ActionKind::kBackwardWeight: w[s].Add(took); break;
        case ActionKind::kSendF:
        case ActionKind::kSendB: send[s].Add(wall); break;
        case ActionKind::kRecvF:
        case ActionKind::kRecvB: recv[s] = std::min(recv[s], wall); break;
        default: break;
      }
    }
  }
  Costs out;
  out.step = step.Get(0);
  out.per_stage.resize(stages);
  for (int s = 0; s < stages; ++s) {
    if (f[s].n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the trace has no forward of stage ", s, " to take its costs from"));
    }
    Costs& c = out.per_stage[s];
    c.f = f[s].Get(0);
    if (b[s].n > 0) {
      c.b = b[s].Get(0);
      c.i = i[s].Get(c.b / 2);
      c.w = w[s].Get(c.b / 2);
    } else {
      c.i = i[s].Get(0);
      c.w = w[s].Get(0);
      c.b = -1;  // I + W
    }
    c.send = send[s].Get(0);
    c.recv = std::isinf(recv[s]) ? 0 : recv[s];
    c.step = out.step;
  }
  // The top-level compute costs: the stages' means (per_stage is what the simulator uses).
  out.f = out.per_stage[0].f;
  out.i = out.per_stage[0].i;
  out.w = out.per_stage[0].w;
  out.b = out.per_stage[0].b;
  return out;
}

int64_t MicrobatchRows(const baton::v1::Job& job) {
  const baton::v1::PipelineReport& p = job.pipeline();
  if (p.microbatches() < 1) return 0;
  return job.spec().data().batch_size() /
         (static_cast<int64_t>(std::max(1, p.data_parallel())) * p.microbatches());
}

absl::StatusOr<MeasuredRun> MeasuredRunFromJob(const baton::v1::Job& job,
                                               const baton::v1::JobTrace& trace) {
  const baton::v1::PipelineReport& p = job.pipeline();
  if (p.stage_blocks().empty() || p.microbatches() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job.id(), " has no pipeline report (never placed)"));
  }
  if (trace.num_stages() != p.stage_blocks_size()) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.id(), "'s trace has ",
                                                   trace.num_stages(), " stages, its report ",
                                                   p.stage_blocks_size()));
  }
  MeasuredRun out;
  BATON_ASSIGN_OR_RETURN(out.costs, CostsFromTrace(trace));
  for (const std::string& range : p.stage_blocks()) {
    std::vector<std::string> ends = absl::StrSplit(range, '-');
    int first = 0, last = 0;
    if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &first) ||
        !absl::SimpleAtoi(ends[1], &last) || first > last) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", job.id(), ": stage blocks \"", range, "\" do not parse"));
    }
    out.stage_blocks.push_back(BlockRange{first, last + 1});
  }
  out.rows = MicrobatchRows(job);
  out.source = absl::StrCat("job ", job.id(), " step ", trace.step(), " (", p.schedule(),
                            ", ", p.stages(), " stages, M=", p.microbatches(), ")");
  return out;
}

}  // namespace baton
