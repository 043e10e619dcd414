// batonctl cancel: stop a job (queued or running); prints its state afterwards.
#include <cstdio>
#include <string>
#include <vector>

#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"

namespace baton::cli {
namespace {

int RunCancel(const Args& args, const ClusterClient& c) {
  baton::v1::CancelJobRequest req;
  req.set_job_id(args.positional()[0]);
  req.set_reason(args.Get("reason"));
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

}  // namespace

int Cancel(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = "cancel";
  command.usage = "usage: batonctl cancel JOB [--reason R] [--output text|json]";
  command.flags = {{"reason", "r", false, "why (recorded in the job's history)"}};
  command.run = RunCancel;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
