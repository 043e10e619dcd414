// batonctl export: a job's trained weights as one safetensors file, from its checkpoints.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/trace_json.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/hf.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/backend.h"
#include "common/core/log_text.h"
#include "common/core/status.h"
#include "common/spec/spec.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "export";

constexpr char kUsage[] =
    "usage: batonctl export JOB [--step N] -o model.safetensors\n"
    "       batonctl export --from DIR/JOB [--step N] -o model.safetensors\n"
    "       batonctl export JOB --format hf [--step N] -o MODEL_DIR\n"
    "       batonctl export --from DIR/JOB --spec SPEC.json --format hf [--step N] -o MODEL_DIR\n"
    "       (--format hf also takes [--dtype bf16] [--base DIR|none])\n\n"
    "Writes the model's weights from a complete checkpoint (every file checked against its\n"
    "SHA-256) as one safetensors file, each parameter under its block-qualified name\n"
    "(\"block.3.attn.qkv.weight\"), readable by PyTorch and Hugging Face tools.\n"
    "JOB: the coordinator reads the checkpoint and sends it (the job's submitter or an\n"
    "admin only; the coordinator must see the checkpoint root). --from DIR/JOB: read a\n"
    "checkpoint directory mounted where batonctl runs.\n"
    "--format hf (a gpt or llama model): writes a Hugging Face transformers model directory\n"
    "instead, config.json and model.safetensors under transformers' names (float32), which\n"
    "AutoModelForCausalLM.from_pretrained(MODEL_DIR) loads; the model's shape comes from the\n"
    "job's spec (JOB) or from --spec SPEC.json (--from).\n"
    "--dtype bf16 writes the weights rounded to bfloat16 (half the bytes; a bf16 job's\n"
    "checkpoints keep float32 masters, which --dtype f32, the default, writes).\n"
    "A job that started from a Hugging Face model (init.from_hf) exports with what training\n"
    "did not change of it: GPT-2's position rows past the job's context, the imported\n"
    "context and config.json keys (bos/eos ids, ...), generation_config.json and the\n"
    "tokenizer files. --base DIR names that directory as seen here (default: init.from_hf\n"
    "when it is a directory here); --base none writes the trained model alone.";

// The weights to write and where they came from.
struct Exported {
  std::string bytes;   // the safetensors file (baton's names)
  baton::v1::JobSpec spec;  // with --format hf: the job's spec (its model and init)
  int64_t step = 0;    // the checkpoint's step
  std::string source;  // its directory
};

// --step, or -1 without it (the newest complete checkpoint). Only after CheckExport.
int64_t StepFlag(const Args& args) { return *args.GetInt("step", -1); }

bool HfFormat(const Args& args) { return args.Get("format") == "hf"; }

// --dtype bf16: the weights rounded to bfloat16 (nearest even); f32 (the default) as kept.
DType ExportDType(const Args& args) {
  return args.Get("dtype") == "bf16" ? DType::kBFloat16 : DType::kFloat32;
}

// The safetensors file `bytes` with every float32 tensor rounded to bf16.
absl::StatusOr<std::string> ToBf16File(const std::string& bytes) {
  BATON_ASSIGN_OR_RETURN(const Safetensors st, ParseSafetensors(bytes));
  std::vector<Tensor> tensors;
  tensors.reserve(st.order.size());
  std::vector<NamedTensor> named;
  for (const std::string& name : st.order) {
    BATON_ASSIGN_OR_RETURN(Tensor t, EntryToTensor(st.tensors.at(name), Device::kCpu));
    if (t.dtype() == DType::kFloat32) {
      Tensor b = Tensor::Empty(t.shape(), DType::kBFloat16);
      CpuBackend()->ToBf16(t.numel(), t.f32(), b.bf16());
      t = std::move(b);
    }
    tensors.push_back(std::move(t));
  }
  for (size_t i = 0; i < tensors.size(); ++i) named.push_back({st.order[i], &tensors[i]});
  return EncodeSafetensors(named, {{"format", "pt"}});
}

// The Hugging Face directory whose untrained rest the export keeps (HfExportOptions::
// base_dir): --base DIR; none with --base none; without --base, the job's init.from_hf when
// that is a directory here, and an error saying what to do when it is not (an export that
// silently dropped the imported positions and tokenizer would lose what the user gave).
absl::StatusOr<std::string> ExportBase(const Args& args, const baton::v1::JobSpec& spec) {
  if (args.Has("base")) return args.Get("base") == "none" ? std::string() : args.Get("base");
  if (!spec.init().has_from_hf()) return std::string();
  const std::string& from = spec.init().from_hf();
  std::error_code ec;
  if (std::filesystem::is_directory(from, ec)) return from;
  return absl::FailedPreconditionError(absl::StrCat(
      "the job started from the Hugging Face model '", EchoInput(from),
      "' (init.from_hf, under the workers' data root), which is not a directory here; the "
      "export keeps what training did not change (GPT-2's position rows past the context, "
      "the imported context and config keys, the tokenizer files): give --base DIR, that "
      "directory as seen here, or --base none to write the trained model alone"));
}

absl::Status CheckExport(const Args& args) {
  if (args.Has("format") && args.Get("format") != "hf" && args.Get("format") != "baton") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be baton or hf, got '", args.Get("format"), "'"));
  }
  if (!args.Has("output") || args.Get("output") == "-") {
    return absl::InvalidArgumentError(HfFormat(args)
                                          ? "-o DIR is required (the model directory to write)"
                                          : "-o FILE is required (the export is binary)");
  }
  if (args.Has("dtype") && args.Get("dtype") != "f32" && args.Get("dtype") != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be f32 or bf16, got '", args.Get("dtype"), "'"));
  }
  if (HfFormat(args) && args.Has("from") && !args.Has("spec")) {
    return absl::InvalidArgumentError(
        "--format hf with --from needs --spec SPEC.json (the model's shape)");
  }
  if (args.Has("base") && !HfFormat(args)) {
    return absl::InvalidArgumentError("--base goes with --format hf");
  }
  if (args.Has("spec") && !(HfFormat(args) && args.Has("from"))) {
    return absl::InvalidArgumentError("--spec goes with --from and --format hf");
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
  if (HfFormat(args)) {
    absl::StatusOr<Safetensors> st = ParseSafetensors(e.bytes);
    if (!st.ok()) return CommandFail(kCommand, std::string(st.status().message()));
    std::vector<Tensor> tensors;
    tensors.reserve(st->order.size());
    std::map<std::string, const Tensor*> by_name;
    for (const std::string& name : st->order) {
      absl::StatusOr<Tensor> t = EntryToTensor(st->tensors.at(name), Device::kCpu);
      if (!t.ok()) return CommandFail(kCommand, std::string(t.status().message()));
      tensors.push_back(*std::move(t));
      by_name[name] = &tensors.back();
    }
    absl::StatusOr<std::string> base = ExportBase(args, e.spec);
    if (!base.ok()) return CommandFail(kCommand, std::string(base.status().message()));
    if (absl::Status s = WriteHfModel(e.spec.model(), by_name, path,
                                      {.dtype = ExportDType(args), .base_dir = *base});
        !s.ok()) {
      return CommandFail(kCommand, std::string(s.message()));
    }
    std::fprintf(stderr,
                 "wrote %s/config.json and model.safetensors: the weights after step %lld from "
                 "%s, as a Hugging Face model%s\n",
                 path.c_str(), static_cast<long long>(e.step), e.source.c_str(),
                 base->empty() ? ""
                               : absl::StrCat(" (with what it did not train of ", *base,
                                              ": positions, config keys, tokenizer files)")
                                     .c_str());
    return 0;
  }
  std::string bytes = e.bytes;
  if (ExportDType(args) == DType::kBFloat16) {
    absl::StatusOr<std::string> b = ToBf16File(e.bytes);
    if (!b.ok()) return CommandFail(kCommand, std::string(b.status().message()));
    bytes = *std::move(b);
  }
  if (absl::Status s = WriteFileAtomically(path, bytes); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()));
  }
  std::fprintf(stderr, "wrote %s: the weights after step %lld from %s (%zu bytes)\n", path.c_str(),
               static_cast<long long>(e.step), e.source.c_str(), bytes.size());
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
  if (HfFormat(args)) {
    absl::StatusOr<baton::v1::JobSpec> spec = LoadJobSpecFile(args.Get("spec"));
    if (!spec.ok()) return CommandFail(kCommand, std::string(spec.status().message()));
    e.spec = *std::move(spec);
  }
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
  if (HfFormat(args)) {  // the model's shape, from the job's spec
    baton::v1::GetJobRequest get;
    get.set_job_id(args.positional()[0]);
    baton::v1::Job job;
    std::unique_ptr<grpc::ClientContext> get_ctx = c.Context();
    if (const grpc::Status st = c.stub().GetJob(get_ctx.get(), get, &job); !st.ok()) {
      return c.Fail(st);
    }
    e.spec = job.spec();
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
       "where JOB's are"},
      {"format", "", false,
       "baton (default: one safetensors file) or hf (a Hugging Face model directory)"},
      {"spec", "", false, "with --from and --format hf: the job's spec (the model's shape)"},
      {"dtype", "", false,
       "f32 (default: the float32 master weights) or bf16 (each rounded to bfloat16)"},
      {"base", "", false,
       "with --format hf: the Hugging Face directory the job started from (default: its "
       "init.from_hf when that is a directory here), or none"}};
  command.positional = Positional::kOwn;  // JOB, or none with --from
  command.default_timeout = absl::Minutes(10);
  command.output_file_help =
      "the safetensors file to write, or with --format hf the model directory (required)";
  command.check = CheckExport;
  command.offline = [](const Args& args) { return args.Has("from"); };
  command.run_offline = RunExportFromDir;
  command.run = RunExport;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
