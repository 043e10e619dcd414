// batonctl trace: one step's action timeline on every rank, as Chrome trace-event JSON.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/trace_json.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "trace";

constexpr char kUsage[] =
    "usage: batonctl trace JOB [--step N] [-o trace.json]\n\n"
    "Writes one step's action timeline on every rank as Chrome trace-event JSON: open it\n"
    "in https://ui.perfetto.dev or chrome://tracing. One track per pipeline stage;\n"
    "compare with 'batonctl plan --output svg' for the predicted timeline.";

absl::Status CheckStep(const Args& args) {
  absl::StatusOr<int64_t> step = args.GetInt("step", 0);
  if (!step.ok()) return step.status();
  if (*step < 0 || (args.Has("step") && *step == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--step must be a 1-based step, got ", *step));
  }
  return absl::OkStatus();
}

int RunTrace(const Args& args, const ClusterClient& c) {
  baton::v1::GetJobTraceRequest req;
  req.set_job_id(args.positional()[0]);
  req.set_step(*args.GetInt("step", 0));  // CheckStep passed
  baton::v1::JobTrace trace;
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  if (const grpc::Status st = c.stub().GetJobTrace(ctx.get(), req, &trace); !st.ok()) {
    return c.Fail(st);
  }
  absl::StatusOr<std::string> json = ChromeTraceJson(trace);
  if (!json.ok()) return c.Fail(json.status());

  const std::string path = args.Get("output", "-");
  if (absl::Status s = WriteOutputFile(path, *json); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()));
  }
  if (path == "-") return 0;
  int actions = 0;
  for (const auto& r : trace.ranks()) actions += r.actions_size();
  std::fprintf(stderr, "wrote %s: %s step %lld, %d ranks, %d stages, %d events\n", path.c_str(),
               trace.job_id().c_str(), static_cast<long long>(trace.step()), trace.ranks_size(),
               trace.num_stages(), actions);
  return 0;
}

}  // namespace

int Trace(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = kCommand;
  command.usage = kUsage;
  command.flags = {
      {"step", "", false, "1-based step (default: the latest step every rank finished)"}};
  command.output_file_help = "file to write the trace to (default: stdout)";
  command.check = CheckStep;
  command.run = RunTrace;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
