#include "common/schedule/vocabulary.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/schedule/generators.h"

namespace baton {

const std::vector<ScheduleEntry>& ScheduleTable() {
  static const auto* table = new std::vector<ScheduleEntry>{
      {ScheduleKind::kGpipe, "gpipe", {}, 1, ChunkPlacement::kOne, false, 0,
       [](int s, int, int m) { return GenerateGpipe(s, m); }, "(S-1)/(M+S-1)",
       "M on every rank"},
      {ScheduleKind::k1F1B, "1f1b", {"pipedream-flush"}, 2, ChunkPlacement::kOne, false, 0,
       [](int s, int, int m) { return Generate1F1B(s, m); }, "(S-1)/(M+S-1)",
       "min(S-r, M) on rank r"},
      {ScheduleKind::kInterleaved1F1B, "interleaved-1f1b", {"interleaved"}, 3,
       ChunkPlacement::kLooped, false, 0,
       [](int s, int v, int m) { return GenerateInterleaved1F1B(s, v, m); }, "(S-1)/(V*M+S-1)",
       "min((S-r-1)*2 + (V-1)*S + 1, V*M) chunks on rank r"},
      {ScheduleKind::kZbH1, "zb-h1", {"zbh1"}, 4, ChunkPlacement::kOne, true, 0,
       [](int s, int, int m) { return GenerateZbH1(s, m); },
       "(S-1)(F+I-W) idle per rank: (S-1)/(3M+S-1) with unit costs", "min(S-r, M) on rank r"},
      {ScheduleKind::kZbV, "zb-v", {"zbv"}, 5, ChunkPlacement::kV, true, 1,
       [](int s, int, int m) { return GenerateZbV(s, m); },
       "near 0 for M >= 2S with unit costs (measured by plan)",
       "at most 2S half-size chunks per rank: 1F1B's activation memory"},
      {ScheduleKind::kVHalf, "v-half", {"vhalf"}, 6, ChunkPlacement::kV, true, 1,
       [](int s, int, int m) { return GenerateVHalf(s, m); },
       "above zb-v's: traded for memory (measured by plan)",
       "at most S+1 half-size chunks per rank: (S+1)/(2S) of 1F1B's"},
      {ScheduleKind::kDualPipeV, "dualpipe-v", {"dualpipev"}, 8, ChunkPlacement::kV, true, 2,
       [](int s, int, int m) { return GenerateDualPipeV(s, m); },
       "S-1 idle per rank with unit costs: (S-1)/(6M+S-1)",
       "at most 2S+1 half-size chunks per rank: 1F1B's and one chunk more"},
      {ScheduleKind::kCustom, "custom", {}, 0, ChunkPlacement::kLooped, false, 0, nullptr,
       "as simulated", "as simulated"},
  };
  return *table;
}

const ScheduleEntry& ScheduleEntryOf(ScheduleKind kind) {
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (e.kind == kind) return e;
  }
  return ScheduleTable().back();  // unreachable: every kind has an entry (tested)
}

absl::StatusOr<const ScheduleEntry*> FindScheduleEntry(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
  std::replace(n.begin(), n.end(), '_', '-');
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (n == e.name || std::find(e.aliases.begin(), e.aliases.end(), n) != e.aliases.end()) {
      return &e;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule '", name,
                                                 "' (known: ", ScheduleNames(true), ")"));
}

absl::StatusOr<const ScheduleEntry*> ScheduleEntryForSpecValue(int value) {
  if (value == 0) return &ScheduleEntryOf(ScheduleKind::k1F1B);
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (e.spec_value == value) return &e;
  }
  return absl::InvalidArgumentError(absl::StrCat("pipeline.schedule: unknown schedule ", value,
                                                 " (known: ", ScheduleNames(), ")"));
}

std::string ScheduleNames(bool with_custom) {
  std::vector<std::string> names;
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (e.kind != ScheduleKind::kCustom || with_custom) names.push_back(e.name);
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace baton
