// batonctl workers: the workers the coordinator knows, with state, job and last heartbeat.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/commands.h"
#include "common/rpc/rpc.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "workers";

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>(WithClusterFlags({}));
  return *flags;
}

std::string Ago(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  const double s = absl::ToDoubleSeconds(absl::Now() - FromProtoTime(t));
  return absl::StrFormat("%.1fs ago", s < 0 ? 0.0 : s);
}

}  // namespace

int Workers(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(argv, Flags());
  if (!args.ok()) return CommandFail(kCommand, std::string(args.status().message()), 2);
  if (args->Has("help")) {
    std::printf("usage: batonctl workers [--output text|json]\n\n%s", FlagHelp(Flags()).c_str());
    return 0;
  }
  if (!args->positional().empty()) {
    return CommandFail(kCommand, "unexpected argument '" + args->positional()[0] + "'", 2);
  }
  absl::StatusOr<std::unique_ptr<ClusterClient>> client =
      ClusterClient::Create(kCommand, *args, absl::Seconds(10));
  if (!client.ok()) return CommandFail(kCommand, std::string(client.status().message()), 2);
  const ClusterClient& c = **client;

  baton::v1::ListWorkersResponse resp;
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  if (const grpc::Status st = c.stub().ListWorkers(ctx.get(), {}, &resp); !st.ok()) {
    return c.Fail(st);
  }
  if (c.json()) {
    std::fputs(ToJson(resp, /*pretty=*/true).c_str(), stdout);
    return 0;
  }
  if (resp.workers().empty()) {
    std::printf("no workers\n");
    return 0;
  }
  std::printf("%-12s %-22s %-6s %-14s %-14s %s\n", "WORKER", "ADDRESS", "STATE", "JOB",
              "HEARTBEAT", "DEVICE");
  for (const baton::v1::WorkerInfo& w : resp.workers()) {
    const baton::v1::DeviceInfo& d = w.device();
    std::string device = d.kind();
    if (d.kind() == "cuda") device += ":" + std::to_string(d.index());
    std::vector<std::string> details;
    if (!d.name().empty()) details.push_back(d.name());
    if (d.memory_bytes() > 0) {
      details.push_back(std::to_string((d.memory_bytes() + (1 << 29)) >> 30) + " GiB");
    }
    if (!d.compute_capability().empty()) details.push_back("sm " + d.compute_capability());
    if (!details.empty()) device += " (" + absl::StrJoin(details, ", ") + ")";
    std::printf("%-12s %-22s %-6s %-14s %-14s %s\n", w.worker_id().c_str(), w.address().c_str(),
                WorkerStateName(w.state()).c_str(), w.job_id().empty() ? "-" : w.job_id().c_str(),
                Ago(w.last_heartbeat()).c_str(), device.empty() ? "-" : device.c_str());
  }
  return 0;
}

}  // namespace baton::cli
