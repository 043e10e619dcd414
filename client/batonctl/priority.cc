// batonctl priority: change a queued job's priority (admins); prints its place in the queue.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"

namespace baton::cli {
namespace {

absl::Status CheckPriority(const Args& args) {
  int32_t v = 0;
  if (!args.Has("set") || !absl::SimpleAtoi(args.Get("set"), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set N (an integer priority) is required, got '", args.Get("set"), "'"));
  }
  return absl::OkStatus();
}

int RunPriority(const Args& args, const ClusterClient& c) {
  baton::v1::SetJobPriorityRequest req;
  req.set_job_id(args.positional()[0]);
  int32_t v = 0;
  absl::SimpleAtoi(args.Get("set"), &v);  // CheckPriority passed
  req.set_priority(v);
  baton::v1::Job job;
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  if (const grpc::Status st = c.stub().SetJobPriority(ctx.get(), req, &job); !st.ok()) {
    return c.Fail(st);
  }
  if (c.json()) {
    std::fputs(ToJson(job, /*pretty=*/true).c_str(), stdout);
  } else {
    std::printf("%s %s, priority %d\n", job.id().c_str(), JobStateName(job.state()).c_str(),
                job.spec().priority());
  }
  return 0;
}

}  // namespace

int Priority(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = "priority";
  command.usage =
      "usage: batonctl priority JOB --set N [--output text|json]\n"
      "\n"
      "Sets a waiting job's priority (admins only); the queue reorders at once (higher\n"
      "first, equal priorities in submission order). `batonctl get JOB` shows its place.";
  command.flags = {{"set", "", false, "the new priority (an integer)"}};
  command.check = CheckPriority;
  command.run = RunPriority;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
