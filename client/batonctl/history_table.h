// What `batonctl history` prints: one row per step of a job's history (baton.v1.JobHistory,
// from JobService.GetJobHistory), in the order given.
//
// Columns: step, loss, samples/s, tokens/s, the step's seconds, then the learning rate,
// the gradient norm before clipping, the validation loss, model TFLOP/s and MFU.
//   Text: a header, then right-aligned columns as wide as their widest cell (losses with 4
//   decimals as `batonctl get` shows them, throughput with 1, seconds with 3, the rate in
//   %.3g, MFU in percent); "-" where a step has no value (no clipping, no evaluation that
//   step, an unknown device peak).
//   CSV:  the header "step,loss,samples_per_second,tokens_per_second,step_seconds,
//   learning_rate,grad_norm,val_loss,model_tflops,mfu", then one line per step; losses,
//   the norm and the rate with 9 significant digits (they read back as the same float),
//   throughput with 3 decimals, seconds with 6, MFU as a fraction; an empty cell where a
//   step has no value.
#ifndef BATON_CLIENT_BATONCTL_HISTORY_TABLE_H_
#define BATON_CLIENT_BATONCTL_HISTORY_TABLE_H_

#include <string>

#include "baton/v1/jobs.pb.h"

namespace baton::cli {

std::string HistoryText(const baton::v1::JobHistory& history);
std::string HistoryCsv(const baton::v1::JobHistory& history);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_HISTORY_TABLE_H_
