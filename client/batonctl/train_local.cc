// batonctl train-local: the reference trainer from the command line.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "baton/v1/training.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/commands.h"
#include "common/core/backend.h"
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
      {"blas-threads", "", false, "OpenBLAS threads (default 1; results do not depend on it)"},
      {"output", "o", false, "text (default) or json"},
      {"help", "h", true, "show this help"},
  };
  return *flags;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "batonctl train-local: %s\n", what.c_str());
  return 1;
}

std::string Describe(const baton::v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (m.has_gpt()) {
    const auto& g = m.gpt();
    return absl::StrFormat("gpt (vocab %d, context %d, d_model %d, heads %d, layers %d)",
                           g.vocab_size(), g.context(), g.d_model(), g.heads(), g.layers());
  }
  const auto& p = m.mlp();
  return absl::StrFormat("mlp (input %d, width %d, depth %d, output %d)", p.input_dim(),
                         p.width(), p.depth(), p.output_dim());
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

  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> trainer =
      ReferenceTrainer::Create(*std::move(spec));
  if (!trainer.ok()) return Fail(std::string(trainer.status().message()));
  ReferenceTrainer& t = **trainer;
  const baton::v1::JobSpec& s = t.spec();
  const bool text = output == "text";

  baton::v1::TrainingReport report;
  report.set_job_name(s.name());
  int64_t num_params = 0;
  for (Parameter* p : t.model().Parameters()) num_params += p->value.numel();
  report.set_parameters(num_params);
  if (text) {
    std::printf("%s: %s, %d blocks, %lld parameters\n", s.name().empty() ? "job" : s.name().c_str(),
                Describe(s).c_str(), t.model().size(), static_cast<long long>(num_params));
    std::printf("data: %s; batch %d in %d micro-batches; %d steps\n",
                t.dataset().Describe().c_str(), s.data().batch_size(), s.pipeline().microbatches(),
                s.steps());
    std::fflush(stdout);
  }
  const auto start = std::chrono::steady_clock::now();
  const bool is_text_data = s.data().has_text();
  for (int64_t i = 0; i < s.steps(); ++i) {
    absl::StatusOr<StepStats> st = t.Step();
    if (!st.ok()) return Fail(absl::StrFormat("step %d: %s", i + 1, st.status().message()));
    baton::v1::StepReport* r = report.add_steps();
    r->set_step(st->step);
    r->set_loss(st->loss);
    *r->mutable_duration() = google::protobuf::util::TimeUtil::NanosecondsToDuration(
        static_cast<int64_t>(st->seconds * 1e9));
    r->set_samples_per_second(st->samples / st->seconds);
    r->set_tokens_per_second(st->tokens / st->seconds);
    if (text) {
      std::printf("step %5lld/%d  loss %.4f  %8.0f %s/s\n", static_cast<long long>(st->step),
                  s.steps(), st->loss, is_text_data ? r->tokens_per_second() : r->samples_per_second(),
                  is_text_data ? "tok" : "samples");
      std::fflush(stdout);
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report.mutable_wall_time() =
      google::protobuf::util::TimeUtil::NanosecondsToDuration(static_cast<int64_t>(wall * 1e9));

  const std::vector<Digest> blocks = t.BlockDigests();
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
    baton::v1::BlockDigest* b = report.add_block_digests();
    b->set_block(t.model().at(i).name());
    b->set_sha256(DigestHex(blocks[i]));
  }
  report.set_weights_digest(DigestHex(CombineBlockDigests(blocks)));

  if (text) {
    const float final_loss = report.steps().empty() ? 0.0f : report.steps().rbegin()->loss();
    std::printf("final loss %.4f after %d steps in %.1f s\n", final_loss, s.steps(), wall);
    std::printf("weights digest %s\n", report.weights_digest().c_str());
    return 0;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  const auto st = google::protobuf::util::MessageToJsonString(report, &json, opts);
  if (!st.ok()) return Fail("cannot print the report: " + st.ToString());
  std::fputs(json.c_str(), stdout);
  return 0;
}

}  // namespace baton::cli
