#include "client/batonctl/history_table.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::cli {
namespace {

constexpr int kColumns = 10;
constexpr char kCsvHeader[] =
    "step,loss,samples_per_second,tokens_per_second,step_seconds,learning_rate,grad_norm,"
    "val_loss,model_tflops,mfu";

double Seconds(const google::protobuf::Duration& d) {
  return static_cast<double>(d.seconds()) + static_cast<double>(d.nanos()) * 1e-9;
}

}  // namespace

std::string HistoryText(const baton::v1::JobHistory& history) {
  std::vector<std::array<std::string, kColumns>> rows;
  rows.reserve(history.steps_size() + 1);
  rows.push_back({"STEP", "LOSS", "SAMPLES/S", "TOKENS/S", "SECONDS", "LR", "GRAD NORM",
                  "VAL LOSS", "TFLOP/S", "MFU"});
  for (const baton::v1::StepProgress& s : history.steps()) {
    rows.push_back({absl::StrCat(s.step()), absl::StrFormat("%.4f", s.loss()),
                    absl::StrFormat("%.1f", s.samples_per_second()),
                    absl::StrFormat("%.1f", s.tokens_per_second()),
                    absl::StrFormat("%.3f", Seconds(s.duration())),
                    s.learning_rate() > 0 ? absl::StrFormat("%.3g", s.learning_rate()) : "-",
                    s.has_grad_norm() ? absl::StrFormat("%.4f", s.grad_norm()) : "-",
                    s.has_val_loss() ? absl::StrFormat("%.4f", s.val_loss()) : "-",
                    absl::StrFormat("%.3f", s.model_tflops()),
                    s.mfu() > 0 ? absl::StrFormat("%.1f%%", 100 * s.mfu()) : "-"});
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
  std::string out = absl::StrCat(kCsvHeader, "\n");
  auto optional = [](bool has, float v) { return has ? absl::StrFormat("%.9g", v) : ""; };
  for (const baton::v1::StepProgress& s : history.steps()) {
    absl::StrAppendFormat(&out, "%d,%.9g,%.3f,%.3f,%.6f,%.9g,%s,%s,%.6f,%s\n", s.step(), s.loss(),
                          s.samples_per_second(), s.tokens_per_second(), Seconds(s.duration()),
                          s.learning_rate(), optional(s.has_grad_norm(), s.grad_norm()),
                          optional(s.has_val_loss(), s.val_loss()), s.model_tflops(),
                          s.mfu() > 0 ? absl::StrFormat("%.6f", s.mfu()) : "");
  }
  return out;
}

}  // namespace baton::cli
