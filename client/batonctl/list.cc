// batonctl list: jobs, newest first, one line each (or the ListJobsResponse as JSON).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "list";
// --all stops after this many pages, whatever the server says.
constexpr int kMaxPages = 10000;

absl::Status CheckPageSize(const Args& args) {
  absl::StatusOr<int64_t> page_size = args.GetInt("page-size", 0);
  if (!page_size.ok()) return page_size.status();
  if (*page_size < 0 || *page_size > 1000) {
    return absl::InvalidArgumentError("--page-size must be in [1, 1000]");
  }
  return absl::OkStatus();
}

int RunList(const Args& args, const ClusterClient& c) {
  const int64_t page_size = *args.GetInt("page-size", 0);  // CheckPageSize passed
  const bool all = args.Get("all") == "true";

  baton::v1::ListJobsResponse out;
  std::string token = args.Get("page-token");
  for (int page = 0; page < kMaxPages; ++page) {
    baton::v1::ListJobsRequest req;
    req.set_page_size(static_cast<int32_t>(page_size));
    req.set_page_token(token);
    baton::v1::ListJobsResponse resp;
    std::unique_ptr<grpc::ClientContext> ctx = c.Context();
    if (const grpc::Status st = c.stub().ListJobs(ctx.get(), req, &resp); !st.ok()) {
      return c.Fail(st);
    }
    for (baton::v1::Job& j : *resp.mutable_jobs()) *out.add_jobs() = std::move(j);
    out.set_next_page_token(resp.next_page_token());
    if (!all || resp.next_page_token().empty() || resp.next_page_token() == token) break;
    token = resp.next_page_token();
  }
  if (all) out.clear_next_page_token();

  if (c.json()) {
    std::fputs(ToJson(out, /*pretty=*/true).c_str(), stdout);
    return 0;
  }
  if (out.jobs().empty()) {
    std::printf("no jobs\n");
    return 0;
  }
  std::printf("%-14s %-10s %-11s %-8s %-19s %s\n", "ID", "STATE", "STEP", "LOSS", "CREATED",
              "NAME");
  for (const baton::v1::Job& j : out.jobs()) {
    const std::string step = absl::StrCat(j.steps_done(), "/", j.spec().steps());
    const std::string loss = j.steps_done() > 0 ? absl::StrFormat("%.4f", j.last_loss()) : "-";
    std::printf("%-14s %-10s %-11s %-8s %-19s %s", j.id().c_str(),
                JobStateName(j.state()).c_str(), step.c_str(), loss.c_str(),
                FormatDateTime(j.create_time()).c_str(), j.spec().name().c_str());
    // A waiting job: its place in the queue (1: placed next) and why it waits.
    if (j.queue_position() > 0) {
      std::printf("%s[#%d, priority %d: %s]", j.spec().name().empty() ? "" : "  ",
                  j.queue_position(), j.spec().priority(), j.wait_reason().c_str());
    }
    std::printf("\n");
  }
  if (!out.next_page_token().empty()) {
    std::fprintf(stderr, "(more jobs: --all, or --page-token %s)\n",
                 out.next_page_token().c_str());
  }
  return 0;
}

}  // namespace

int List(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = kCommand;
  command.usage = "usage: batonctl list [--page-size N] [--all] [--output text|json]";
  command.flags = {
      {"page-size", "", false, "jobs per page (server default 50, at most 1000)"},
      {"page-token", "", false, "continue from a previous page's next_page_token"},
      {"all", "a", true, "every job: follow next_page_token to the end"},
  };
  command.positional = Positional::kNone;
  command.check = CheckPageSize;
  command.run = RunList;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
