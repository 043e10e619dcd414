#include "common/spec/spec.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/cuda_context.h"
#include "common/core/cuda_device.h"
#include "common/core/file.h"
#include "common/core/flash_attention_math.h"
#include "common/core/flash_tiles.h"
#include "common/core/log_text.h"
#include "common/core/status.h"
#include "common/schedule/vocabulary.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace {

using ::baton::v1::JobSpec;

absl::Status Invalid(absl::string_view field, const std::string& reason) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", reason));
}

int64_t Utf8Length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;  // count every byte that is not a continuation byte
  }
  return n;
}

absl::Status AtLeastOne(const char* field, int64_t value) {
  if (value < 1) return Invalid(field, absl::StrCat("must be at least 1, got ", value));
  return absl::OkStatus();
}

// Replaces 0 with `def`; refuses negative values.
absl::Status DefaultPositive(const char* field, int32_t* value, int32_t def) {
  if (*value == 0) *value = def;
  return AtLeastOne(field, *value);
}

absl::Status Finite(const char* field, float value) {
  if (!std::isfinite(value)) return Invalid(field, absl::StrCat("must be finite, got ", value));
  return absl::OkStatus();
}

absl::Status Positive(const char* field, float value) {
  BATON_RETURN_IF_ERROR(Finite(field, value));
  if (!(value > 0)) return Invalid(field, absl::StrCat("must be > 0, got ", value));
  return absl::OkStatus();
}

absl::Status NonNegative(const char* field, float value) {
  BATON_RETURN_IF_ERROR(Finite(field, value));
  if (value < 0) return Invalid(field, absl::StrCat("must be >= 0, got ", value));
  return absl::OkStatus();
}

// [0, 1): momentum and Adam betas.
absl::Status UnitInterval(const char* field, float value) {
  BATON_RETURN_IF_ERROR(Finite(field, value));
  if (!(value >= 0 && value < 1)) {
    return Invalid(field, absl::StrCat("must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const baton::v1::ModelSpec& model) {
  switch (model.architecture_case()) {
    case baton::v1::ModelSpec::kMlp: {
      const auto& m = model.mlp();
      BATON_RETURN_IF_ERROR(AtLeastOne("model.mlp.input_dim", m.input_dim()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.mlp.width", m.width()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.mlp.depth", m.depth()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.mlp.output_dim", m.output_dim()));
      return absl::OkStatus();
    }
    case baton::v1::ModelSpec::kGpt: {
      const auto& g = model.gpt();
      BATON_RETURN_IF_ERROR(AtLeastOne("model.gpt.vocab_size", g.vocab_size()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.gpt.context", g.context()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.gpt.d_model", g.d_model()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.gpt.heads", g.heads()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.gpt.layers", g.layers()));
      if (g.d_model() % g.heads() != 0) {
        return Invalid("model.gpt.heads", absl::StrCat("must divide d_model (d_model=", g.d_model(),
                                                       ", heads=", g.heads(), ")"));
      }
      return absl::OkStatus();
    }
    case baton::v1::ModelSpec::kLlama: {
      const auto& l = model.llama();
      BATON_RETURN_IF_ERROR(AtLeastOne("model.llama.vocab_size", l.vocab_size()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.llama.context", l.context()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.llama.d_model", l.d_model()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.llama.heads", l.heads()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.llama.layers", l.layers()));
      BATON_RETURN_IF_ERROR(AtLeastOne("model.llama.intermediate_size", l.intermediate_size()));
      if (l.kv_heads() < 0) {
        return Invalid("model.llama.kv_heads",
                       absl::StrCat("must be >= 0 (0 means heads), got ", l.kv_heads()));
      }
      if (l.d_model() % l.heads() != 0) {
        return Invalid("model.llama.heads",
                       absl::StrCat("must divide d_model (d_model=", l.d_model(),
                                    ", heads=", l.heads(), ")"));
      }
      if ((l.d_model() / l.heads()) % 2 != 0) {
        return Invalid("model.llama.heads",
                       absl::StrCat("the head size d_model / heads = ", l.d_model() / l.heads(),
                                    " must be even (rotary embeddings rotate pairs)"));
      }
      if (l.heads() % LlamaKvHeads(l) != 0) {
        return Invalid("model.llama.kv_heads",
                       absl::StrCat("must divide heads (heads=", l.heads(),
                                    ", kv_heads=", l.kv_heads(), ")"));
      }
      BATON_RETURN_IF_ERROR(NonNegative("model.llama.rope_theta", l.rope_theta()));
      BATON_RETURN_IF_ERROR(NonNegative("model.llama.rms_norm_eps", l.rms_norm_eps()));
      if (l.rope_theta() > 0 && l.rope_theta() <= 1) {
        return Invalid("model.llama.rope_theta",
                       absl::StrCat("must be > 1 (0 means 10000), got ", l.rope_theta()));
      }
      return absl::OkStatus();
    }
    case baton::v1::ModelSpec::ARCHITECTURE_NOT_SET:
      break;
  }
  return Invalid("model", "no architecture set (want mlp, gpt or llama)");
}

absl::Status ValidateData(baton::v1::DataSpec* data) {
  switch (data->source_case()) {
    case baton::v1::DataSpec::kText: {
      const auto& t = data->text();
      switch (t.content_case()) {
        case baton::v1::TextData::kPath:
          if (t.path().empty()) return Invalid("data.text.path", "empty path");
          break;
        case baton::v1::TextData::kInlineText:
          if (t.inline_text().empty()) return Invalid("data.text.inline_text", "empty text");
          if (static_cast<int64_t>(t.inline_text().size()) > kMaxInlineTextBytes) {
            return Invalid("data.text.inline_text",
                           absl::StrCat(t.inline_text().size(), " bytes, more than the ",
                                        kMaxInlineTextBytes >> 20,
                                        " MiB allowed inline; put the text in a file under "
                                        "the cluster's data roots and name it in "
                                        "data.text.path"));
          }
          break;
        case baton::v1::TextData::CONTENT_NOT_SET:
          return Invalid("data.text", "no content set (want path or inline_text)");
      }
      break;
    }
    case baton::v1::DataSpec::kSynthetic: {
      auto* s = data->mutable_synthetic();
      int32_t width = s->teacher_width();
      BATON_RETURN_IF_ERROR(DefaultPositive("data.synthetic.teacher_width", &width, 32));
      s->set_teacher_width(width);
      BATON_RETURN_IF_ERROR(NonNegative("data.synthetic.noise", s->noise()));
      break;
    }
    case baton::v1::DataSpec::kTokens: {
      const auto& t = data->tokens();
      if (t.train_size() == 0) {
        return Invalid("data.tokens.train", "required: at least one shard (a path or a glob)");
      }
      for (const auto* entries : {&t.train(), &t.val()}) {
        const char* field = entries == &t.train() ? "data.tokens.train" : "data.tokens.val";
        for (const std::string& entry : *entries) {
          if (entry.empty() || entry.find('\0') != std::string::npos || entry.size() > 4096) {
            return Invalid(field, "not a usable path");
          }
        }
      }
      if (!baton::v1::TokenFormat_IsValid(t.format())) {
        return Invalid("data.tokens.format",
                       absl::StrCat("unknown format ", t.format(),
                                    " (want TOKEN_FORMAT_AUTO, _UINT16, _UINT32 or _LLMC)"));
      }
      if (!baton::v1::TokenSampling_IsValid(t.sampling())) {
        return Invalid("data.tokens.sampling",
                       absl::StrCat("unknown sampling ", t.sampling(),
                                    " (want TOKEN_SAMPLING_RANDOM or TOKEN_SAMPLING_SEQUENTIAL)"));
      }
      break;
    }
    case baton::v1::DataSpec::SOURCE_NOT_SET:
      return Invalid("data", "no source set (want text, tokens or synthetic)");
  }
  return AtLeastOne("data.batch_size", data->batch_size());
}

absl::Status ValidatePipeline(baton::v1::PipelineSpec* p) {
  if (p->schedule() == baton::v1::SCHEDULE_UNSPECIFIED) {
    p->set_schedule(baton::v1::SCHEDULE_1F1B);
  }
  const bool automatic = p->schedule() == baton::v1::SCHEDULE_AUTO;
  absl::StatusOr<const ScheduleEntry*> entry =
      ScheduleEntryForSpecValue(static_cast<int>(p->schedule()));
  if (!baton::v1::Schedule_IsValid(p->schedule()) || (!entry.ok() && !automatic)) {
    return Invalid("pipeline.schedule", absl::StrCat("unknown schedule ", p->schedule(),
                                                     " (known: ", ScheduleNames(), ", auto)"));
  }
  if (!automatic && (*entry)->placement == ChunkPlacement::kV) {
    // Two chunks per rank, always: unset (or 1) reads as 2.
    if (p->virtual_stages() > 2) {
      return Invalid("pipeline.virtual_stages",
                     absl::StrCat((*entry)->name, " places exactly two chunks per rank in a V; "
                                  "want 2 (or unset), got ", p->virtual_stages()));
    }
    p->set_virtual_stages(2);
  }
  if (p->recompute() == baton::v1::RECOMPUTE_UNSPECIFIED) {
    p->set_recompute(baton::v1::RECOMPUTE_NONE);
  }
  if (!baton::v1::Recompute_IsValid(p->recompute())) {
    return Invalid("pipeline.recompute",
                   absl::StrCat("unknown recompute mode ", p->recompute(),
                                " (RECOMPUTE_NONE or RECOMPUTE_FULL)"));
  }
  if (p->recompute_stages_size() > 0 && p->recompute() != baton::v1::RECOMPUTE_FULL) {
    return Invalid("pipeline.recompute_stages", "given, but pipeline.recompute is not RECOMPUTE_FULL");
  }
  int32_t v = p->stages();
  BATON_RETURN_IF_ERROR(DefaultPositive("pipeline.stages", &v, 1));
  p->set_stages(v);
  // With SCHEDULE_AUTO, unset virtual_stages and microbatches stay 0: the planner's choice.
  v = p->virtual_stages();
  if (!automatic || v != 0) {
    BATON_RETURN_IF_ERROR(DefaultPositive("pipeline.virtual_stages", &v, 1));
    p->set_virtual_stages(v);
  }
  v = p->microbatches();
  if (!automatic || v != 0) {
    BATON_RETURN_IF_ERROR(DefaultPositive("pipeline.microbatches", &v, 1));
    p->set_microbatches(v);
  }
  v = p->data_parallel();
  BATON_RETURN_IF_ERROR(DefaultPositive("pipeline.data_parallel", &v, 1));
  p->set_data_parallel(v);
  if (p->data_parallel() > kMaxDataParallel) {
    return Invalid("pipeline.data_parallel", absl::StrCat(p->data_parallel(), " is more than the ",
                                                          kMaxDataParallel, " allowed"));
  }
  if (p->reduce_bucket_bytes() < 0) {
    return Invalid("pipeline.reduce_bucket_bytes",
                   absl::StrCat("must be >= 0 (0: 25 MiB), got ", p->reduce_bucket_bytes()));
  }
  if (p->reduce_bucket_bytes() == 0) p->set_reduce_bucket_bytes(int64_t{25} << 20);
  if (p->reduce_mode() == baton::v1::REDUCE_MODE_UNSPECIFIED) {
    p->set_reduce_mode(baton::v1::REDUCE_MODE_ORDERED);
  }
  if (!baton::v1::ReduceMode_IsValid(p->reduce_mode())) {
    return Invalid("pipeline.reduce_mode",
                   absl::StrCat("unknown reduce mode ", p->reduce_mode(),
                                " (REDUCE_MODE_ORDERED or REDUCE_MODE_FAST)"));
  }
  if (p->collective_engine() == baton::v1::COLLECTIVE_ENGINE_UNSPECIFIED) {
    p->set_collective_engine(baton::v1::COLLECTIVE_ENGINE_AUTO);
  }
  if (!baton::v1::CollectiveEngine_IsValid(p->collective_engine())) {
    return Invalid("pipeline.collective_engine",
                   absl::StrCat("unknown collective engine ", p->collective_engine(),
                                " (COLLECTIVE_ENGINE_AUTO, _GLOO or _NCCL)"));
  }
  if (p->stages() > kMaxStages) {
    return Invalid("pipeline.stages",
                   absl::StrCat(p->stages(), " is more than the ", kMaxStages, " allowed"));
  }
  if (p->virtual_stages() > kMaxVirtualStages) {
    return Invalid("pipeline.virtual_stages", absl::StrCat(p->virtual_stages(),
                                                           " is more than the ",
                                                           kMaxVirtualStages, " allowed"));
  }
  const int64_t chunks = static_cast<int64_t>(p->stages()) * std::max(1, p->virtual_stages());
  std::set<int32_t> seen;
  for (int32_t s : p->recompute_stages()) {
    if (s < 0 || s >= chunks) {
      return Invalid("pipeline.recompute_stages",
                     absl::StrCat("stage ", s, " is not one of the pipeline's ", chunks,
                                  " stages (0 .. ", chunks - 1, ")"));
    }
    if (!seen.insert(s).second) {
      return Invalid("pipeline.recompute_stages", absl::StrCat("stage ", s, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAlgorithm(baton::v1::OptimizerSpec* opt) {
  switch (opt->algorithm_case()) {
    case baton::v1::OptimizerSpec::kSgd: {
      const auto& s = opt->sgd();
      BATON_RETURN_IF_ERROR(Positive("optimizer.sgd.learning_rate", s.learning_rate()));
      BATON_RETURN_IF_ERROR(UnitInterval("optimizer.sgd.momentum", s.momentum()));
      BATON_RETURN_IF_ERROR(NonNegative("optimizer.sgd.weight_decay", s.weight_decay()));
      return absl::OkStatus();
    }
    case baton::v1::OptimizerSpec::kAdamw: {
      auto* a = opt->mutable_adamw();
      if (!a->has_beta1()) a->set_beta1(0.9f);
      if (!a->has_beta2()) a->set_beta2(0.999f);
      if (!a->has_epsilon()) a->set_epsilon(1e-8f);
      if (!a->has_weight_decay()) a->set_weight_decay(0.01f);
      BATON_RETURN_IF_ERROR(Positive("optimizer.adamw.learning_rate", a->learning_rate()));
      BATON_RETURN_IF_ERROR(UnitInterval("optimizer.adamw.beta1", a->beta1()));
      BATON_RETURN_IF_ERROR(UnitInterval("optimizer.adamw.beta2", a->beta2()));
      BATON_RETURN_IF_ERROR(Positive("optimizer.adamw.epsilon", a->epsilon()));
      BATON_RETURN_IF_ERROR(NonNegative("optimizer.adamw.weight_decay", a->weight_decay()));
      return absl::OkStatus();
    }
    case baton::v1::OptimizerSpec::ALGORITHM_NOT_SET:
      break;
  }
  return Invalid("optimizer", "no algorithm set (want sgd or adamw)");
}

// The recipe around the algorithm (docs/training.md): the learning-rate schedule, clipping
// and the weight-decay scope. `steps` is the job's (validated) step count.
absl::Status ValidateOptimizer(baton::v1::OptimizerSpec* opt, int64_t steps) {
  BATON_RETURN_IF_ERROR(ValidateAlgorithm(opt));
  const float peak = opt->has_sgd() ? opt->sgd().learning_rate() : opt->adamw().learning_rate();
  if (opt->has_lr_schedule()) {
    const baton::v1::LrSchedule& l = opt->lr_schedule();
    if (l.warmup_steps() < 0) {
      return Invalid("optimizer.lr_schedule.warmup_steps",
                     absl::StrCat("must be >= 0, got ", l.warmup_steps()));
    }
    if (!baton::v1::LrDecay_IsValid(l.decay())) {
      return Invalid("optimizer.lr_schedule.decay",
                     absl::StrCat("unknown decay ", l.decay(),
                                  " (LR_DECAY_CONSTANT, _COSINE, _LINEAR or _WSD)"));
    }
    BATON_RETURN_IF_ERROR(NonNegative("optimizer.lr_schedule.min_lr", l.min_lr()));
    if (l.min_lr() > peak) {
      return Invalid("optimizer.lr_schedule.min_lr",
                     absl::StrCat("must be at most the learning rate (the peak, ", peak,
                                  "), got ", l.min_lr()));
    }
    if (l.decay_steps() < 0) {
      return Invalid("optimizer.lr_schedule.decay_steps",
                     absl::StrCat("must be >= 0, got ", l.decay_steps()));
    }
    if (l.decay() == baton::v1::LR_DECAY_WSD && l.decay_steps() > steps) {
      return Invalid("optimizer.lr_schedule.decay_steps",
                     absl::StrCat("the decay of LR_DECAY_WSD is ", l.decay_steps(),
                                  " steps, longer than the job's ", steps, " (steps)"));
    }
    if (l.decay() != baton::v1::LR_DECAY_WSD && l.decay_steps() != 0) {
      return Invalid("optimizer.lr_schedule.decay_steps",
                     "only LR_DECAY_WSD has a decay length (the others decay over every step "
                     "after warmup)");
    }
  }
  BATON_RETURN_IF_ERROR(NonNegative("optimizer.clip_grad_norm", opt->clip_grad_norm()));
  if (!baton::v1::WeightDecayScope_IsValid(opt->weight_decay_scope())) {
    return Invalid("optimizer.weight_decay_scope",
                   absl::StrCat("unknown scope ", opt->weight_decay_scope(),
                                " (WEIGHT_DECAY_SCOPE_MATRICES, _MATRICES_AND_EMBEDDINGS or "
                                "_ALL)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecJson(const std::string& json) {
  JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    // The parser's message may quote the input (an unknown field's name): bounded.
    const auto message = status.message();
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job spec JSON: ",
                     JsonParseError(absl::string_view(message.data(), message.size()))));
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(const std::string json, ReadFile(path, {.what = "job spec"}));
  absl::StatusOr<JobSpec> spec = ParseJobSpecJson(json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(EchoInput(path), ": ", spec.status().message()));
  }
  return spec;
}

std::optional<TokenModel> TokenModelOf(const baton::v1::ModelSpec& model) {
  TokenModel t;
  if (model.has_gpt()) {
    const auto& g = model.gpt();
    t.prefix = "model.gpt";
    t.vocab_size = g.vocab_size();
    t.context = g.context();
    t.d_model = g.d_model();
    t.heads = g.heads();
    t.layers = g.layers();
    t.tie_embeddings = !g.has_tie_embeddings() || g.tie_embeddings();
    return t;
  }
  if (model.has_llama()) {
    const auto& l = model.llama();
    t.prefix = "model.llama";
    t.vocab_size = l.vocab_size();
    t.context = l.context();
    t.d_model = l.d_model();
    t.heads = l.heads();
    t.layers = l.layers();
    t.tie_embeddings = l.has_tie_embeddings() && l.tie_embeddings();
    return t;
  }
  return std::nullopt;
}

std::string DescribeModel(const baton::v1::ModelSpec& model) {
  if (model.has_mlp()) {
    const auto& m = model.mlp();
    return absl::StrFormat("mlp (input %d, width %d, depth %d, output %d)", m.input_dim(),
                           m.width(), m.depth(), m.output_dim());
  }
  const std::optional<TokenModel> t = TokenModelOf(model);
  if (!t) return "no model";
  std::string out = absl::StrFormat("%s (vocab %d, context %d, d_model %d, heads %d",
                                    model.has_gpt() ? "gpt" : "llama", t->vocab_size, t->context,
                                    t->d_model, t->heads);
  if (model.has_llama()) {
    const auto& l = model.llama();
    absl::StrAppendFormat(&out, ", kv_heads %d, intermediate %d", LlamaKvHeads(l),
                          l.intermediate_size());
  }
  absl::StrAppendFormat(&out, ", layers %d, %s)", t->layers,
                        t->tie_embeddings ? "tied" : "untied");
  return out;
}

int64_t LlamaKvHeads(const baton::v1::LlamaSpec& s) {
  return s.kv_heads() > 0 ? s.kv_heads() : s.heads();
}
float LlamaRopeTheta(const baton::v1::LlamaSpec& s) {
  return s.rope_theta() > 0 ? s.rope_theta() : 10000.0f;
}
float LlamaRmsNormEps(const baton::v1::LlamaSpec& s) {
  return s.rms_norm_eps() > 0 ? s.rms_norm_eps() : 1e-5f;
}

int64_t TokensPerStep(const baton::v1::JobSpec& spec) {
  const int64_t samples = spec.data().batch_size();
  const std::optional<TokenModel> t = TokenModelOf(spec.model());
  return t ? samples * t->context : samples;
}

int64_t ModelBlockCount(const baton::v1::ModelSpec& model) {
  switch (model.architecture_case()) {
    case baton::v1::ModelSpec::kMlp:
      return static_cast<int64_t>(model.mlp().depth()) + 1;
    case baton::v1::ModelSpec::kGpt:
      return static_cast<int64_t>(model.gpt().layers()) + 2;
    case baton::v1::ModelSpec::kLlama:
      return static_cast<int64_t>(model.llama().layers()) + 2;
    case baton::v1::ModelSpec::ARCHITECTURE_NOT_SET:
      break;
  }
  return 0;
}

absl::Status ParseDeviceName(absl::string_view text, Device* device, int* index) {
  *index = 0;
  if (text == "cpu") {
    *device = Device::kCpu;
    return absl::OkStatus();
  }
  if (text == "cuda") {
    *device = Device::kCuda;
    return absl::OkStatus();
  }
  if (text.substr(0, 5) == "cuda:" && absl::SimpleAtoi(text.substr(5), index) && *index >= 0) {
    *device = Device::kCuda;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", EchoInput(text), "\" is not cpu, cuda or cuda:N"));
}

std::string DescribeDevice(Device device) {
  if (device == Device::kCpu) return "cpu";
  const int index = CurrentCudaDevice();
  absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(index);
  return absl::StrCat("cuda:", index, info.ok() ? absl::StrCat(" (", info->name, ")") : "");
}

absl::StatusOr<Device> LocalDeviceFor(const baton::v1::JobSpec& spec) {
  switch (spec.device()) {
    case baton::v1::DEVICE_KIND_CPU:
      return Device::kCpu;
    case baton::v1::DEVICE_KIND_CUDA:
      if (CudaDeviceCount() == 0) {
        return absl::FailedPreconditionError(
            BuiltWithCuda() ? "device: DEVICE_KIND_CUDA, but no CUDA device is visible here"
                            : "device: DEVICE_KIND_CUDA, but this build has no CUDA");
      }
      return Device::kCuda;
    default:
      return CudaDeviceCount() > 0 ? Device::kCuda : Device::kCpu;
  }
}

absl::StatusOr<baton::v1::AttentionKernel> ParseAttentionKernel(absl::string_view word) {
  if (word == "materialised") return baton::v1::ATTENTION_KERNEL_MATERIALISED;
  if (word == "fused") return baton::v1::ATTENTION_KERNEL_FUSED;
  if (word == "tiled") return baton::v1::ATTENTION_KERNEL_TILED;
  if (word == "auto") return baton::v1::ATTENTION_KERNEL_UNSPECIFIED;
  return absl::InvalidArgumentError(
      absl::StrCat("--attention must be materialised, fused, tiled or auto, got '", word, "'"));
}

absl::StatusOr<ValidatedJobSpec> ValidatedJobSpec::Validate(JobSpec spec) {
  BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(&spec));
  return ValidatedJobSpec(std::move(spec));
}

// JobSpec.attention against the model and precision (after ValidateModel).
static absl::Status ValidateAttention(const baton::v1::JobSpec& spec) {
  const baton::v1::AttentionKernel a = spec.attention();
  if (!baton::v1::AttentionKernel_IsValid(a)) {
    return Invalid("attention",
                   absl::StrCat("unknown attention kernel ", a,
                                " (want ATTENTION_KERNEL_MATERIALISED, ATTENTION_KERNEL_FUSED "
                                "or ATTENTION_KERNEL_TILED)"));
  }
  if (a == baton::v1::ATTENTION_KERNEL_UNSPECIFIED ||
      a == baton::v1::ATTENTION_KERNEL_MATERIALISED) {
    return absl::OkStatus();
  }
  const std::string name = baton::v1::AttentionKernel_Name(a);
  const baton::v1::ModelSpec& m = spec.model();
  if (!m.has_gpt() && !m.has_llama()) {
    return Invalid("attention", absl::StrCat(name, ": the model has no attention (an mlp)"));
  }
  const int64_t head =
      m.has_gpt() ? m.gpt().d_model() / m.gpt().heads() : m.llama().d_model() / m.llama().heads();
  if (head > flash::kMaxHeadSize) {
    return Invalid("attention", absl::StrCat(name, ": the head size d_model / heads = ", head,
                                             " is over ", flash::kMaxHeadSize));
  }
  if (a == baton::v1::ATTENTION_KERNEL_TILED) {
    if (spec.precision() != baton::v1::PRECISION_BF16) {
      return Invalid("attention", absl::StrCat(name, " needs precision PRECISION_BF16, got ",
                                               spec.precision() == baton::v1::PRECISION_UNSPECIFIED
                                                   ? "PRECISION_FP32 (the default)"
                                                   : baton::v1::Precision_Name(spec.precision())));
    }
    if (!flash_tiles::Supports(head)) {
      return Invalid("attention", absl::StrCat(name, ": the head size d_model / heads = ", head,
                                               " is not a multiple of ", flash_tiles::kFrag));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAndDefaultJobSpec(JobSpec* spec) {
  const int64_t name_chars = Utf8Length(spec->name());
  if (name_chars > kMaxJobNameChars) {
    return Invalid("name",
                   absl::StrCat("at most ", kMaxJobNameChars, " characters, got ", name_chars));
  }
  BATON_RETURN_IF_ERROR(AtLeastOne("steps", spec->steps()));
  if (!baton::v1::DeviceKind_IsValid(spec->device())) {
    return Invalid("device", absl::StrCat("unknown device kind ", spec->device(),
                                          " (want DEVICE_KIND_CPU or DEVICE_KIND_CUDA)"));
  }
  if (!baton::v1::TransportKind_IsValid(spec->transport())) {
    return Invalid("transport", absl::StrCat("unknown transport kind ", spec->transport(),
                                             " (want TRANSPORT_KIND_GRPC or TRANSPORT_KIND_NCCL)"));
  }
  if (!baton::v1::Precision_IsValid(spec->precision())) {
    return Invalid("precision", absl::StrCat("unknown precision ", spec->precision(),
                                             " (want PRECISION_FP32 or PRECISION_BF16)"));
  }
  if (spec->transport() == baton::v1::TRANSPORT_KIND_NCCL &&
      spec->device() == baton::v1::DEVICE_KIND_CPU) {
    return Invalid("transport", "TRANSPORT_KIND_NCCL needs GPUs, but device is DEVICE_KIND_CPU");
  }
  BATON_RETURN_IF_ERROR(ValidateModel(spec->model()));
  BATON_RETURN_IF_ERROR(ValidateAttention(*spec));
  BATON_RETURN_IF_ERROR(ValidateData(spec->mutable_data()));
  BATON_RETURN_IF_ERROR(ValidatePipeline(spec->mutable_pipeline()));
  if (spec->pipeline().collective_engine() == baton::v1::COLLECTIVE_ENGINE_NCCL &&
      spec->device() == baton::v1::DEVICE_KIND_CPU) {
    return Invalid("pipeline.collective_engine",
                   "COLLECTIVE_ENGINE_NCCL needs GPUs, but device is DEVICE_KIND_CPU");
  }
  BATON_RETURN_IF_ERROR(ValidateOptimizer(spec->mutable_optimizer(), spec->steps()));
  if (spec->has_checkpoint()) {
    baton::v1::CheckpointSpec* c = spec->mutable_checkpoint();
    BATON_RETURN_IF_ERROR(AtLeastOne("checkpoint.every_steps", c->every_steps()));
    if (c->dir().empty()) {
      return Invalid("checkpoint.dir", "required: a directory every worker can write");
    }
    if (c->dir().find('\0') != std::string::npos || c->dir().size() > 4096) {
      return Invalid("checkpoint.dir", "not a usable path");
    }
    int32_t keep = c->keep();
    BATON_RETURN_IF_ERROR(DefaultPositive("checkpoint.keep", &keep, 2));
    c->set_keep(keep);
  }
  if (spec->optimizer().shard()) {
    if (spec->pipeline().data_parallel() < 2) {
      return Invalid("optimizer.shard",
                     absl::StrCat("needs pipeline.data_parallel of 2 or more, got ",
                                  spec->pipeline().data_parallel(),
                                  ": with one replica there is nothing to shard across"));
    }
  }
  if (spec->has_restart()) {
    baton::v1::RestartSpec* r = spec->mutable_restart();
    BATON_RETURN_IF_ERROR(AtLeastOne("restart.max_restarts", r->max_restarts()));
    if (r->min_stages() < 0 || r->min_stages() > spec->pipeline().stages()) {
      return Invalid("restart.min_stages",
                     absl::StrCat("must be between 1 and pipeline.stages=",
                                  spec->pipeline().stages(), " (0: pipeline.stages), got ",
                                  r->min_stages()));
    }
    if (r->min_stages() == 0) r->set_min_stages(spec->pipeline().stages());
  }
  if (spec->has_resume_from()) {
    const baton::v1::ResumeFrom& r = spec->resume_from();
    if (r.job_id().empty()) return Invalid("resume_from.job_id", "required: the job to resume from");
    if (r.step() < 0) {
      return Invalid("resume_from.step",
                     absl::StrCat("must be a step (0: the newest complete checkpoint), got ",
                                  r.step()));
    }
    if (r.step() >= spec->steps() && !spec->eval().only()) {  // an evaluation trains nothing
      return Invalid("resume_from.step",
                     absl::StrCat("checkpoint step ", r.step(), " leaves nothing to train: steps is ",
                                  spec->steps()));
    }
  }
  if (spec->has_init()) {  // initial weights from a Hugging Face model directory
    const std::string& dir = spec->init().from_hf();
    if (dir.empty() || dir.find('\0') != std::string::npos || dir.size() > 4096) {
      return Invalid("init.from_hf", "required: a Hugging Face model directory (a path)");
    }
    if (!spec->model().has_gpt() && !spec->model().has_llama()) {
      return Invalid("init.from_hf", "only a model.gpt or model.llama loads Hugging Face weights");
    }
  }

  // Cross-field checks.
  const auto& data = spec->data();
  const auto& pipeline = spec->pipeline();
  const std::optional<TokenModel> token_model = TokenModelOf(spec->model());
  if (token_model && !data.has_text() && !data.has_tokens()) {
    return Invalid(token_model->prefix,
                   "needs data.text or data.tokens (a token model trains on token sequences)");
  }
  if (data.has_tokens() && !token_model) {
    return Invalid("data.tokens", "needs a token model (model.gpt or model.llama)");
  }
  if (spec->has_eval()) {
    if (spec->eval().every() < 1 && !spec->eval().only()) {
      return Invalid("eval.every",
                     absl::StrCat("must be at least 1 (steps between evaluations), got ",
                                  spec->eval().every()));
    }
    if (spec->eval().batches() < 0) {
      return Invalid("eval.batches",
                     absl::StrCat("must be at least 0 (0: 1 batch), got ", spec->eval().batches()));
    }
    if (spec->eval().batches() > kMaxEvalBatches) {
      return Invalid("eval.batches",
                     absl::StrCat(spec->eval().batches(), " is more than the ", kMaxEvalBatches,
                                  " allowed: each evaluation runs that many batches forward "
                                  "between two training steps, holding the job's workers"));
    }
    if (!data.has_tokens() || data.tokens().val_size() == 0) {
      return Invalid(spec->eval().only() ? "eval.only" : "eval.every",
                     "evaluation needs a validation split: set data.tokens.val (validation "
                     "shards)");
    }
  }
  if (spec->model().has_mlp() && !data.has_synthetic()) {
    return Invalid("model.mlp", "needs data.synthetic (an mlp trains on synthetic regression)");
  }
  // SCHEDULE_AUTO may leave V and M to the planner: the checks below take them as 1.
  const int32_t M = std::max(1, pipeline.microbatches());
  const int32_t V = std::max(1, pipeline.virtual_stages());
  if (data.batch_size() % M != 0) {
    return Invalid("data.batch_size",
                   absl::StrCat(data.batch_size(), " is not divisible by pipeline.microbatches=",
                                M));
  }
  if (data.batch_size() % (static_cast<int64_t>(M) *
                           pipeline.data_parallel()) != 0) {
    return Invalid("data.batch_size",
                   absl::StrCat(data.batch_size(), " does not split into pipeline.data_parallel=",
                                pipeline.data_parallel(), " replicas of pipeline.microbatches=",
                                M, " micro-batches (",
                                static_cast<int64_t>(M) *
                                    pipeline.data_parallel(),
                                " equal parts)"));
  }
  const int64_t chunks =
      static_cast<int64_t>(pipeline.stages()) * static_cast<int64_t>(V);
  const int64_t blocks = ModelBlockCount(spec->model());
  if (chunks > blocks) {
    const std::string what = spec->model().has_mlp()
                                 ? std::string("model.mlp has depth + 1 = ")
                                 : absl::StrCat(token_model->prefix, " has layers + 2 = ");
    return Invalid("pipeline.stages",
                   absl::StrCat("stages * virtual_stages = ", pipeline.stages(), " * ",
                                V, " = ", chunks, " model chunks, but ",
                                what, blocks, " blocks; every chunk needs at least one block"));
  }
  if (pipeline.partition_size() > 0) {
    if (pipeline.schedule() == baton::v1::SCHEDULE_AUTO) {
      return Invalid("pipeline.partition",
                     "with SCHEDULE_AUTO the auto-planner chooses the split; leave it empty");
    }
    BATON_RETURN_IF_ERROR(CheckPartitionSizes(
        {pipeline.partition().begin(), pipeline.partition().end()}, static_cast<int>(chunks),
        blocks));
  }
  if (blocks > kMaxModelBlocks) {
    return Invalid(spec->model().has_mlp() ? std::string("model.mlp.depth")
                                           : absl::StrCat(token_model->prefix, ".layers"),
                   absl::StrCat(blocks, " blocks, more than the ", kMaxModelBlocks, " allowed"));
  }
  if (static_cast<double>(chunks) * static_cast<double>(blocks) >
      static_cast<double>(kMaxChunkBlocks)) {
    return Invalid("pipeline.stages",
                   absl::StrCat("stages * virtual_stages * model blocks = ", chunks, " * ", blocks,
                                " is more than the ", kMaxChunkBlocks,
                                " the partitioner takes; use fewer, larger blocks"));
  }
  const double per_rank = 4.0 * static_cast<double>(V) * M;
  if (per_rank > static_cast<double>(kMaxActionsPerRank)) {
    return Invalid("pipeline.microbatches",
                   absl::StrCat("virtual_stages * microbatches = ", V, " * ", M,
                                " makes a clock of about ", static_cast<int64_t>(per_rank),
                                " actions per rank, more than the ", kMaxActionsPerRank,
                                " allowed"));
  }
  const double actions = 4.0 * static_cast<double>(chunks) * M *
                         static_cast<double>(pipeline.stages());
  if (actions > static_cast<double>(kMaxScheduleActions)) {
    return Invalid("pipeline.microbatches",
                   absl::StrCat("stages * virtual_stages * microbatches = ", pipeline.stages(),
                                " * ", V, " * ", M,
                                " makes a schedule of about ", static_cast<int64_t>(actions),
                                " actions, more than the ", kMaxScheduleActions, " allowed"));
  }
  const JobBytes bytes = EstimateJobBytes(*spec);
  if (bytes.per_stage_bytes > static_cast<double>(kMaxStageBytes)) {
    std::string field = "data.batch_size";
    if (bytes.activation_bytes <= bytes.state_bytes) {
      field = spec->model().has_mlp() ? std::string("model.mlp.width")
                                      : absl::StrCat(token_model->prefix, ".d_model");
    }
    return Invalid(field, absl::StrFormat(
                              "the job needs about %.3g GiB per pipeline stage (%.3g parameters: "
                              "%.3g GiB with gradients and optimizer state; activations %.3g "
                              "GiB; over %d stages), more than the %d GiB a worker may hold",
                              bytes.per_stage_bytes / (1 << 30), bytes.parameters,
                              bytes.state_bytes / (1 << 30), bytes.activation_bytes / (1 << 30),
                              pipeline.stages(), static_cast<int>(kMaxStageBytes >> 30)));
  }
  return absl::OkStatus();
}

absl::Status RequireChosenSchedule(const baton::v1::JobSpec& spec) {
  if (spec.pipeline().schedule() != baton::v1::SCHEDULE_AUTO) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "pipeline.schedule is SCHEDULE_AUTO and the auto-planner has not chosen yet (the "
      "coordinator and batonctl train-local choose before training)");
}

JobBytes EstimateJobBytes(const baton::v1::JobSpec& spec) {
  JobBytes out;
  const double batch = std::max<double>(1, spec.data().batch_size());
  double floats = 0;  // activations of one batch
  if (spec.model().has_mlp()) {
    const auto& m = spec.model().mlp();
    const double in = m.input_dim(), w = m.width(), depth = m.depth(), o = m.output_dim();
    out.parameters = in * w + w + depth * (w * w + w) + w * o + o;
    floats = batch * (in + 3 * w * (depth + 1) + 2 * o);
  } else if (spec.model().has_gpt()) {
    const auto& g = spec.model().gpt();
    const double v = g.vocab_size(), ctx = g.context(), d = g.d_model(), h = g.heads(),
                 layers = g.layers();
    // The output projection has no bias; tied, it is still a copy the last stage holds.
    out.parameters = v * d + ctx * d + layers * (12 * d * d + 13 * d) + 2 * d + d * v;
    const double tokens = batch * ctx;
    floats = tokens * (d * (16 * layers + 2) + 2 * v) + batch * h * ctx * ctx * 2 * layers;
  } else if (spec.model().has_llama()) {
    const auto& l = spec.model().llama();
    const double v = l.vocab_size(), ctx = l.context(), d = l.d_model(), h = l.heads(),
                 kv = static_cast<double>(LlamaKvHeads(l)), layers = l.layers(),
                 inter = l.intermediate_size();
    const double kv_width = d / h * kv;
    out.parameters = v * d + layers * (d * (d + 2 * kv_width) + d * d + 3 * d * inter + 2 * d) +
                     d + d * v;
    const double tokens = batch * ctx;
    floats = tokens * ((4 * d + 2 * kv_width + 4 * inter) * layers + 2 * d + 2 * v) +
             batch * h * ctx * ctx * 2 * layers;
  }
  out.state_bytes = out.parameters * 16;
  out.activation_bytes = floats * 4;
  out.per_stage_bytes = (out.state_bytes + out.activation_bytes) /
                        std::max<double>(1, spec.pipeline().stages());
  return out;
}

void SetPipelineStages(baton::v1::JobSpec* spec, int stages) {
  baton::v1::PipelineSpec* p = spec->mutable_pipeline();
  if (p->stages() == stages) return;
  p->clear_partition();
  p->set_stages(stages);
}

absl::Status CheckPartitionSizes(const std::vector<int>& sizes, int num_chunks,
                                 int64_t num_blocks) {
  if (static_cast<int>(sizes.size()) != num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.partition: ", sizes.size(), " entries for ", num_chunks,
        " pipeline chunks (stages x virtual stages); give one block count per chunk"));
  }
  int64_t total = 0;
  for (size_t c = 0; c < sizes.size(); ++c) {
    if (sizes[c] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline.partition[", c, "]: ", sizes[c],
                                                     " blocks; every chunk needs at least 1"));
    }
    total += sizes[c];
  }
  if (total != num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.partition: the entries add up to ",
                                                   total, " blocks, but the model has ",
                                                   num_blocks));
  }
  return absl::OkStatus();
}

}  // namespace baton
