#include "client/batonctl/measured_costs.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton::cli {

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
