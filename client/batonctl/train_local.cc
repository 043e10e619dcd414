// batonctl train-local: train a job in this process, with the reference trainer or, with
// --pipeline, as a pipeline of stage threads running the job's schedule.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "baton/v1/training.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/init_from_hf.h"
#include "client/batonctl/trace_json.h"
#include "common/checkpoint/checkpoint.h"
#include "common/core/backend.h"
#include "common/core/blas_kernels.h"
#include "common/core/cuda_context.h"
#include "common/core/file.h"
#include "common/pipeline/local_pipeline.h"
#include "common/pipeline/step_trace.h"
#include "common/plan/planner.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"

namespace baton::cli {
namespace {

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"file", "f", false, "job spec (JSON, protobuf JSON mapping of baton.v1.JobSpec)"},
      {"steps", "", false, "override the spec's steps"},
      {"seed", "", false, "override the spec's seed"},
      {"pipeline", "", true, "run the spec's pipeline schedule on stage threads"},
      {"schedule-csv", "", false, "with --pipeline: run this clock (PyTorch CSV) instead"},
      {"trace", "", false,
       "with --pipeline: write the last step's timeline here (Chrome trace-event JSON)"},
      {"blas-threads", "", false, "CPU GEMM threads (default 1; results do not depend on it)"},
      {"device", "", false,
       "cpu, cuda or cuda:N (default: the spec's device; auto is cuda when a GPU is visible)"},
      {"resume-from", "", false,
       "resume from a checkpoint: DIR/JOB (its newest complete one) or DIR/JOB@STEP"},
      {"job-id", "", false, "the job name checkpoints are written under (default local)"},
      {"precision", "", false, "override the arithmetic: fp32 or bf16 (docs/precision.md)"},
      {"attention", "", false,
       "override the attention kernels: materialised, fused, tiled (bf16) or auto "
       "(BATON_FUSED_ATTENTION; docs/precision.md)"},
      {"init-from-hf", "", false,
       "start from this Hugging Face model directory (init.from_hf); a spec without a model "
       "takes it from DIR/config.json"},
      {"eval-only", "", true,
       "train nothing: the validation loss and perplexity of the initial weights (eval.only; "
       "needs data.tokens.val)"},
      {"output", "o", false, "text (default) or json"},
      {"help", "h", true, "show this help"},
  };
  return *flags;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "batonctl train-local: %s\n", what.c_str());
  return 1;
}

std::string Describe(const baton::v1::JobSpec& spec) { return DescribeModel(spec.model()); }

// What the training loop needs from either trainer.
struct Runner {
  baton::v1::JobSpec spec;  // validated, with defaults
  std::function<absl::StatusOr<StepStats>()> step;
  std::function<absl::StatusOr<std::vector<Digest>>()> digests;
  std::function<int64_t()> parameters;
  std::function<absl::Status(const std::string& job_dir, const std::string& job)> save;
  std::function<absl::Status(const std::string& step_dir)> load;
  std::function<int64_t()> steps_done;
  std::function<absl::StatusOr<float>()> evaluate;  // the validation loss, no step
  std::string data;  // one line describing the data (reference only)
  Device device = Device::kCpu;
};

// Splits "PATH@STEP" (STEP >= 0) or "PATH" (step -1: the newest complete checkpoint).
absl::Status ParseResumeFrom(const std::string& arg, std::string* job_dir, int64_t* step) {
  *step = -1;
  *job_dir = arg;
  const size_t at = arg.rfind('@');
  if (at != std::string::npos) {
    *job_dir = arg.substr(0, at);
    if (!absl::SimpleAtoi(arg.substr(at + 1), step) || *step < 0) {
      return absl::InvalidArgumentError("--resume-from " + arg +
                                        ": STEP after @ must be a step number");
    }
  }
  if (job_dir->empty()) return absl::InvalidArgumentError("--resume-from needs DIR/JOB[@STEP]");
  return absl::OkStatus();
}

// Prints the report (--output json) and returns 0, or the error.
int PrintReport(const baton::v1::TrainingReport& report) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  const auto st = google::protobuf::util::MessageToJsonString(report, &json, opts);
  if (!st.ok()) return Fail("cannot print the report: " + st.ToString());
  std::fputs(json.c_str(), stdout);
  return 0;
}

// eval.only: the validation loss of the weights as loaded, and the (unchanged) digest.
int EvaluateOnly(const Runner& run, bool text, baton::v1::TrainingReport* report) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<float> loss = run.evaluate();
  if (!loss.ok()) return Fail("evaluation: " + std::string(loss.status().message()));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report->mutable_wall_time() =
      google::protobuf::util::TimeUtil::NanosecondsToDuration(static_cast<int64_t>(wall * 1e9));
  report->set_eval_loss(*loss);
  report->set_eval_perplexity(std::exp(static_cast<double>(*loss)));
  const absl::StatusOr<std::vector<Digest>> digests = run.digests();
  if (!digests.ok()) return Fail("digests: " + std::string(digests.status().message()));
  report->set_weights_digest(DigestHex(CombineBlockDigests(*digests)));
  if (!text) return PrintReport(*report);
  const baton::v1::JobSpec& s = run.spec;
  const int batches = std::max(1, s.eval().batches());
  std::printf("eval loss %.6f  perplexity %.4f  (%d validation batch%s of %d sequences, %.1f s)\n",
              *loss, report->eval_perplexity(), batches, batches == 1 ? "" : "es",
              s.data().batch_size(), wall);
  std::printf("weights digest %s (unchanged: nothing trained)\n", report->weights_digest().c_str());
  return 0;
}

}  // namespace

int TrainLocal(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(argv, Flags());
  if (!args.ok()) return Fail(std::string(args.status().message()));
  if (args->Has("help")) {
    std::printf("usage: batonctl train-local -f SPEC.json [flags]\n\n%s",
                FlagHelp(Flags()).c_str());
    return 0;
  }
  if (!args->Has("file")) return Fail("missing -f SPEC.json");
  const std::string output = args->Get("output", "text");
  if (output != "text" && output != "json") {
    return Fail("--output must be text or json, got '" + output + "'");
  }
  const bool pipeline = args->Get("pipeline") == "true";
  if (args->Has("schedule-csv") && !pipeline) return Fail("--schedule-csv needs --pipeline");
  if (args->Has("trace") && !pipeline) return Fail("--trace needs --pipeline");
  absl::StatusOr<baton::v1::JobSpec> spec = LoadJobSpecFile(args->Get("file"));
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  absl::StatusOr<int64_t> steps = args->GetInt("steps", spec->steps());
  absl::StatusOr<int64_t> seed = args->GetInt("seed", static_cast<int64_t>(spec->seed()));
  absl::StatusOr<int64_t> threads = args->GetInt("blas-threads", 1);
  for (const absl::Status& s : {steps.status(), seed.status(), threads.status()}) {
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  if (*threads < 1 || *threads > 256) return Fail("--blas-threads must be in [1, 256]");
  spec->set_steps(static_cast<int32_t>(*steps));
  spec->set_seed(static_cast<uint64_t>(*seed));
  SetBlasThreads(static_cast<int>(*threads));
  if (args->Has("device")) {
    Device device;
    int index;
    if (absl::Status s = ParseDeviceName(args->Get("device"), &device, &index); !s.ok()) {
      return Fail("--device: " + std::string(s.message()));
    }
    if (device == Device::kCuda) {
      if (absl::Status s = SetCudaDevice(index); !s.ok()) {
        return Fail("--device " + args->Get("device") + ": " + std::string(s.message()));
      }
    }
    spec->set_device(device == Device::kCuda ? baton::v1::DEVICE_KIND_CUDA
                                             : baton::v1::DEVICE_KIND_CPU);
  }

  if (absl::Status s = ApplyInitFromHf(*args, &*spec); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (args->Get("eval-only") == "true") spec->mutable_eval()->set_only(true);

  if (args->Has("precision")) {
    const std::string p = args->Get("precision");
    if (p != "fp32" && p != "bf16") return Fail("--precision must be fp32 or bf16, got '" + p + "'");
    spec->set_precision(p == "bf16" ? baton::v1::PRECISION_BF16 : baton::v1::PRECISION_FP32);
  }
  if (args->Has("attention")) {
    absl::StatusOr<baton::v1::AttentionKernel> a = ParseAttentionKernel(args->Get("attention"));
    if (!a.ok()) return Fail(std::string(a.status().message()));
    spec->set_attention(*a);
  }

  if (spec->pipeline().schedule() == baton::v1::SCHEDULE_AUTO) {
    // The auto-planner chooses before anything trains (from the model's FLOPs: nothing
    // has run yet); the reference and the pipeline then train the same choice.
    if (absl::Status st = ValidateAndDefaultJobSpec(&*spec); !st.ok()) {
      return Fail(std::string(st.message()));
    }
    absl::StatusOr<baton::Plan> plan = ResolveAutoPipeline(&*spec, 0);
    if (!plan.ok()) return Fail(std::string(plan.status().message()));
    std::fprintf(stderr, "%s\n", SummarizePlan(*plan).c_str());
  }

  baton::v1::TrainingReport report;
  Runner run;
  std::unique_ptr<ReferenceTrainer> reference;
  std::unique_ptr<LocalPipelineTrainer> pipe;
  std::vector<int> peak_inflight;
  std::vector<RankStepResult> last_step;  // --pipeline: every rank's last step
  if (pipeline) {
    LocalPipelineOptions opts;
    if (args->Has("schedule-csv")) {
      absl::StatusOr<std::string> csv = ReadFile(args->Get("schedule-csv"), {.what = "schedule CSV"});
      if (!csv.ok()) return Fail(std::string(csv.status().message()));
      absl::StatusOr<Schedule> s = FromCsv(*csv);
      if (!s.ok()) return Fail(args->Get("schedule-csv") + ": " + std::string(s.status().message()));
      opts.schedule = *std::move(s);
    }
    absl::StatusOr<std::unique_ptr<LocalPipelineTrainer>> t =
        LocalPipelineTrainer::Create(*std::move(spec), std::move(opts));
    if (!t.ok()) return Fail(std::string(t.status().message()));
    pipe = *std::move(t);
    run.spec = pipe->spec();
    run.step = [&]() -> absl::StatusOr<StepStats> {
      absl::StatusOr<PipelineStepStats> s = pipe->Step();
      if (!s.ok()) return s.status();
      peak_inflight.resize(s->peak_inflight.size(), 0);
      for (size_t r = 0; r < s->peak_inflight.size(); ++r) {
        peak_inflight[r] = std::max(peak_inflight[r], s->peak_inflight[r]);
      }
      // The trace shows replica 0's ranks (every replica runs the same clock).
      last_step.assign(s->ranks.begin(),
                       s->ranks.begin() + std::min<size_t>(s->ranks.size(),
                                                           pipe->schedule().num_ranks));
      return static_cast<StepStats>(*s);
    };
    run.digests = [&] { return pipe->TryBlockDigests(); };
    run.save = [&](const std::string& d, const std::string& j) { return pipe->SaveCheckpoint(d, j); };
    run.load = [&](const std::string& d) { return pipe->LoadCheckpoint(d); };
    run.steps_done = [&] { return pipe->steps_done(); };
    run.evaluate = [&] { return pipe->Evaluate(); };
    run.device = pipe->device();
  } else {
    absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t =
        ReferenceTrainer::Create(*std::move(spec));
    if (!t.ok()) return Fail(std::string(t.status().message()));
    reference = *std::move(t);
    run.spec = reference->spec();
    run.step = [&] { return reference->Step(); };
    run.digests = [&]() -> absl::StatusOr<std::vector<Digest>> {
      return reference->BlockDigests();
    };
    run.save = [&](const std::string& d, const std::string& j) {
      return reference->SaveCheckpoint(d, j).status();
    };
    run.load = [&](const std::string& d) { return reference->LoadCheckpoint(d); };
    run.steps_done = [&] { return reference->steps_done(); };
    run.evaluate = [&] { return reference->Evaluate(); };
    run.data = reference->dataset().Describe();
    run.device = reference->device();
  }
  const baton::v1::JobSpec& s = run.spec;
  const std::vector<BlockInfo> blocks = DescribeBlocks(s.model());
  int64_t num_params = 0;
  for (const BlockInfo& b : blocks) num_params += b.parameters;
  report.set_job_name(s.name());
  report.set_parameters(num_params);
  report.set_device(DescribeDevice(run.device));
  report.set_kernels(CurrentBlasKernels().Describe());
  const bool text = output == "text";
  if (text) {
    std::printf("%s: %s, %zu blocks, %lld parameters, on %s\n",
                s.name().empty() ? "job" : s.name().c_str(), Describe(s).c_str(), blocks.size(),
                static_cast<long long>(num_params), report.device().c_str());
    std::printf("matrix kernels: %s\n", report.kernels().c_str());
    if (pipe != nullptr) {
      const Schedule& sc = pipe->schedule();
      std::vector<std::string> parts;
      for (const BlockRange& b : pipe->stage_blocks()) {
        parts.push_back(absl::StrFormat("%s..%s", blocks[b.first].name, blocks[b.last - 1].name));
      }
      std::printf("pipeline: %s, %d ranks x %d chunks, %d micro-batches; stages: %s\n",
                  ScheduleKindName(sc.kind), sc.num_ranks, sc.virtual_stages,
                  sc.num_microbatches, absl::StrJoin(parts, " | ").c_str());
    } else {
      std::printf("data: %s; batch %d in %d micro-batches; %d steps\n", run.data.c_str(),
                  s.data().batch_size(), s.pipeline().microbatches(), s.steps());
    }
    std::fflush(stdout);
  }
  std::vector<std::string> block_names;
  for (const BlockInfo& b : blocks) block_names.push_back(b.name);
  if (args->Has("resume-from")) {
    std::string from;
    int64_t at = -1;
    if (absl::Status p = ParseResumeFrom(args->Get("resume-from"), &from, &at); !p.ok()) {
      return Fail(std::string(p.message()));
    }
    std::vector<std::string> skipped;
    absl::StatusOr<int64_t> step = FindCheckpoint(from, block_names, at, &skipped);
    for (const std::string& why : skipped) {
      std::fprintf(stderr, "batonctl train-local: %s\n", why.c_str());
    }
    if (!step.ok()) return Fail("--resume-from: " + std::string(step.status().message()));
    if (*step >= s.steps() && !s.eval().only()) {
      return Fail(absl::StrFormat(
          "--resume-from: the checkpoint is after step %d, but the job has %d steps", *step,
          s.steps()));
    }
    if (absl::Status l = run.load(CheckpointStepDir(from, *step)); !l.ok()) {
      return Fail("--resume-from: " + std::string(l.message()));
    }
    if (text) {
      std::printf("resumed from %s after step %lld\n", from.c_str(),
                  static_cast<long long>(*step));
    }
    report.set_initial_weights(absl::StrFormat("checkpoint %s after step %d", from, *step));
  } else if (s.init().has_from_hf()) {
    report.set_initial_weights("Hugging Face model " + s.init().from_hf());
  } else {
    report.set_initial_weights(absl::StrCat("seed ", s.seed()));
  }
  if (text) std::printf("initial weights: %s\n", report.initial_weights().c_str());
  if (s.eval().only()) return EvaluateOnly(run, text, &report);
  std::string checkpoint_job_dir;
  const std::string job_id = args->Get("job-id", "local");
  if (s.has_checkpoint()) {
    checkpoint_job_dir = CheckpointJobDir(s.checkpoint().dir(), job_id);
    if (absl::Status w = CheckCheckpointDirWritable(checkpoint_job_dir); !w.ok()) {
      return Fail("checkpoint.dir: " + std::string(w.message()));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const bool is_text_data = s.data().has_text() || s.data().has_tokens();
  for (int64_t i = run.steps_done(); i < s.steps(); ++i) {
    absl::StatusOr<StepStats> st = run.step();
    if (!st.ok()) return Fail(absl::StrFormat("step %d: %s", i + 1, st.status().message()));
    if (!std::isfinite(st->loss)) {
      // As a cluster job does: divergence is a failure, not a result.
      return Fail(absl::StrFormat("training diverged: step %d loss is %f", st->step, st->loss));
    }
    if (!checkpoint_job_dir.empty() &&
        (st->step % s.checkpoint().every_steps() == 0 || st->step == s.steps())) {
      if (absl::Status w = run.save(checkpoint_job_dir, job_id); !w.ok()) {
        return Fail(absl::StrFormat("checkpoint after step %d: %s", st->step, w.message()));
      }
      absl::StatusOr<std::vector<int64_t>> pruned =
          PruneCheckpoints(checkpoint_job_dir, block_names, s.checkpoint().keep());
      if (!pruned.ok()) return Fail(std::string(pruned.status().message()));
    }
    baton::v1::StepReport* r = report.add_steps();
    r->set_step(st->step);
    r->set_loss(st->loss);
    *r->mutable_duration() = google::protobuf::util::TimeUtil::NanosecondsToDuration(
        static_cast<int64_t>(st->seconds * 1e9));
    r->set_samples_per_second(st->samples / st->seconds);
    r->set_tokens_per_second(st->tokens / st->seconds);
    r->set_learning_rate(st->learning_rate);
    if (st->grad_norm.has_value()) r->set_grad_norm(*st->grad_norm);
    if (st->val_loss.has_value()) r->set_val_loss(*st->val_loss);
    if (text) {
      std::string extra;
      if (st->val_loss.has_value()) absl::StrAppendFormat(&extra, "  val %.4f", *st->val_loss);
      if (st->grad_norm.has_value()) absl::StrAppendFormat(&extra, "  |g| %.3f", *st->grad_norm);
      std::printf("step %5lld/%d  loss %.4f  %8.0f %s/s%s\n", static_cast<long long>(st->step),
                  s.steps(), st->loss,
                  is_text_data ? r->tokens_per_second() : r->samples_per_second(),
                  is_text_data ? "tok" : "samples", extra.c_str());
      std::fflush(stdout);
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report.mutable_wall_time() =
      google::protobuf::util::TimeUtil::NanosecondsToDuration(static_cast<int64_t>(wall * 1e9));

  const absl::StatusOr<std::vector<Digest>> digests = run.digests();
  if (!digests.ok()) return Fail("digests: " + std::string(digests.status().message()));
  for (size_t i = 0; i < digests->size(); ++i) {
    baton::v1::BlockDigest* b = report.add_block_digests();
    b->set_block(blocks[i].name);
    b->set_sha256(DigestHex((*digests)[i]));
  }
  report.set_weights_digest(DigestHex(CombineBlockDigests(*digests)));
  if (pipe != nullptr) {
    baton::v1::PipelineReport* p = report.mutable_pipeline();
    const Schedule& sc = pipe->schedule();
    p->set_schedule(ScheduleKindName(sc.kind));
    p->set_stages(sc.num_ranks);
    p->set_virtual_stages(sc.virtual_stages);
    p->set_microbatches(sc.num_microbatches);
    for (int v : peak_inflight) p->add_peak_inflight(v);
    for (const BlockRange& b : pipe->stage_blocks()) {
      p->add_stage_blocks(absl::StrFormat("%d-%d", b.first, b.last - 1));
    }
  }

  if (args->Has("trace") && pipe != nullptr && !last_step.empty()) {
    const Schedule& sc = pipe->schedule();
    baton::v1::JobTrace trace;
    trace.set_job_id(s.name().empty() ? "train-local" : s.name());
    trace.set_step(s.steps());
    trace.set_num_stages(sc.num_stages());
    for (int r : sc.stage_to_rank) trace.add_stage_to_rank(r);
    trace.set_schedule(ScheduleKindName(sc.kind));
    for (const RankStepResult& r : last_step) *trace.add_ranks() = RankTraceFromStep(r);
    absl::StatusOr<std::string> json = ChromeTraceJson(trace);
    if (!json.ok()) return Fail(std::string(json.status().message()));
    if (absl::Status w = WriteOutputFile(args->Get("trace"), *json); !w.ok()) {
      return Fail(std::string(w.message()));
    }
  }

  if (text) {
    const float final_loss = report.steps().empty() ? 0.0f : report.steps().rbegin()->loss();
    std::printf("final loss %.4f after %d steps in %.1f s\n", final_loss, s.steps(), wall);
    if (pipe != nullptr) {
      std::printf("peak in-flight activations per rank: %s\n",
                  absl::StrJoin(peak_inflight, " ").c_str());
    }
    std::printf("weights digest %s\n", report.weights_digest().c_str());
    return 0;
  }
  return PrintReport(report);
}

}  // namespace baton::cli
