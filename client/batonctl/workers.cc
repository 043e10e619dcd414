// batonctl workers: the workers the coordinator knows, with state, job, last heartbeat,
// matrix kernels and device.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "common/rpc/rpc.h"

namespace baton::cli {
namespace {

std::string Ago(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  const double s = absl::ToDoubleSeconds(absl::Now() - FromProtoTime(t));
  return absl::StrFormat("%.1fs ago", s < 0 ? 0.0 : s);
}

// "cuda:0 (NVIDIA H100, 80 GiB, sm 9.0)", "cpu", or "-".
std::string DeviceText(const baton::v1::DeviceInfo& d) {
  std::string device = d.kind();
  if (d.kind() == "cuda") device += ":" + std::to_string(d.index());
  std::vector<std::string> details;
  if (!d.name().empty()) details.push_back(d.name());
  if (d.memory_bytes() > 0) {
    details.push_back(std::to_string((d.memory_bytes() + (1 << 29)) >> 30) + " GiB");
  }
  if (!d.compute_capability().empty()) details.push_back("sm " + d.compute_capability());
  if (d.threads() > 0)
    details.push_back(absl::StrCat(d.threads(), d.threads() == 1 ? " thread" : " threads"));
  if (!details.empty()) device += " (" + absl::StrJoin(details, ", ") + ")";
  return device.empty() ? "-" : device;
}

// "OpenBLAS 0.3.21, SkylakeX kernels; bf16 products oneDNN 2.6.3 on AMX-BF16": the
// registered description without its " (chosen by ...)" parts (--output json has them).
std::string KernelsText(const baton::v1::DeviceInfo& d) {
  if (d.kernels().empty()) return "-";
  std::string out;
  int depth = 0;
  const std::string& k = d.kernels();
  for (size_t i = 0; i < k.size(); ++i) {
    if (depth == 0 && k.compare(i, 2, " (") == 0) {
      depth = 1;
      ++i;
      continue;
    }
    if (depth > 0) {
      depth += k[i] == '(' ? 1 : k[i] == ')' ? -1 : 0;
      continue;
    }
    out += k[i];
  }
  return out;
}

int RunWorkers(const Args& args, const ClusterClient& c) {
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
  std::printf("%-12s %-22s %-6s %-14s %-14s %s\n", "WORKER", "ADDRESS", "STATE", "JOB", "HEARTBEAT",
              "DEVICE / KERNELS");
  for (const baton::v1::WorkerInfo& w : resp.workers()) {
    std::printf("%-12s %-22s %-6s %-14s %-14s %s\n", w.worker_id().c_str(), w.address().c_str(),
                WorkerStateName(w.state()).c_str(), w.job_id().empty() ? "-" : w.job_id().c_str(),
                Ago(w.last_heartbeat()).c_str(), DeviceText(w.device()).c_str());
    if (!w.device().kernels().empty()) {
      std::printf("%-12s %-22s %-6s %-14s %-14s %s\n", "", "", "", "", "",
                  KernelsText(w.device()).c_str());
    }
  }
  return 0;
}

}  // namespace

int Workers(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = "workers";
  command.usage = "usage: batonctl workers [--output text|json]";
  command.positional = Positional::kNone;
  command.run = RunWorkers;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
