#include "client/batonctl/history_table.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::cli {
namespace {

constexpr int kColumns = 5;

double Seconds(const google::protobuf::Duration& d) {
  return static_cast<double>(d.seconds()) + static_cast<double>(d.nanos()) * 1e-9;
}

}  // namespace

std::string HistoryText(const baton::v1::JobHistory& history) {
  std::vector<std::array<std::string, kColumns>> rows;
  rows.reserve(history.steps_size() + 1);
  rows.push_back({"STEP", "LOSS", "SAMPLES/S", "TOKENS/S", "SECONDS"});
  for (const baton::v1::StepProgress& s : history.steps()) {
    rows.push_back({absl::StrCat(s.step()), absl::StrFormat("%.4f", s.loss()),
                    absl::StrFormat("%.1f", s.samples_per_second()),
                    absl::StrFormat("%.1f", s.tokens_per_second()),
                    absl::StrFormat("%.3f", Seconds(s.duration()))});
  }
  std::array<size_t, kColumns> width{};
  for (const auto& row : rows) {
    for (int c = 0; c < kColumns; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (int c = 0; c < kColumns; ++c) {
      absl::StrAppend(&out, c == 0 ? "" : "  ", std::string(width[c] - row[c].size(), ' '), row[c]);
    }
    out += '\n';
  }
  return out;
}

std::string HistoryCsv(const baton::v1::JobHistory& history) {
  std::string out = "step,loss,samples_per_second,tokens_per_second,step_seconds\n";
  for (const baton::v1::StepProgress& s : history.steps()) {
    absl::StrAppendFormat(&out, "%d,%.9g,%.3f,%.3f,%.6f\n", s.step(), s.loss(),
                          s.samples_per_second(), s.tokens_per_second(), Seconds(s.duration()));
  }
  return out;
}

}  // namespace baton::cli
