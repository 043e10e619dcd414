#include "client/batonctl/history_table.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace baton::cli {
namespace {

baton::v1::JobHistory TwoSteps() {
  baton::v1::JobHistory h;
  h.set_job_id("job-000003");
  baton::v1::StepProgress* a = h.add_steps();
  a->set_step(9);
  a->set_loss(3.6889f);
  a->set_samples_per_second(123.456);
  a->set_tokens_per_second(1975.296);
  a->mutable_duration()->set_nanos(64'800'000);
  baton::v1::StepProgress* b = h.add_steps();
  b->set_step(10);
  b->set_loss(0.1f);  // not exact in binary: the CSV keeps every digit a float has
  b->set_samples_per_second(12345.0);
  b->set_tokens_per_second(197520.0);
  b->mutable_duration()->set_seconds(1);
  b->mutable_duration()->set_nanos(500'000'000);
  b->set_learning_rate(3e-4f);
  b->set_grad_norm(1.5f);
  b->set_val_loss(2.25f);
  b->set_model_tflops(0.125);
  b->set_mfu(0.25);
  return h;
}

TEST(HistoryTableTest, TextColumnsAreRightAlignedUnderTheHeader) {
  const std::string text = HistoryText(TwoSteps());
  EXPECT_EQ(text,
            "STEP    LOSS  SAMPLES/S  TOKENS/S  SECONDS      LR  GRAD NORM  VAL LOSS  TFLOP/S    MFU\n"
            "   9  3.6889      123.5    1975.3    0.065       -          -         -    0.000      -\n"
            "  10  0.1000    12345.0  197520.0    1.500  0.0003     1.5000    2.2500    0.125  25.0%\n");
  // Every line as wide as the header.
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    EXPECT_EQ(line.size(), 87u) << line;
  }
}

TEST(HistoryTableTest, CsvHasAHeaderAndLossesThatReadBackExactly) {
  const baton::v1::JobHistory h = TwoSteps();
  const std::string csv = HistoryCsv(h);
  EXPECT_EQ(csv,
            "step,loss,samples_per_second,tokens_per_second,step_seconds,learning_rate,"
            "grad_norm,val_loss,model_tflops,mfu\n"
            "9,3.68889999,123.456,1975.296,0.064800,0,,,0.000000,\n"
            "10,0.100000001,12345.000,197520.000,1.500000,0.000300000014,1.5,2.25,0.125000,"
            "0.250000\n");
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> cells = absl::StrSplit(lines[i + 1], ',');
    ASSERT_EQ(cells.size(), 10u);
    EXPECT_EQ(std::strtof(cells[1].c_str(), nullptr), h.steps(i).loss());
  }
}

TEST(HistoryTableTest, NoStepsIsTheHeaderAlone) {
  baton::v1::JobHistory empty;
  EXPECT_EQ(HistoryCsv(empty),
            "step,loss,samples_per_second,tokens_per_second,step_seconds,learning_rate,"
            "grad_norm,val_loss,model_tflops,mfu\n");
  EXPECT_EQ(HistoryText(empty), "STEP  LOSS  SAMPLES/S  TOKENS/S  SECONDS  LR  GRAD NORM  VAL LOSS  TFLOP/S  MFU\n");
}

}  // namespace
}  // namespace baton::cli
