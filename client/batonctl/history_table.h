// What `batonctl history` prints: one row per step of a job's history (baton.v1.JobHistory,
// from JobService.GetJobHistory), in the order given.
//
// Columns: step, loss, samples/s, tokens/s and the step's seconds.
//   Text: a header, then right-aligned columns as wide as their widest cell (loss with 4
//   decimals as `batonctl get` shows it, throughput with 1, seconds with 3).
//   CSV:  the header "step,loss,samples_per_second,tokens_per_second,step_seconds", then one
//   line per step; the loss with 9 significant digits (it reads back as the same float),
//   throughput with 3 decimals, seconds with 6.
#ifndef BATON_CLIENT_BATONCTL_HISTORY_TABLE_H_
#define BATON_CLIENT_BATONCTL_HISTORY_TABLE_H_

#include <string>

#include "baton/v1/jobs.pb.h"

namespace baton::cli {

std::string HistoryText(const baton::v1::JobHistory& history);
std::string HistoryCsv(const baton::v1::JobHistory& history);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_HISTORY_TABLE_H_
