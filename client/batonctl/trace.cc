// batonctl trace: one step's action timeline on every rank, as Chrome trace-event JSON.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/trace_json.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "trace";

std::vector<FlagSpec> Flags() {
  std::vector<FlagSpec> flags = WithClusterFlags(
      {{"step", "", false, "1-based step (default: the latest step every rank finished)"}});
  for (FlagSpec& f : flags) {
    if (f.name == "output") f.help = "file to write the trace to (default: stdout)";
  }
  return flags;
}

}  // namespace

int Trace(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = Flags();
  absl::StatusOr<Args> args = Args::Parse(argv, flags);
  if (!args.ok()) return CommandFail(kCommand, std::string(args.status().message()), 2);
  if (args->Has("help")) {
    std::printf(
        "usage: batonctl trace JOB [--step N] [-o trace.json]\n\n"
        "Writes one step's action timeline on every rank as Chrome trace-event JSON: open it\n"
        "in https://ui.perfetto.dev or chrome://tracing. One track per pipeline stage;\n"
        "compare with 'batonctl plan --output svg' for the predicted timeline.\n\n%s",
        FlagHelp(flags).c_str());
    return 0;
  }
  if (args->positional().size() != 1) return CommandFail(kCommand, "wants one JOB id", 2);
  absl::StatusOr<int64_t> step = args->GetInt("step", 0);
  if (!step.ok()) return CommandFail(kCommand, std::string(step.status().message()), 2);
  if (*step < 0 || (args->Has("step") && *step == 0)) {
    return CommandFail(kCommand, absl::StrCat("--step must be a 1-based step, got ", *step), 2);
  }
  absl::StatusOr<std::unique_ptr<ClusterClient>> client =
      ClusterClient::Create(kCommand, *args, absl::Seconds(10), /*output_is_format=*/false);
  if (!client.ok()) return CommandFail(kCommand, std::string(client.status().message()), 2);
  const ClusterClient& c = **client;

  baton::v1::GetJobTraceRequest req;
  req.set_job_id(args->positional()[0]);
  req.set_step(*step);
  baton::v1::JobTrace trace;
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  if (const grpc::Status st = c.stub().GetJobTrace(ctx.get(), req, &trace); !st.ok()) {
    return c.Fail(st);
  }
  absl::StatusOr<std::string> json = ChromeTraceJson(trace);
  if (!json.ok()) return c.Fail(json.status());

  const std::string path = args->Get("output", "-");
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

}  // namespace baton::cli
