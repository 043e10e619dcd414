// batonctl sample: text from a trained model (a checkpoint, or a Hugging Face directory),
// in this process: nanoGPT's sample.py and llm.c's samples, and greedy decoding that equals
// transformers' generate token for token (tests/peer).
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "baton/v1/job.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/commands.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/hf.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/log_text.h"
#include "common/core/status.h"
#include "common/data/tokenizer.h"
#include "common/nn/generate.h"
#include "common/nn/model.h"
#include "common/spec/spec.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton::cli {
namespace {

constexpr char kUsage[] =
    "usage: batonctl sample --hf MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) [flags]\n"
    "       batonctl sample --from DIR/JOB --spec SPEC.json [--step N] (--prompt TEXT | "
    "--prompt-ids ...) [flags]\n\n"
    "Generates --tokens tokens after the prompt from a Hugging Face model directory (GPT-2 or\n"
    "LLaMA, as init.from_hf reads it) or from a job's checkpoint (the newest complete one, or\n"
    "--step; the model's shape from --spec), on the CPU. A text prompt is encoded with\n"
    "--tokenizer tokenizer.json (default: MODEL_DIR/tokenizer.json) and the tokens decoded\n"
    "with it; without a tokenizer give --prompt-ids and read ids. --temperature 0 is greedy\n"
    "decoding (what transformers' generate does without sampling, token for token); otherwise\n"
    "the draws come from --seed (the same seed, the same text), among the --top-k largest\n"
    "logits (0: all). Each token runs the last `context` tokens forward (no cache).\n\n";

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"hf", "", false, "a Hugging Face model directory (config.json, model.safetensors)"},
      {"from", "", false, "a job's checkpoint directory DIR/JOB (with --spec)"},
      {"spec", "", false, "with --from: the job's spec (the model's shape)"},
      {"step", "", false, "with --from: the checkpoint's step (default: the newest complete)"},
      {"tokenizer", "", false, "tokenizer.json (default: MODEL_DIR/tokenizer.json with --hf)"},
      {"prompt", "p", false, "the prompt text (needs a tokenizer)"},
      {"prompt-ids", "", false, "the prompt as token ids, comma-separated"},
      {"tokens", "n", false, "tokens to generate (default 50)"},
      {"temperature", "", false, "0 for greedy; default 0.8"},
      {"top-k", "", false, "sample among the k largest logits; 0: all (default 200)"},
      {"seed", "", false, "the draws' seed (default 1337)"},
      {"stop-id", "", false, "stop after generating this id (e.g. the end-of-text token)"},
      {"output", "o", false, "text (default) or json"},
      {"help", "h", true, "show this help"},
  };
  return *flags;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "batonctl sample: %s\n", what.c_str());
  return 1;
}

// The model and its spec, weights loaded.
struct Loaded {
  baton::v1::ModelSpec model;
  std::unique_ptr<Sequential> blocks;
  std::string source;  // for the report
};

absl::StatusOr<Loaded> LoadFromHf(const std::string& dir) {
  BATON_ASSIGN_OR_RETURN(const google::protobuf::Struct config, ReadHfConfig(dir));
  baton::v1::JobSpec spec;
  BATON_ASSIGN_OR_RETURN(*spec.mutable_model(), ModelSpecFromHfConfig(config));
  spec.mutable_init()->set_from_hf(dir);
  Loaded out;
  out.model = spec.model();
  BATON_ASSIGN_OR_RETURN(out.blocks, BuildBlocks(out.model, /*seed=*/1));
  BATON_RETURN_IF_ERROR(LoadHfWeights(spec, {}, 0, out.blocks.get()));
  out.source = absl::StrCat("Hugging Face model ", dir);
  return out;
}

absl::StatusOr<Loaded> LoadFromCheckpoint(const std::string& job_dir, const std::string& spec_path,
                                          int64_t step) {
  BATON_ASSIGN_OR_RETURN(baton::v1::JobSpec spec, LoadJobSpecFile(spec_path));
  BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(&spec));
  if (!spec.model().has_gpt() && !spec.model().has_llama()) {
    return absl::InvalidArgumentError("the spec's model must be model.gpt or model.llama");
  }
  std::vector<std::string> skipped;
  BATON_ASSIGN_OR_RETURN(const int64_t found, FindCheckpoint(job_dir, {}, step, &skipped));
  for (const std::string& why : skipped) std::fprintf(stderr, "batonctl sample: %s\n", why.c_str());
  const std::string dir = CheckpointStepDir(job_dir, found);
  BATON_ASSIGN_OR_RETURN(const std::string bytes, ExportWeights(dir));
  BATON_ASSIGN_OR_RETURN(const Safetensors st, ParseSafetensors(bytes));
  Loaded out;
  out.model = spec.model();
  BATON_ASSIGN_OR_RETURN(out.blocks, BuildBlocks(out.model, spec.seed()));
  for (Parameter* p : out.blocks->Parameters()) {
    const auto it = st.tensors.find(p->name);
    if (it == st.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint ", dir, " has no ", p->name, ": is --spec its job's?"));
    }
    BATON_ASSIGN_OR_RETURN(const Tensor t, EntryToTensor(it->second, Device::kCpu));
    if (t.shape() != p->value.shape() || t.dtype() != p->value.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint's ", p->name, " is ",
                                                     t.DebugString(), " but --spec makes it ",
                                                     p->value.DebugString()));
    }
    BATON_RETURN_IF_ERROR(p->value.CopyFromHost(t.f32()));
  }
  out.source = absl::StrCat("checkpoint ", dir);
  return out;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: '", EchoInput(part), "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

// The --output json report: {"source", "prompt_ids", "ids", "text" (with a tokenizer)},
// written by protobuf's JSON printer (which escapes the text).
absl::StatusOr<std::string> JsonReport(const std::string& source,
                                       const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& ids,
                                       const std::optional<std::string>& text) {
  google::protobuf::Struct report;
  auto& f = *report.mutable_fields();
  f["source"].set_string_value(source);
  for (const auto& [key, list] : {std::pair{"prompt_ids", &prompt}, std::pair{"ids", &ids}}) {
    google::protobuf::ListValue* values = f[key].mutable_list_value();
    for (int32_t id : *list) values->add_values()->set_number_value(id);
  }
  if (text.has_value()) f["text"].set_string_value(*text);
  std::string out;
  if (const auto st = google::protobuf::util::MessageToJsonString(report, &out); !st.ok()) {
    return absl::InternalError(absl::StrCat("cannot print the report: ", st.ToString()));
  }
  return out;
}

}  // namespace

int Sample(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(argv, Flags());
  if (!args.ok()) return Fail(std::string(args.status().message()));
  if (args->Has("help")) {
    std::printf("%s%s", kUsage, FlagHelp(Flags()).c_str());
    return 0;
  }
  if (args->Has("hf") == args->Has("from")) return Fail("give --hf MODEL_DIR or --from DIR/JOB");
  if (args->Has("from") && !args->Has("spec")) {
    return Fail("--from needs --spec SPEC.json (the model's shape)");
  }
  if (args->Has("prompt") == args->Has("prompt-ids")) {
    return Fail("give --prompt TEXT or --prompt-ids 1,2,3");
  }
  const std::string output = args->Get("output", "text");
  if (output != "text" && output != "json") {
    return Fail("--output must be text or json, got '" + output + "'");
  }
  GenerateOptions opts;
  absl::StatusOr<int64_t> tokens = args->GetInt("tokens", 50);
  absl::StatusOr<int64_t> top_k = args->GetInt("top-k", 200);
  absl::StatusOr<int64_t> seed = args->GetInt("seed", 1337);
  absl::StatusOr<int64_t> stop = args->GetInt("stop-id", -1);
  absl::StatusOr<int64_t> step = args->GetInt("step", -1);
  for (const auto* v : {&tokens, &top_k, &seed, &stop, &step}) {
    if (!v->ok()) return Fail(std::string(v->status().message()));
  }
  if (*tokens < 1 || *tokens > 100000) return Fail("--tokens must be in [1, 100000]");
  if (*top_k < 0) return Fail("--top-k must be 0 (all) or more");
  opts.max_new_tokens = static_cast<int>(*tokens);
  opts.top_k = static_cast<int>(*top_k);
  opts.seed = static_cast<uint64_t>(*seed);
  opts.stop_id = static_cast<int32_t>(*stop);
  opts.temperature = 0.8f;
  if (args->Has("temperature") && (!absl::SimpleAtof(args->Get("temperature"), &opts.temperature) ||
                                   !(opts.temperature >= 0.0f))) {
    return Fail("--temperature must be 0 (greedy) or a positive number, got '" +
                args->Get("temperature") + "'");
  }

  std::string tokenizer_path = args->Get("tokenizer");
  if (tokenizer_path.empty() && args->Has("hf")) {
    const std::string beside = args->Get("hf") + "/tokenizer.json";
    std::error_code ec;
    if (std::filesystem::exists(beside, ec)) tokenizer_path = beside;
  }
  std::optional<Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    absl::StatusOr<Tokenizer> t = Tokenizer::FromFile(tokenizer_path);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    tokenizer = *std::move(t);
  }
  std::vector<int32_t> prompt;
  if (args->Has("prompt")) {
    if (!tokenizer.has_value()) {
      return Fail("--prompt needs a tokenizer: --tokenizer tokenizer.json (or --prompt-ids)");
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(args->Get("prompt"));
    if (!ids.ok()) return Fail("--prompt: " + std::string(ids.status().message()));
    prompt = *std::move(ids);
  } else {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIds(args->Get("prompt-ids"));
    if (!ids.ok()) return Fail(std::string(ids.status().message()));
    prompt = *std::move(ids);
  }

  absl::StatusOr<Loaded> loaded =
      args->Has("hf") ? LoadFromHf(args->Get("hf"))
                      : LoadFromCheckpoint(args->Get("from"), args->Get("spec"), *step);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  const int64_t context =
      loaded->model.has_gpt() ? loaded->model.gpt().context() : loaded->model.llama().context();
  absl::StatusOr<std::vector<int32_t>> generated = Generate(*loaded->blocks, context, prompt, opts);
  if (!generated.ok()) return Fail(std::string(generated.status().message()));
  std::string text;
  if (tokenizer.has_value()) {
    absl::StatusOr<std::string> decoded = tokenizer->Decode(*generated);
    if (!decoded.ok()) return Fail("decoding: " + std::string(decoded.status().message()));
    text = *std::move(decoded);
  }
  if (output == "json") {
    absl::StatusOr<std::string> json =
        JsonReport(loaded->source, prompt, *generated,
                   tokenizer.has_value() ? std::optional<std::string>(text) : std::nullopt);
    if (!json.ok()) return Fail(std::string(json.status().message()));
    std::printf("%s\n", json->c_str());
    return 0;
  }
  if (tokenizer.has_value()) {
    std::printf("%s%s\n", args->Get("prompt").c_str(), text.c_str());
  } else {
    std::printf("%s\n", absl::StrJoin(*generated, " ").c_str());
  }
  return 0;
}

}  // namespace baton::cli
