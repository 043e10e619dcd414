#include "client/batonctl/measured_costs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/schedule/action.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton::cli {
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

absl::StatusOr<baton::v1::JobTrace> JobTraceFromChromeJson(const std::string& json,
                                                           const std::string& what) {
  google::protobuf::Struct doc;
  if (!google::protobuf::util::JsonStringToMessage(json, &doc).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not JSON"));
  }
  const auto& fields = doc.fields();
  if (!fields.contains("traceEvents") || !fields.contains("otherData")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": not a baton trace (want traceEvents and otherData, as batonctl trace writes)"));
  }
  const auto& other = fields.at("otherData").struct_value().fields();
  baton::v1::JobTrace out;
  if (other.contains("num_stages")) {
    out.set_num_stages(static_cast<int>(other.at("num_stages").number_value()));
  }
  if (other.contains("job_id")) out.set_job_id(other.at("job_id").string_value());
  if (other.contains("step")) out.set_step(static_cast<int64_t>(other.at("step").number_value()));
  if (other.contains("schedule")) out.set_schedule(other.at("schedule").string_value());
  std::map<int, baton::v1::RankTrace> ranks;
  for (const auto& v : fields.at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    if (!e.contains("ph") || e.at("ph").string_value() != "X") continue;
    if (!e.contains("args") || !e.at("args").struct_value().fields().contains("action")) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": an event without args.action"));
    }
    const auto& args = e.at("args").struct_value().fields();
    const int pid = static_cast<int>(e.at("pid").number_value());
    baton::v1::RankTrace& r = ranks[pid];
    r.set_rank(pid);
    baton::v1::ActionSpan* span = r.add_actions();
    span->set_action(args.at("action").string_value());
    const double ts_us = e.at("ts").number_value(), dur_us = e.at("dur").number_value();
    span->set_start_ns(static_cast<int64_t>(ts_us * 1e3));
    span->set_end_ns(static_cast<int64_t>((ts_us + dur_us) * 1e3));
    const std::string cat = e.contains("cat") ? e.at("cat").string_value() : "";
    span->set_send_wait(cat == "send_wait");
    span->set_allreduce(cat == "allreduce");
    if (args.contains("bytes")) span->set_bytes(static_cast<int64_t>(args.at("bytes").number_value()));
    if (args.contains("device_us")) {
      span->set_device_ns(static_cast<int64_t>(args.at("device_us").number_value() * 1e3));
    }
  }
  if (ranks.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no action events"));
  for (auto& [pid, r] : ranks) *out.add_ranks() = std::move(r);
  return out;
}

}  // namespace baton::cli
