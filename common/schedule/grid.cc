// The rank x position grid printed with every refused clock.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/schedule/internal.h"

namespace baton::schedule_internal {
namespace {

constexpr int kContext = 6;      // columns shown either side of the marks
constexpr int kMaxColumns = 30;  // widest window
constexpr int kAllRowsUpTo = 16;

int64_t Key(int rank, int index) { return (static_cast<int64_t>(rank) << 32) | index; }

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string RenderGrid(const Schedule& s, const std::vector<GridMark>& marks) {
  const int num_rows = static_cast<int>(s.ranks.size());
  int longest = 0;
  for (const auto& clock : s.ranks) longest = std::max(longest, static_cast<int>(clock.size()));
  absl::flat_hash_set<int64_t> marked;
  for (const GridMark& m : marks) marked.insert(Key(m.rank, m.index));

  // The column window [lo, hi).
  int lo = 0;
  int hi = std::min(longest, kMaxColumns);
  if (!marks.empty() && longest > kMaxColumns) {
    int cmin = marks[0].index;
    int cmax = marks[0].index;
    for (const GridMark& m : marks) {
      cmin = std::min(cmin, m.index);
      cmax = std::max(cmax, m.index);
    }
    lo = std::max(0, cmin - kContext);
    hi = std::min(longest, cmax + kContext + 1);
    if (hi - lo > kMaxColumns) {
      lo = std::max(0, marks[0].index - kContext);
      hi = std::min(longest, lo + kMaxColumns);
    }
  }

  // The rows: all of them for small pipelines, else the marked ones and their neighbours.
  std::vector<bool> show(num_rows, num_rows <= kAllRowsUpTo);
  if (num_rows > kAllRowsUpTo) {
    if (marks.empty()) {
      for (int r = 0; r < kAllRowsUpTo; ++r) show[r] = true;
    }
    for (const GridMark& m : marks) {
      for (int r = m.rank - 1; r <= m.rank + 1; ++r) {
        if (r >= 0 && r < num_rows) show[r] = true;
      }
    }
  }

  std::vector<size_t> width(std::max(0, hi - lo), 0);
  for (int c = lo; c < hi; ++c) width[c - lo] = absl::StrCat(c).size();
  for (int r = 0; r < num_rows; ++r) {
    if (!show[r]) continue;
    for (int c = lo; c < hi && c < static_cast<int>(s.ranks[r].size()); ++c) {
      width[c - lo] = std::max(width[c - lo], s.ranks[r][c].ToString().size());
    }
  }
  const std::string row_label_example = absl::StrCat("rank ", num_rows - 1);
  const size_t label_width = row_label_example.size();

  std::string out;
  // Header: position numbers.
  out += Pad("", label_width);
  out += lo > 0 ? " ..." : "    ";
  for (int c = lo; c < hi; ++c) out += " " + Pad(absl::StrCat(c), width[c - lo]) + " ";
  out += "   (position in each rank's clock)\n";
  bool elided = false;
  for (int r = 0; r < num_rows; ++r) {
    if (!show[r]) {
      if (!elided) out += "  ...\n";
      elided = true;
      continue;
    }
    elided = false;
    const auto& clock = s.ranks[r];
    std::string line = Pad(absl::StrCat("rank ", r), label_width);
    line += lo > 0 && static_cast<int>(clock.size()) > 0 ? " ..." : "    ";
    for (int c = lo; c < hi; ++c) {
      if (c >= static_cast<int>(clock.size())) {
        line += std::string(width[c - lo] + 2, ' ');
        continue;
      }
      const std::string text = clock[c].ToString();
      if (marked.contains(Key(r, c))) {
        line += ">" + text + "<" + std::string(width[c - lo] - text.size(), ' ');
      } else {
        line += " " + Pad(text, width[c - lo]) + " ";
      }
    }
    if (static_cast<int>(clock.size()) > hi) line += " ...";
    for (const GridMark& m : marks) {
      if (m.rank == r && (m.index < lo || m.index >= hi) &&
          m.index < static_cast<int>(clock.size())) {
        absl::StrAppend(&line, "   marked outside this window: >", clock[m.index].ToString(),
                        "< at position ", m.index);
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

absl::Status ClockError(const Schedule& s, const std::string& reason,
                        const std::vector<GridMark>& marks) {
  return absl::InvalidArgumentError(absl::StrCat(reason, "\n", RenderGrid(s, marks)));
}

}  // namespace baton::schedule_internal
