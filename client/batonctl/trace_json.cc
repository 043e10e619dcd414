#include "client/batonctl/trace_json.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/schedule/action.h"

namespace baton::cli {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// The Chrome-trace thread of a rank's communication thread (stages use their numbers).
constexpr int kCommTid = 100000;

// Microseconds with nanosecond precision kept.
std::string Micros(int64_t ns) { return absl::StrFormat("%.3f", static_cast<double>(ns) / 1e3); }

}  // namespace

absl::StatusOr<std::string> ChromeTraceJson(const baton::v1::JobTrace& trace) {
  const int num_stages = trace.num_stages();
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const baton::v1::RankTrace& r : trace.ranks()) {
    origin = std::min<int64_t>(origin, r.start_unix_nanos());
  }
  std::vector<std::string> events;
  for (const baton::v1::RankTrace& r : trace.ranks()) {
    const int pid = r.rank();
    // The rank's stages: from the layout, else from the actions seen.
    std::set<int> stages;
    for (int s = 0; s < trace.stage_to_rank_size(); ++s) {
      if (trace.stage_to_rank(s) == r.rank()) stages.insert(s);
    }
    std::vector<std::string> body;
    bool comm = false;
    for (const baton::v1::ActionSpan& span : r.actions()) {
      absl::StatusOr<Action> a = Action::Parse(span.action());
      if (!a.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), ": action \"",
                                                       span.action(), "\": ", a.status().message()));
      }
      int stage = a->stage;
      if (!HasStage(a->kind)) {  // STEP, CLIP_GRAD: the rank's first stage's row
        stage = stages.empty() ? 0 : *stages.begin();
      } else {
        if (stage < 0 || (num_stages > 0 && stage >= num_stages)) {
          return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), ": action ",
                                                         span.action(), " names stage ", stage,
                                                         " of ", num_stages));
        }
        stages.insert(stage);
      }
      const std::string name = span.send_wait()   ? absl::StrCat("wait ", span.action())
                               : span.allreduce() ? absl::StrCat("all-reduce ", span.action())
                                                  : span.action();
      // All-reduces run on the rank's communication thread: a row of their own.
      const int tid = span.allreduce() ? kCommTid : stage;
      comm = comm || span.allreduce();
      std::string args = absl::StrCat("\"action\":", Quote(span.action()));
      if (HasStage(a->kind)) {
        absl::StrAppend(&args, ",\"stage\":", a->stage, ",\"microbatch\":", a->microbatch);
      }
      if (span.bytes() > 0) absl::StrAppend(&args, ",\"bytes\":", span.bytes());
      if (span.device_ns() > 0) {
        absl::StrAppend(&args, ",\"device_us\":", Micros(span.device_ns()));
      }
      const int64_t start = r.start_unix_nanos() - origin + span.start_ns();
      body.push_back(absl::StrCat(
          "{\"name\":", Quote(name), ",\"cat\":\"",
          span.send_wait() ? "send_wait" : span.allreduce() ? "allreduce" : NamesOf(a->kind).trace,
          "\",\"ph\":\"X\",\"ts\":", Micros(start), ",\"dur\":",
          Micros(std::max<int64_t>(0, span.end_ns() - span.start_ns())), ",\"pid\":", pid,
          ",\"tid\":", tid, ",\"args\":{", args, "}}"));
    }
    std::string process = absl::StrCat("rank ", r.rank());
    if (!r.worker_id().empty()) absl::StrAppend(&process, " (", r.worker_id(), ")");
    events.push_back(absl::StrCat("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", pid,
                                  ",\"args\":{\"name\":", Quote(process), "}}"));
    events.push_back(absl::StrCat("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", pid,
                                  ",\"args\":{\"sort_index\":", pid, "}}"));
    for (int s : stages) {
      events.push_back(absl::StrCat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", pid,
                                    ",\"tid\":", s, ",\"args\":{\"name\":\"stage ", s, "\"}}"));
      events.push_back(absl::StrCat("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":", pid,
                                    ",\"tid\":", s, ",\"args\":{\"sort_index\":", s, "}}"));
    }
    if (comm) {
      events.push_back(absl::StrCat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", pid,
                                    ",\"tid\":", kCommTid,
                                    ",\"args\":{\"name\":\"gradient all-reduce\"}}"));
      events.push_back(absl::StrCat("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":", pid,
                                    ",\"tid\":", kCommTid, ",\"args\":{\"sort_index\":",
                                    kCommTid, "}}"));
    }
    events.insert(events.end(), body.begin(), body.end());
  }
  std::string out = absl::StrCat(
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"job_id\":", Quote(trace.job_id()),
      ",\"step\":", trace.step(), ",\"schedule\":", Quote(trace.schedule()),
      ",\"num_stages\":", num_stages, ",\"ranks\":", trace.ranks_size(), "},\n\"traceEvents\":[\n");
  for (size_t i = 0; i < events.size(); ++i) {
    absl::StrAppend(&out, events[i], i + 1 < events.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

absl::Status WriteOutputFile(const std::string& path, const std::string& contents) {
  if (path == "-") {
    std::fwrite(contents.data(), 1, contents.size(), stdout);
    return std::fflush(stdout) == 0 ? absl::OkStatus()
                                    : absl::UnavailableError("cannot write to stdout");
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << contents;
    if (!out) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", path));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace baton::cli
