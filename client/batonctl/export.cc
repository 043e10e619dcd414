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
        "(\"block.3.attn.qkv.weight\"), readable by PyTorch and Hugging Face tools.\n"
        "JOB: the coordinator reads the checkpoint and sends it (the job's submitter or an\n"
        "admin only; the coordinator must see the checkpoint root). --from DIR/JOB: read a\n"
        "checkpoint directory mounted where batonctl runs.\n\n%s",
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
  if (args->Has("from") && !args->positional().empty()) {
    return CommandFail(kCommand, "give JOB or --from, not both", 2);
  }
  std::string bytes, source;
  int64_t step = 0;
  if (args->Has("from")) {
    const std::string job_dir = args->Get("from");
    // Complete by the manifests' own block list: export needs no spec.
    std::vector<std::string> skipped;
    absl::StatusOr<int64_t> found = FindCheckpoint(job_dir, {}, *at, &skipped);
    for (const std::string& why : skipped) {
      std::fprintf(stderr, "batonctl export: %s\n", why.c_str());
    }
    if (!found.ok()) return CommandFail(kCommand, std::string(found.status().message()));
    step = *found;
    source = CheckpointStepDir(job_dir, step);
    absl::StatusOr<std::string> exported = ExportWeights(source);
    if (!exported.ok()) return CommandFail(kCommand, std::string(exported.status().message()));
    bytes = *std::move(exported);
  } else {
    if (args->positional().size() != 1) return CommandFail(kCommand, "wants one JOB id", 2);
    absl::StatusOr<std::unique_ptr<ClusterClient>> client =
        ClusterClient::Create(kCommand, *args, absl::Minutes(10), /*output_is_format=*/false);
    if (!client.ok()) return CommandFail(kCommand, std::string(client.status().message()), 2);
    const ClusterClient& c = **client;
    baton::v1::ExportJobRequest req;
    req.set_job_id(args->positional()[0]);
    req.set_step(*at > 0 ? *at : 0);
    std::unique_ptr<grpc::ClientContext> ctx = c.Context();
    std::unique_ptr<grpc::ClientReader<baton::v1::ExportChunk>> reader =
        c.stub().ExportJob(ctx.get(), req);
    baton::v1::ExportChunk chunk;
    int64_t total = -1;
    while (reader->Read(&chunk)) {
      if (total < 0) {
        total = chunk.total_bytes();
        step = chunk.step();
        source = chunk.checkpoint_dir();
        bytes.reserve(static_cast<size_t>(std::max<int64_t>(total, 0)));
      }
      bytes += chunk.data();
    }
    if (const grpc::Status st = reader->Finish(); !st.ok()) return c.Fail(st);
    if (total != static_cast<int64_t>(bytes.size())) {
      return CommandFail(kCommand, absl::StrCat("the export ended after ", bytes.size(), " of ",
                                                total, " bytes"));
    }
  }
  const std::string path = args->Get("output");
  if (absl::Status s = WriteFileAtomically(path, bytes); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()));
  }
  std::fprintf(stderr, "wrote %s: the weights after step %lld from %s (%zu bytes)\n", path.c_str(),
               static_cast<long long>(step), source.c_str(), bytes.size());
  return 0;
}

}  // namespace baton::cli
