// batonctl submit: send a job spec to the coordinator; prints the job id (or the Job as
// JSON) and, with --watch, watches it to the end.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/init_from_hf.h"
#include "common/checkpoint/hf.h"
#include "common/core/status.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "submit";

std::vector<FlagSpec> SubmitFlags() {
  return {
      {"file", "f", false, "job spec (JSON, protobuf JSON mapping of baton.v1.JobSpec)"},
      {"name", "", false, "override the spec's name"},
      {"steps", "", false, "override the spec's steps"},
      {"seed", "", false, "override the spec's seed"},
      {"schedule", "s", false,
       absl::StrCat("override the schedule: ", ScheduleNames(),
                    ", or auto (the coordinator's auto-planner chooses; --microbatches 0 leaves "
                    "M to it too)")},
      {"stages", "", false, "override pipeline.stages"},
      {"virtual", "", false, "override pipeline.virtual_stages"},
      {"microbatches", "m", false, "override pipeline.microbatches"},
      {"data-parallel", "", false, "override pipeline.data_parallel (replicas of the pipeline)"},
      {"shard-optimizer", "", true,
       "shard the optimizer state across the data-parallel replicas (optimizer.shard; needs "
       "--data-parallel 2 or more)"},
      {"recompute", "", false,
       "override pipeline.recompute: none, or full (rerun each forward before its backward)"},
      {"recompute-stages", "", false,
       "with --recompute full (or the spec's): only these stages recompute, e.g. 0,1 "
       "(pipeline.recompute_stages)"},
      {"partition", "", false,
       "blocks per pipeline chunk in stage order, e.g. 3,2,2,1 (pipeline.partition; default: "
       "the FLOP-balanced split)"},
      {"reduce-mode", "", false,
       "override pipeline.reduce_mode: ordered (bit-exact, the default) or fast (the engine's "
       "ring)"},
      {"collective", "", false, "override pipeline.collective_engine: auto, gloo or nccl"},
      {"device", "", false, "override the device: cpu, cuda or auto"},
      {"transport", "", false, "override the transport: grpc, nccl or auto"},
      {"precision", "", false,
       "override the arithmetic: fp32, or bf16 (mixed precision; docs/precision.md)"},
      {"allow-tf32", "", true, "let an fp32 job's products on GPUs use TF32 (allow_tf32)"},
      {"attention", "", false,
       "override the attention kernels: materialised, fused, tiled (bf16 jobs) or auto (the "
       "workers' BATON_FUSED_ATTENTION; docs/precision.md)"},
      {"priority", "", false,
       "queue priority, higher first (JobSpec.priority; your role bounds it)"},
      {"resume-from", "", false,
       "start from JOB's checkpoint: JOB (its newest complete one) or JOB@STEP; without -f, "
       "with JOB's spec"},
      {"init-from-hf", "", false,
       "start from the weights of a Hugging Face GPT-2 or LLaMA model directory "
       "(init.from_hf); a spec without a model takes it from DIR/config.json"},
      {"eval-only", "", true,
       "train nothing: the validation loss of the initial weights (eval.only; needs "
       "data.tokens.val)"},
      {"submission-id", "", false,
       "idempotency key: submitting again with it returns the first job"},
      {"watch", "w", true, "then watch the job to the end (exit 0 only if it succeeds)"},
  };
}

constexpr char kUsage[] =
    "usage: batonctl submit -f SPEC.json [--steps N] [--seed S] [--schedule NAME]\n"
    "                       [--resume-from JOB[@STEP]] [--init-from-hf DIR] [--eval-only]\n"
    "                       [--stages N] [--virtual N] [--microbatches N] [--name X]\n"
    "                       [--recompute none|full] [--recompute-stages S,S...]\n"
    "                       [--data-parallel D] [--shard-optimizer]\n"
    "                       [--reduce-mode ordered|fast] [--collective auto|gloo|nccl]\n"
    "                       [--device cpu|cuda|auto] [--transport grpc|nccl|auto]\n"
    "                       [--precision fp32|bf16] [--allow-tf32] [--priority N]\n"
    "                       [--attention materialised|fused|tiled|auto]\n"
    "                       [--submission-id ID] [--watch] [--output text|json]\n"
    "\n"
    "Submits the job; prints its id (text) or the Job (json). The coordinator fills the\n"
    "defaults and validates the spec: a bad spec is refused with INVALID_ARGUMENT naming\n"
    "the field.\n"
    "\n"
    "--resume-from JOB[@STEP] starts from JOB's checkpoint (its newest complete one, or the\n"
    "one after STEP) and trains the remaining steps; without -f it reuses JOB's spec, so the\n"
    "result equals the run JOB would have finished, bit for bit. Overrides apply on top\n"
    "(another --schedule or --stages loads the same checkpoint).\n"
    "\n"
    "--init-from-hf DIR starts from a Hugging Face transformers model (config.json and\n"
    "model.safetensors or a sharded index; GPT-2 or LLaMA) instead of the seed's weights.\n"
    "Workers read DIR under their --data_root (a relative DIR is taken under it). When DIR\n"
    "is readable here too, a spec without a model gets the model of DIR/config.json, and a\n"
    "spec with one is checked against it before submitting.\n"
    "\n"
    "--eval-only measures the initial weights (--init-from-hf, --resume-from, or the seed's)\n"
    "on the validation split (data.tokens.val, eval.batches batches) and trains nothing: the\n"
    "job's one step is the evaluation; its loss is the validation loss.";

absl::StatusOr<baton::v1::Schedule> ParseSchedule(const std::string& text) {
  // "auto": the coordinator's auto-planner chooses at placement (SCHEDULE_AUTO).
  if (absl::AsciiStrToLower(text) == "auto") return baton::v1::SCHEDULE_AUTO;
  absl::StatusOr<const ScheduleEntry*> e = FindScheduleEntry(text);
  baton::v1::Schedule parsed;
  if (e.ok() && (*e)->spec_value != 0) return static_cast<baton::v1::Schedule>((*e)->spec_value);
  // The enum's own spelling, SCHEDULE_ZB_H1, as in a JSON spec.
  if (baton::v1::Schedule_Parse(absl::AsciiStrToUpper(text), &parsed) &&
      parsed != baton::v1::SCHEDULE_UNSPECIFIED) {
    return parsed;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--schedule must be one of ", ScheduleNames(), ", auto, got '", text, "'"));
}

// Reads an int32 override; semantic checks (>= 1, ...) are the coordinator's.
absl::Status Int32Flag(const Args& args, const std::string& name, int32_t* out) {
  if (!args.Has(name)) return absl::OkStatus();
  absl::StatusOr<int64_t> v = args.GetInt(name, 0);
  if (!v.ok()) return v.status();
  if (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " is out of range: ", *v));
  }
  *out = static_cast<int32_t>(*v);
  return absl::OkStatus();
}

// Applies the command-line overrides to `spec`.
// --name WORD, for a flag whose words each name one value of an enum: sets it with `set`;
// INVALID_ARGUMENT listing the words for any other.
template <typename E>
absl::Status WordFlag(const Args& args, const std::string& name,
                      const std::vector<std::pair<std::string, E>>& words,
                      const std::function<void(E)>& set) {
  if (!args.Has(name)) return absl::OkStatus();
  const std::string got = args.Get(name);
  std::vector<std::string> known;
  for (const auto& [word, value] : words) {
    if (word == got) {
      set(value);
      return absl::OkStatus();
    }
    known.push_back(word);
  }
  const std::string last = known.back();
  known.pop_back();
  return absl::InvalidArgumentError(absl::StrCat("--", name, " must be ",
                                                 absl::StrJoin(known, ", "), " or ", last,
                                                 ", got '", got, "'"));
}

absl::Status ApplyOverrides(const Args& args, baton::v1::JobSpec* spec) {
  if (args.Has("name")) spec->set_name(args.Get("name"));
  if (args.Get("eval-only") == "true") spec->mutable_eval()->set_only(true);
  if (args.Has("seed")) {
    absl::StatusOr<int64_t> seed = args.GetInt("seed", 0);
    if (!seed.ok()) return seed.status();
    if (*seed < 0) return absl::InvalidArgumentError("--seed must be >= 0");
    spec->set_seed(static_cast<uint64_t>(*seed));
  }
  int32_t v = 0;
  if (args.Has("steps")) {
    if (absl::Status s = Int32Flag(args, "steps", &v); !s.ok()) return s;
    spec->set_steps(v);
  }
  baton::v1::PipelineSpec* p = spec->mutable_pipeline();
  if (args.Has("schedule")) {
    absl::StatusOr<baton::v1::Schedule> s = ParseSchedule(args.Get("schedule"));
    if (!s.ok()) return s.status();
    p->set_schedule(*s);
  }
  if (args.Has("stages")) {
    if (absl::Status s = Int32Flag(args, "stages", &v); !s.ok()) return s;
    p->set_stages(v);
  }
  if (args.Has("virtual")) {
    if (absl::Status s = Int32Flag(args, "virtual", &v); !s.ok()) return s;
    p->set_virtual_stages(v);
  }
  if (args.Has("microbatches")) {
    if (absl::Status s = Int32Flag(args, "microbatches", &v); !s.ok()) return s;
    p->set_microbatches(v);
  }
  if (args.Has("data-parallel")) {
    if (absl::Status s = Int32Flag(args, "data-parallel", &v); !s.ok()) return s;
    // In the spec 0 means "unset" (1), as for every count; on the command line it is a
    // mistake.
    if (v < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data-parallel (pipeline.data_parallel) must be at least 1, got ", v));
    }
    p->set_data_parallel(v);
  }
  // The word-valued flags: each word names one enum value.
  BATON_RETURN_IF_ERROR(WordFlag<baton::v1::Recompute>(
      args, "recompute", {{"none", baton::v1::RECOMPUTE_NONE}, {"full", baton::v1::RECOMPUTE_FULL}},
      [p](baton::v1::Recompute v) { p->set_recompute(v); }));
  // A comma-separated list of integers into a repeated field.
  auto int_list = [&args](const char* flag, const char* what,
                          google::protobuf::RepeatedField<int32_t>* out) -> absl::Status {
    if (!args.Has(flag)) return absl::OkStatus();
    out->Clear();
    for (absl::string_view part : absl::StrSplit(args.Get(flag), ',')) {
      int32_t v = 0;
      if (!absl::SimpleAtoi(part, &v)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be ", what,
                                                       " separated by commas, got '",
                                                       args.Get(flag), "'"));
      }
      out->Add(v);
    }
    return absl::OkStatus();
  };
  BATON_RETURN_IF_ERROR(
      int_list("recompute-stages", "stage numbers", p->mutable_recompute_stages()));
  BATON_RETURN_IF_ERROR(int_list("partition", "block counts", p->mutable_partition()));
  BATON_RETURN_IF_ERROR(WordFlag<baton::v1::ReduceMode>(
      args, "reduce-mode",
      {{"ordered", baton::v1::REDUCE_MODE_ORDERED}, {"fast", baton::v1::REDUCE_MODE_FAST}},
      [p](baton::v1::ReduceMode v) { p->set_reduce_mode(v); }));
  BATON_RETURN_IF_ERROR(WordFlag<baton::v1::CollectiveEngine>(
      args, "collective",
      {{"auto", baton::v1::COLLECTIVE_ENGINE_AUTO},
       {"gloo", baton::v1::COLLECTIVE_ENGINE_GLOO},
       {"nccl", baton::v1::COLLECTIVE_ENGINE_NCCL}},
      [p](baton::v1::CollectiveEngine v) { p->set_collective_engine(v); }));
  BATON_RETURN_IF_ERROR(WordFlag<baton::v1::DeviceKind>(
      args, "device",
      {{"cpu", baton::v1::DEVICE_KIND_CPU},
       {"cuda", baton::v1::DEVICE_KIND_CUDA},
       {"auto", baton::v1::DEVICE_KIND_UNSPECIFIED}},
      [spec](baton::v1::DeviceKind v) { spec->set_device(v); }));
  BATON_RETURN_IF_ERROR(WordFlag<baton::v1::TransportKind>(
      args, "transport",
      {{"grpc", baton::v1::TRANSPORT_KIND_GRPC},
       {"nccl", baton::v1::TRANSPORT_KIND_NCCL},
       {"auto", baton::v1::TRANSPORT_KIND_UNSPECIFIED}},
      [spec](baton::v1::TransportKind v) { spec->set_transport(v); }));
  BATON_RETURN_IF_ERROR(WordFlag<baton::v1::Precision>(
      args, "precision",
      {{"fp32", baton::v1::PRECISION_FP32}, {"bf16", baton::v1::PRECISION_BF16}},
      [spec](baton::v1::Precision v) { spec->set_precision(v); }));
  if (args.Has("attention")) {
    BATON_ASSIGN_OR_RETURN(const baton::v1::AttentionKernel a,
                           ParseAttentionKernel(args.Get("attention")));
    spec->set_attention(a);
  }
  if (args.Has("allow-tf32")) spec->set_allow_tf32(true);
  if (args.Has("shard-optimizer")) spec->mutable_optimizer()->set_shard(true);
  if (args.Has("priority")) {
    if (absl::Status s = Int32Flag(args, "priority", &v); !s.ok()) return s;
    spec->set_priority(v);
  }
  return absl::OkStatus();
}

// "JOB" or "JOB@STEP".
absl::StatusOr<baton::v1::ResumeFrom> ParseResumeFromJob(const std::string& arg) {
  baton::v1::ResumeFrom from;
  const size_t at = arg.rfind('@');
  from.set_job_id(arg.substr(0, at));
  if (at != std::string::npos) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(arg.substr(at + 1), &step) || step < 1) {
      return absl::InvalidArgumentError("--resume-from " + arg +
                                        ": STEP after @ must be a step number (1 or more)");
    }
    from.set_step(step);
  }
  if (from.job_id().empty()) return absl::InvalidArgumentError("--resume-from needs JOB[@STEP]");
  return from;
}

// Before connecting: a spec or a job to resume from, and a well-formed --resume-from.
absl::Status CheckSubmit(const Args& args) {
  if (!args.Has("file") && !args.Has("resume-from")) {
    return absl::InvalidArgumentError("missing -f SPEC.json (or --resume-from JOB)");
  }
  if (!args.Has("resume-from")) return absl::OkStatus();
  return ParseResumeFromJob(args.Get("resume-from")).status();
}

// Prints the submitted job: its id (and, while it waits for placement, why), or the Job
// as JSON.
void PrintSubmitted(const ClusterClient& c, baton::v1::Job job, bool watch) {
  if (c.json()) {
    // With --watch the output is JSON lines: the Job, then one JobEvent per line.
    std::fputs(ToJson(job, /*pretty=*/!watch).c_str(), stdout);
    if (watch) std::fputc('\n', stdout);
  } else {
    std::printf("%s\n", job.id().c_str());
    // A job that cannot be placed at once says why (e.g. too few idle GPU workers): the
    // coordinator places in the background, so look again for up to a second.
    for (int i = 0; i < 10 && job.state() == baton::v1::JOB_STATE_QUEUED; ++i) {
      if (job.history_size() > 1) break;  // the placement attempt has spoken
      absl::SleepFor(absl::Milliseconds(100));
      baton::v1::GetJobRequest get;
      get.set_job_id(job.id());
      baton::v1::Job again;
      std::unique_ptr<grpc::ClientContext> ctx = c.Context();
      if (!c.stub().GetJob(ctx.get(), get, &again).ok()) break;
      job = std::move(again);
    }
    if (job.state() == baton::v1::JOB_STATE_QUEUED && !job.history().empty()) {
      std::fprintf(stderr, "%s queued: %s\n", job.id().c_str(),
                   job.history().rbegin()->reason().c_str());
    }
  }
}

int RunSubmit(const Args& args, const ClusterClient& c) {
  const bool resume = args.Has("resume-from");
  baton::v1::ResumeFrom from;
  if (resume) from = *ParseResumeFromJob(args.Get("resume-from"));  // CheckSubmit passed
  absl::StatusOr<baton::v1::JobSpec> spec;
  if (args.Has("file")) {
    spec = LoadJobSpecFile(args.Get("file"));
  } else {
    // The spec of the job resumed from, as the coordinator stored it (defaults filled in).
    baton::v1::GetJobRequest get;
    get.set_job_id(from.job_id());
    baton::v1::Job source;
    std::unique_ptr<grpc::ClientContext> ctx = c.Context();
    if (const grpc::Status st = c.stub().GetJob(ctx.get(), get, &source); !st.ok()) {
      return c.Fail(st);
    }
    spec = source.spec();
  }
  if (!spec.ok()) return c.Fail(spec.status());
  if (resume) *spec->mutable_resume_from() = from;
  if (absl::Status s = ApplyOverrides(args, &*spec); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()), 2);
  }
  if (absl::Status s = ApplyInitFromHf(args, &*spec); !s.ok()) {
    return CommandFail(kCommand, std::string(s.message()), 2);
  }

  baton::v1::SubmitJobRequest req;
  req.set_submission_id(args.Get("submission-id"));
  *req.mutable_spec() = *std::move(spec);
  baton::v1::Job job;
  const bool watch = args.Get("watch") == "true";
  {
    std::unique_ptr<grpc::ClientContext> ctx = c.Context();
    const grpc::Status st = c.stub().SubmitJob(ctx.get(), req, &job);
    if (!st.ok()) return c.Fail(st);
  }
  PrintSubmitted(c, job, watch);
  std::fflush(stdout);
  if (!watch) return 0;
  // --timeout bounds each RPC; the watch stream gets 24h unless --timeout is longer.
  return WatchUntilDone(c, job.id(), std::max(c.timeout(), absl::Hours(24)));
}

}  // namespace

int Submit(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = kCommand;
  command.usage = kUsage;
  command.flags = SubmitFlags();
  command.positional = Positional::kNone;
  command.check = CheckSubmit;
  command.run = RunSubmit;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli
