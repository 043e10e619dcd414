// batonctl export: a job's trained weights as one safetensors file, from its checkpoints.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/trace_json.h"
#include "common/checkpoint/checkpoint.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "export";

constexpr char kUsage[] =
    "usage: batonctl export JOB [--step N] -o model.safetensors\n"
    "       batonctl export --from DIR/JOB [--step N] -o model.safetensors\n\n"
    "Writes the model's weights from a complete checkpoint (every file checked against its\n"
    "SHA-256) as one safetensors file, each parameter under its block-qualified name\n"
    "(\"block.3.attn.qkv.weight\"), readable by PyTorch and Hugging Face tools.\n"
    "JOB: the coordinator reads the checkpoint and sends it (the job's submitter or an\n"
    "admin only; the coordinator must see the checkpoint root). --from DIR/JOB: read a\n"
    "checkpoint directory mounted where batonctl runs.";

// The weights to write and where they came from.
struct Exported {
  std::string bytes;   // the safetensors file
  int64_t step = 0;    // the checkpoint's step
  std::string source;  // its directory
};

// --step, or -1 without it (the newest complete checkpoint). Only after CheckExport.
int64_t StepFlag(const Args& args) { return *args.GetInt("step", -1); }

absl::Status CheckExport(const Args& args) {
  if (!args.Has("output") || args.Get("output") == "-") {
    return absl::InvalidArgumentError("-o FILE is required (the export is binary)");
  }
  absl::StatusOr<int64_t> at = args.GetInt("step", -1);
  if (!at.ok()) return at.status();
  if (args.Has("step") && *at < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--step must be a step number, got ", *at));
  }
  if (args.Has("from") && !args.positional().empty()) {
    return absl::InvalidArgumentError("give JOB or --from, not both");
  }
  if (!args.Has("from") && args.positional().size() != 1) {
    return absl::InvalidArgumentError("wants one JOB id");
  }
  return absl::OkStatus();
}

// Writes the export to -o FILE and says so; returns the exit code.
int WriteExport(const Args& args, const Exported& e) {
  const std::string path = args.Get("output");
  if (absl::Status s = WriteFileAtomically(path, e.bytes); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()));
  }
  std::fprintf(stderr, "wrote %s: the weights after step %lld from %s (%zu bytes)\n", path.c_str(),
               static_cast<long long>(e.step), e.source.c_str(), e.bytes.size());
  return 0;
}

// --from DIR/JOB: the checkpoint read here, no coordinator.
int RunExportFromDir(const Args& args) {
  const std::string job_dir = args.Get("from");
  // Complete by the manifests' own block list: export needs no spec.
  std::vector<std::string> skipped;
  absl::StatusOr<int64_t> found = FindCheckpoint(job_dir, {}, StepFlag(args), &skipped);
  for (const std::string& why : skipped) {
    std::fprintf(stderr, "batonctl export: %s\n", why.c_str());
  }
  if (!found.ok()) return CommandFail(kCommand, std::string(found.status().message()));
  Exported e;
  e.step = *found;
  e.source = CheckpointStepDir(job_dir, e.step);
  absl::StatusOr<std::string> exported = ExportWeights(e.source);
  if (!exported.ok()) return CommandFail(kCommand, std::string(exported.status().message()));
  e.bytes = *std::move(exported);
  return WriteExport(args, e);
}

// JOB: the coordinator reads the checkpoint and streams the export.
int RunExport(const Args& args, const ClusterClient& c) {
  const int64_t at = StepFlag(args);
  baton::v1::ExportJobRequest req;
  req.set_job_id(args.positional()[0]);
  req.set_step(at > 0 ? at : 0);
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  std::unique_ptr<grpc::ClientReader<baton::v1::ExportChunk>> reader =
      c.stub().ExportJob(ctx.get(), req);
  baton::v1::ExportChunk chunk;
  Exported e;
  int64_t total = -1;
  while (reader->Read(&chunk)) {
    if (total < 0) {
      total = chunk.total_bytes();
      e.step = chunk.step();
      e.source = chunk.checkpoint_dir();
      e.bytes.reserve(static_cast<size_t>(std::max<int64_t>(total, 0)));
    }
    e.bytes += chunk.data();
  }
  if (const grpc::Status st = reader->Finish(); !st.ok()) return c.Fail(st);
  if (total != static_cast<int64_t>(e.bytes.size())) {
    return CommandFail(kCommand, absl::StrCat("the export ended after ", e.bytes.size(), " of ",
                                              total, " bytes"));
  }
  return WriteExport(args, e);
}

}  // namespace

int Export(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = kCommand;
  command.usage = kUsage;
  command.flags = {
      {"step", "", false, "the checkpoint's step (default: the newest complete one)"},
      {"from", "", false,
       "read the checkpoints in this directory (DIR/JOB) instead of asking the coordinator "
       "where JOB's are"}};
  command.positional = Positional::kOwn;  // JOB, or none with --from
  command.default_timeout = absl::Minutes(10);
  command.output_file_help = "the safetensors file to write (required)";
  command.check = CheckExport;
  command.offline = [](const Args& args) { return args.Has("from"); };
  command.run_offline = RunExportFromDir;
  command.run = RunExport;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
