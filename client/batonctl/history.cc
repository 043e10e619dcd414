// batonctl history: a job's loss and throughput, one row per step, from the coordinator's
// record (JobService.GetJobHistory, every page).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/history_table.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "history";

constexpr char kUsage[] =
    "usage: batonctl history JOB [--csv] [--output text|json]\n\n"
    "Prints the job's loss, samples/s, tokens/s, seconds, learning rate, gradient norm,\n"
    "validation loss, model TFLOP/s and MFU of every step it reported, in step order (a\n"
    "step trained again after a recovery shows its last run).\n"
    "--csv: step,loss,samples_per_second,tokens_per_second,step_seconds,learning_rate,\n"
    "grad_norm,val_loss,model_tflops,mfu, floats with every digit, empty cells where a\n"
    "step has no value.";

int RunHistory(const Args& args, const ClusterClient& c) {
  const bool csv = args.Get("csv") == "true";
  if (csv && c.json()) {
    return CommandFail(kCommand, "--csv and --output json exclude each other", 2);
  }

  // Every page, into one JobHistory (next_from_step 0).
  baton::v1::JobHistory all;
  baton::v1::GetJobHistoryRequest req;
  req.set_job_id(args.positional()[0]);
  for (;;) {
    baton::v1::JobHistory page;
    std::unique_ptr<grpc::ClientContext> ctx = c.Context();
    if (const grpc::Status st = c.stub().GetJobHistory(ctx.get(), req, &page); !st.ok()) {
      return c.Fail(st);
    }
    all.set_job_id(page.job_id());
    for (baton::v1::StepProgress& s : *page.mutable_steps()) *all.add_steps() = std::move(s);
    if (page.next_from_step() == 0) break;
    if (page.next_from_step() <= req.from_step()) {
      return CommandFail(kCommand,
                         absl::StrCat("the coordinator's next page starts at step ",
                                      page.next_from_step(), ", not after step ", req.from_step()));
    }
    req.set_from_step(page.next_from_step());
  }

  if (c.json()) {
    std::fputs(ToJson(all, /*pretty=*/true).c_str(), stdout);
  } else if (csv) {
    std::fputs(HistoryCsv(all).c_str(), stdout);
  } else if (all.steps().empty()) {
    std::printf("%s: no steps reported\n", all.job_id().c_str());
  } else {
    std::fputs(HistoryText(all).c_str(), stdout);
  }
  return 0;
}

}  // namespace

int History(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = kCommand;
  command.usage = kUsage;
  command.flags = {{"csv", "", true, "CSV with a header line instead of the table"}};
  command.run = RunHistory;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
