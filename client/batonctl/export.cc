// batonctl export: a job's trained weights as one safetensors file, from its checkpoints.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/trace_json.h"
#include "common/checkpoint/checkpoint.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "export";

std::vector<FlagSpec> Flags() {
  std::vector<FlagSpec> flags = WithClusterFlags(
      {{"step", "", false, "the checkpoint's step (default: the newest complete one)"},
       {"from", "", false,
        "read the checkpoints in this directory (DIR/JOB) instead of asking the coordinator "
        "where JOB's are"}});
  for (FlagSpec& f : flags) {
    if (f.name == "output") f.help = "the safetensors file to write (required)";
  }
  return flags;
}

}  // namespace

int Export(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = Flags();
  absl::StatusOr<Args> args = Args::Parse(argv, flags);
  if (!args.ok()) return CommandFail(kCommand, std::string(args.status().message()), 2);
  if (args->Has("help")) {
    std::printf(
        "usage: batonctl export JOB [--step N] -o model.safetensors\n"
        "       batonctl export --from DIR/JOB [--step N] -o model.safetensors\n\n"
        "Writes the model's weights from a complete checkpoint (every file checked against its\n"
        "SHA-256) as one safetensors file, each parameter under its block-qualified name\n"
        "(\"block.3.attn.qkv.weight\"), readable by PyTorch and Hugging Face tools. Needs the\n"
        "job's checkpoint directory (spec checkpoint.dir) mounted where batonctl runs.\n\n%s",
        FlagHelp(flags).c_str());
    return 0;
  }
  if (!args->Has("output") || args->Get("output") == "-") {
    return CommandFail(kCommand, "-o FILE is required (the export is binary)", 2);
  }
  absl::StatusOr<int64_t> at = args->GetInt("step", -1);
  if (!at.ok()) return CommandFail(kCommand, std::string(at.status().message()), 2);
  if (args->Has("step") && *at < 0) {
    return CommandFail(kCommand, absl::StrCat("--step must be a step number, got ", *at), 2);
  }
  std::string job_dir;
  if (args->Has("from")) {
    if (!args->positional().empty()) {
      return CommandFail(kCommand, "give JOB or --from, not both", 2);
    }
    job_dir = args->Get("from");
  } else {
    if (args->positional().size() != 1) return CommandFail(kCommand, "wants one JOB id", 2);
    absl::StatusOr<std::unique_ptr<ClusterClient>> client =
        ClusterClient::Create(kCommand, *args, absl::Seconds(10), /*output_is_format=*/false);
    if (!client.ok()) return CommandFail(kCommand, std::string(client.status().message()), 2);
    const ClusterClient& c = **client;
    baton::v1::GetJobRequest req;
    req.set_job_id(args->positional()[0]);
    baton::v1::Job job;
    std::unique_ptr<grpc::ClientContext> ctx = c.Context();
    if (const grpc::Status st = c.stub().GetJob(ctx.get(), req, &job); !st.ok()) return c.Fail(st);
    if (!job.spec().has_checkpoint()) {
      return CommandFail(kCommand,
                         absl::StrCat(job.id(), " has no checkpoints (its spec sets none)"));
    }
    job_dir = CheckpointJobDir(job.spec().checkpoint().dir(), job.id());
  }
  // Complete by the manifests' own block list: export needs no spec.
  std::vector<std::string> skipped;
  absl::StatusOr<int64_t> step = FindCheckpoint(job_dir, {}, *at, &skipped);
  for (const std::string& why : skipped) {
    std::fprintf(stderr, "batonctl export: %s\n", why.c_str());
  }
  if (!step.ok()) return CommandFail(kCommand, std::string(step.status().message()));
  absl::StatusOr<std::string> bytes = ExportWeights(CheckpointStepDir(job_dir, *step));
  if (!bytes.ok()) return CommandFail(kCommand, std::string(bytes.status().message()));
  const std::string path = args->Get("output");
  if (absl::Status s = WriteFileAtomically(path, *bytes); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()));
  }
  std::fprintf(stderr, "wrote %s: the weights after step %lld from %s (%zu bytes)\n", path.c_str(),
               static_cast<long long>(*step), job_dir.c_str(), bytes->size());
  return 0;
}

}  // namespace baton::cli
