// batonctl cancel: stop a job (queued or running); prints its state afterwards.
#include <cstdio>
#include <string>
#include <vector>

#include "baton/v1/jobs.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/commands.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "cancel";

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>(WithClusterFlags({
      {"reason", "r", false, "why (recorded in the job's history)"},
  }));
  return *flags;
}

}  // namespace

int Cancel(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(argv, Flags());
  if (!args.ok()) return CommandFail(kCommand, std::string(args.status().message()), 2);
  if (args->Has("help")) {
    std::printf("usage: batonctl cancel JOB [--reason R] [--output text|json]\n\n%s",
                FlagHelp(Flags()).c_str());
    return 0;
  }
  if (args->positional().size() != 1) return CommandFail(kCommand, "wants one JOB id", 2);
  absl::StatusOr<std::unique_ptr<ClusterClient>> client =
      ClusterClient::Create(kCommand, *args, absl::Seconds(10));
  if (!client.ok()) return CommandFail(kCommand, std::string(client.status().message()), 2);
  const ClusterClient& c = **client;

  baton::v1::CancelJobRequest req;
  req.set_job_id(args->positional()[0]);
  req.set_reason(args->Get("reason"));
  baton::v1::Job job;
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  if (const grpc::Status st = c.stub().CancelJob(ctx.get(), req, &job); !st.ok()) {
    return c.Fail(st);
  }
  if (c.json()) {
    std::fputs(ToJson(job, /*pretty=*/true).c_str(), stdout);
  } else {
    const std::string reason = job.history().empty() ? "" : job.history().rbegin()->reason();
    std::printf("%s %s%s%s\n", job.id().c_str(), JobStateName(job.state()).c_str(),
                reason.empty() ? "" : ": ", reason.c_str());
  }
  return 0;
}

}  // namespace baton::cli
