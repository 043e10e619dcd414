#include "common/checkpoint/hf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/backend.h"
#include "common/core/file.h"
#include "common/core/log_text.h"
#include "common/core/status.h"
#include "common/data/dataset.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr char kField[] = "init.from_hf";
constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;
constexpr double kGpt2LayerNormEps = 1e-5;  // baton's LayerNorm
constexpr float kDefaultRopeTheta = 10000.0f;
constexpr float kDefaultRmsNormEps = 1e-5f;  // LlamaSpec's default (0 means this)
constexpr double kHfLlamaRmsNormEps = 1e-6;  // LlamaConfig's default when the key is absent
// What an export copies from its base model directory besides config.json's keys.
constexpr const char* kHfCarriedFiles[] = {
    "generation_config.json",  "tokenizer.json",    "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json",        "merges.txt",
    "tokenizer.model",         "added_tokens.json", "chat_template.jinja"};

// ---------------------------------------------------------------------------------------
// config.json values

const Value* Find(const Struct& c, const std::string& key) {
  const auto it = c.fields().find(key);
  return it == c.fields().end() ? nullptr : &it->second;
}

bool IsNull(const Value* v) { return v == nullptr || v->kind_case() == Value::kNullValue; }

// A value as JSON, for messages.
std::string Show(const Value* v) {
  if (v == nullptr) return "absent";
  switch (v->kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kBoolValue:
      return v->bool_value() ? "true" : "false";
    case Value::kStringValue:
      return absl::StrCat("\"", EchoInput(v->string_value()), "\"");
    case Value::kNumberValue:
      return absl::StrFormat("%.9g", v->number_value());
    default: {
      std::string out;
      if (!google::protobuf::util::MessageToJsonString(*v, &out).ok()) return "(a value)";
      return EchoInput(out);
    }
  }
}

absl::Status Refuse(const std::string& key, const Value* v, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json ", key, " is ", Show(v), ": ", why));
}

// An integer dimension in [lo, 2^31).
absl::StatusOr<int32_t> Int(const Struct& c, const std::string& key, int64_t lo = 1) {
  const Value* v = Find(c, key);
  if (v == nullptr || v->kind_case() != Value::kNumberValue) {
    return Refuse(key, v, "want an integer");
  }
  const double d = v->number_value();
  if (!(d >= static_cast<double>(lo)) || d >= 2147483648.0 || d != std::floor(d)) {
    return Refuse(key, v, absl::StrCat("want an integer of at least ", lo));
  }
  return static_cast<int32_t>(d);
}

absl::StatusOr<double> Number(const Struct& c, const std::string& key, double absent) {
  const Value* v = Find(c, key);
  if (IsNull(v)) return absent;
  if (v->kind_case() != Value::kNumberValue || !(v->number_value() > 0)) {
    return Refuse(key, v, "want a positive number");
  }
  return v->number_value();
}

absl::StatusOr<bool> Bool(const Struct& c, const std::string& key, bool absent) {
  const Value* v = Find(c, key);
  if (IsNull(v)) return absent;
  if (v->kind_case() != Value::kBoolValue) return Refuse(key, v, "want true or false");
  return v->bool_value();
}

absl::StatusOr<std::string> String(const Struct& c, const std::string& key,
                                   const std::string& absent) {
  const Value* v = Find(c, key);
  if (IsNull(v)) return absent;
  if (v->kind_case() != Value::kStringValue) return Refuse(key, v, "want a string");
  return v->string_value();
}

// The refusals shared by both families.
absl::Status CheckCommon(const Struct& c, const std::string& architecture) {
  if (const Value* v = Find(c, "architectures"); !IsNull(v)) {
    if (v->kind_case() != Value::kListValue) return Refuse("architectures", v, "want a list");
    for (const Value& a : v->list_value().values()) {
      if (a.kind_case() != Value::kStringValue || a.string_value() != architecture) {
        return Refuse("architectures", v,
                      absl::StrCat("baton reads only ", architecture, " for this model_type"));
      }
    }
  }
  if (const Value* v = Find(c, "rope_scaling"); !IsNull(v)) {
    return Refuse("rope_scaling", v, "baton has no rotary scaling (want null)");
  }
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (const Value* v = Find(c, key); !IsNull(v)) {
      return Refuse(key, v, "baton has no mixture-of-experts layers");
    }
  }
  if (const Value* v = Find(c, "sliding_window"); !IsNull(v)) {
    return Refuse("sliding_window", v, "baton's attention is full causal (want null)");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    BATON_ASSIGN_OR_RETURN(const bool bias, Bool(c, key, false));
    if (bias) return Refuse(key, Find(c, key), "baton's LLaMA has no biases (want false)");
  }
  return absl::OkStatus();
}

// head_dim, when given, must be hidden / heads.
absl::Status CheckHeadDim(const Struct& c, int32_t hidden, int32_t heads,
                          const std::string& hidden_key, const std::string& heads_key) {
  if (hidden % heads != 0) {
    return Refuse(heads_key, Find(c, heads_key),
                  absl::StrCat("does not divide ", hidden_key, " ", hidden));
  }
  const Value* v = Find(c, "head_dim");
  if (IsNull(v)) return absl::OkStatus();
  if (v->kind_case() != Value::kNumberValue || v->number_value() != hidden / heads) {
    return Refuse(
        "head_dim", v,
        absl::StrCat("baton's head size is ", hidden_key, " / ", heads_key, " = ", hidden / heads));
  }
  return absl::OkStatus();
}

absl::StatusOr<baton::v1::ModelSpec> Gpt2Spec(const Struct& c) {
  BATON_RETURN_IF_ERROR(CheckCommon(c, "GPT2LMHeadModel"));
  baton::v1::ModelSpec spec;
  baton::v1::GptSpec& g = *spec.mutable_gpt();
  BATON_ASSIGN_OR_RETURN(const int32_t vocab, Int(c, "vocab_size"));
  BATON_ASSIGN_OR_RETURN(const int32_t positions, Int(c, "n_positions"));
  BATON_ASSIGN_OR_RETURN(const int32_t embd, Int(c, "n_embd"));
  BATON_ASSIGN_OR_RETURN(const int32_t heads, Int(c, "n_head"));
  BATON_ASSIGN_OR_RETURN(const int32_t layers, Int(c, "n_layer"));
  BATON_RETURN_IF_ERROR(CheckHeadDim(c, embd, heads, "n_embd", "n_head"));
  BATON_ASSIGN_OR_RETURN(const std::string act, String(c, "activation_function", "gelu_new"));
  if (act != "gelu_new") {
    return Refuse("activation_function", Find(c, "activation_function"),
                  "baton's GPT-2 MLP uses the tanh-approximated GELU (want \"gelu_new\")");
  }
  BATON_ASSIGN_OR_RETURN(const double eps, Number(c, "layer_norm_epsilon", kGpt2LayerNormEps));
  if (eps != kGpt2LayerNormEps) {
    return Refuse("layer_norm_epsilon", Find(c, "layer_norm_epsilon"),
                  "baton's LayerNorm epsilon is 1e-5");
  }
  if (const Value* v = Find(c, "n_inner"); !IsNull(v)) {
    if (v->kind_case() != Value::kNumberValue || v->number_value() != 4.0 * embd) {
      return Refuse("n_inner", v,
                    absl::StrCat("baton's GPT-2 MLP is 4 * n_embd = ", 4 * embd,
                                 " wide (want null or that)"));
    }
  }
  BATON_ASSIGN_OR_RETURN(const bool by_layer, Bool(c, "scale_attn_by_inverse_layer_idx", false));
  if (by_layer) {
    return Refuse("scale_attn_by_inverse_layer_idx", Find(c, "scale_attn_by_inverse_layer_idx"),
                  "baton scales attention by 1/sqrt(head size) only (want false)");
  }
  BATON_ASSIGN_OR_RETURN(const bool scaled, Bool(c, "scale_attn_weights", true));
  if (!scaled) {
    return Refuse("scale_attn_weights", Find(c, "scale_attn_weights"),
                  "baton scales attention by 1/sqrt(head size) (want true)");
  }
  BATON_ASSIGN_OR_RETURN(const bool tied, Bool(c, "tie_word_embeddings", true));
  g.set_vocab_size(vocab);
  g.set_context(positions);
  g.set_d_model(embd);
  g.set_heads(heads);
  g.set_layers(layers);
  g.set_tie_embeddings(tied);
  return spec;
}

absl::StatusOr<baton::v1::ModelSpec> LlamaSpecOf(const Struct& c) {
  BATON_RETURN_IF_ERROR(CheckCommon(c, "LlamaForCausalLM"));
  baton::v1::ModelSpec spec;
  baton::v1::LlamaSpec& l = *spec.mutable_llama();
  BATON_ASSIGN_OR_RETURN(const int32_t vocab, Int(c, "vocab_size"));
  BATON_ASSIGN_OR_RETURN(const int32_t positions, Int(c, "max_position_embeddings"));
  BATON_ASSIGN_OR_RETURN(const int32_t hidden, Int(c, "hidden_size"));
  BATON_ASSIGN_OR_RETURN(const int32_t heads, Int(c, "num_attention_heads"));
  int32_t kv_heads = heads;
  if (!IsNull(Find(c, "num_key_value_heads"))) {
    BATON_ASSIGN_OR_RETURN(kv_heads, Int(c, "num_key_value_heads"));
  }
  BATON_ASSIGN_OR_RETURN(const int32_t layers, Int(c, "num_hidden_layers"));
  BATON_ASSIGN_OR_RETURN(const int32_t inter, Int(c, "intermediate_size"));
  BATON_RETURN_IF_ERROR(CheckHeadDim(c, hidden, heads, "hidden_size", "num_attention_heads"));
  if (heads % kv_heads != 0) {
    return Refuse("num_key_value_heads", Find(c, "num_key_value_heads"),
                  absl::StrCat("does not divide num_attention_heads ", heads));
  }
  BATON_ASSIGN_OR_RETURN(const std::string act, String(c, "hidden_act", "silu"));
  if (act != "silu") {
    return Refuse("hidden_act", Find(c, "hidden_act"), "baton's SwiGLU uses silu");
  }
  // transformers 5 keeps the rotary settings in rope_parameters; 4.x at the top level.
  double rope_theta = kDefaultRopeTheta;
  if (const Value* p = Find(c, "rope_parameters"); !IsNull(p)) {
    if (p->kind_case() != Value::kStructValue)
      return Refuse("rope_parameters", p, "want an object");
    const Struct& rp = p->struct_value();
    for (const char* key : {"rope_type", "type"}) {
      BATON_ASSIGN_OR_RETURN(const std::string type, String(rp, key, "default"));
      if (type != "default") {
        return Refuse(absl::StrCat("rope_parameters.", key), Find(rp, key),
                      "baton has no rotary scaling (want \"default\")");
      }
    }
    BATON_ASSIGN_OR_RETURN(rope_theta, Number(rp, "rope_theta", rope_theta));
  }
  BATON_ASSIGN_OR_RETURN(rope_theta, Number(c, "rope_theta", rope_theta));
  BATON_ASSIGN_OR_RETURN(const double eps, Number(c, "rms_norm_eps", kHfLlamaRmsNormEps));
  BATON_ASSIGN_OR_RETURN(const bool tied, Bool(c, "tie_word_embeddings", false));
  l.set_vocab_size(vocab);
  l.set_context(positions);
  l.set_d_model(hidden);
  l.set_heads(heads);
  l.set_kv_heads(kv_heads);
  l.set_layers(layers);
  l.set_intermediate_size(inter);
  l.set_rope_theta(static_cast<float>(rope_theta));
  l.set_rms_norm_eps(static_cast<float>(eps));
  l.set_tie_embeddings(tied);
  return spec;
}

// ---------------------------------------------------------------------------------------
// The mapping table

// One Hugging Face tensor making (some rows of) a baton parameter.
struct HfPart {
  std::string name;        // as transformers' save_pretrained names it
  Shape shape;             // its shape in the Hugging Face file
  bool transpose = false;  // GPT-2's Conv1D stores [in, out]; baton [out, in]
};

// A baton parameter: the rows of its parts (each transposed first where marked), in order.
struct HfParam {
  std::string baton;
  Shape shape;
  std::vector<HfPart> parts;
  // >= 0: only the first `rows` rows of the single part (wpe: context of n_positions).
  int64_t rows = -1;
  // false: not written on export (a tied head, which transformers does not save).
  bool write = true;
};

// Every parameter of the model, with `hf_positions` rows in GPT-2's wpe.
std::vector<HfParam> HfTable(const baton::v1::ModelSpec& spec, int64_t hf_positions) {
  std::vector<HfParam> t;
  auto add = [&](std::string baton, Shape shape, std::vector<HfPart> parts) -> HfParam& {
    t.push_back({std::move(baton), std::move(shape), std::move(parts)});
    return t.back();
  };
  if (spec.has_gpt()) {
    const baton::v1::GptSpec& g = spec.gpt();
    const int64_t V = g.vocab_size(), T = g.context(), C = g.d_model();
    const bool tied = !g.has_tie_embeddings() || g.tie_embeddings();
    const std::string p = "transformer.";
    add("embed.token", {V, C}, {{p + "wte.weight", {V, C}}});
    add("embed.position", {T, C}, {{p + "wpe.weight", {hf_positions, C}}}).rows = T;
    for (int i = 0; i < g.layers(); ++i) {
      const std::string b = absl::StrCat("block.", i, ".");
      const std::string h = absl::StrCat(p, "h.", i, ".");
      add(b + "ln1.weight", {C}, {{h + "ln_1.weight", {C}}});
      add(b + "ln1.bias", {C}, {{h + "ln_1.bias", {C}}});
      add(b + "attn.qkv.weight", {3 * C, C}, {{h + "attn.c_attn.weight", {C, 3 * C}, true}});
      add(b + "attn.qkv.bias", {3 * C}, {{h + "attn.c_attn.bias", {3 * C}}});
      add(b + "attn.proj.weight", {C, C}, {{h + "attn.c_proj.weight", {C, C}, true}});
      add(b + "attn.proj.bias", {C}, {{h + "attn.c_proj.bias", {C}}});
      add(b + "ln2.weight", {C}, {{h + "ln_2.weight", {C}}});
      add(b + "ln2.bias", {C}, {{h + "ln_2.bias", {C}}});
      add(b + "mlp.fc.weight", {4 * C, C}, {{h + "mlp.c_fc.weight", {C, 4 * C}, true}});
      add(b + "mlp.fc.bias", {4 * C}, {{h + "mlp.c_fc.bias", {4 * C}}});
      add(b + "mlp.proj.weight", {C, 4 * C}, {{h + "mlp.c_proj.weight", {4 * C, C}, true}});
      add(b + "mlp.proj.bias", {C}, {{h + "mlp.c_proj.bias", {C}}});
    }
    add("head.ln.weight", {C}, {{p + "ln_f.weight", {C}}});
    add("head.ln.bias", {C}, {{p + "ln_f.bias", {C}}});
    add("head.logits.weight", {V, C}, {{tied ? p + "wte.weight" : "lm_head.weight", {V, C}}})
        .write = !tied;
  } else if (spec.has_llama()) {
    const baton::v1::LlamaSpec& l = spec.llama();
    const int64_t V = l.vocab_size(), C = l.d_model(), H = l.heads(),
                  KV = l.kv_heads() > 0 ? l.kv_heads() : l.heads(), D = C / H,
                  I = l.intermediate_size();
    const bool tied = l.has_tie_embeddings() && l.tie_embeddings();
    add("embed.token", {V, C}, {{"model.embed_tokens.weight", {V, C}}});
    for (int i = 0; i < l.layers(); ++i) {
      const std::string b = absl::StrCat("block.", i, ".");
      const std::string h = absl::StrCat("model.layers.", i, ".");
      add(b + "attn_norm.weight", {C}, {{h + "input_layernorm.weight", {C}}});
      add(b + "attn.qkv.weight", {(H + 2 * KV) * D, C},
          {{h + "self_attn.q_proj.weight", {H * D, C}},
           {h + "self_attn.k_proj.weight", {KV * D, C}},
           {h + "self_attn.v_proj.weight", {KV * D, C}}});
      add(b + "attn.proj.weight", {C, H * D}, {{h + "self_attn.o_proj.weight", {C, H * D}}});
      add(b + "mlp_norm.weight", {C}, {{h + "post_attention_layernorm.weight", {C}}});
      add(b + "mlp.gate_up.weight", {2 * I, C},
          {{h + "mlp.gate_proj.weight", {I, C}}, {h + "mlp.up_proj.weight", {I, C}}});
      add(b + "mlp.down.weight", {C, I}, {{h + "mlp.down_proj.weight", {C, I}}});
    }
    add("head.norm.weight", {C}, {{"model.norm.weight", {C}}});
    add("head.logits.weight", {V, C},
        {{tied ? "model.embed_tokens.weight" : "lm_head.weight", {V, C}}})
        .write = !tied;
  }
  return t;
}

// The part's rows and columns as baton holds them.
std::pair<int64_t, int64_t> BatonRowsCols(const HfPart& part, int64_t rows) {
  const int64_t a = part.shape[0];
  const int64_t b = part.shape.size() > 1 ? part.shape[1] : 1;
  if (part.transpose) return {b, a};
  return {rows >= 0 ? rows : a, b};
}

// ---------------------------------------------------------------------------------------
// Reading the tensors

// A safetensors file opened for reading some of its tensors.
class Shard {
 public:
  ~Shard() {
    if (fd_ >= 0) close(fd_);
  }
  static absl::StatusOr<std::unique_ptr<Shard>> Open(const std::string& path) {
    auto s = std::unique_ptr<Shard>(new Shard());
    s->path_ = path;
    s->shown_ = EchoInput(path);
    s->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (s->fd_ < 0) return s->Errno("cannot open");
    struct stat st;
    if (fstat(s->fd_, &st) != 0) return s->Errno("cannot stat");
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": '", s->shown_, "' is not a regular file"));
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    std::string first8;
    BATON_RETURN_IF_ERROR(s->Read(0, std::min<uint64_t>(8, size), &first8));
    absl::StatusOr<uint64_t> n = SafetensorsHeaderLength(first8, size);
    if (!n.ok()) return s->Wrap(n.status());
    std::string header;
    BATON_RETURN_IF_ERROR(s->Read(8, *n, &header));
    s->data_start_ = 8 + *n;
    absl::StatusOr<Safetensors> parsed = ParseSafetensorsHeader(header, size - s->data_start_);
    if (!parsed.ok()) return s->Wrap(parsed.status());
    s->header_ = *std::move(parsed);
    return s;
  }

  // The path as messages quote it (EchoInput: an index names the files).
  const std::string& path() const { return shown_; }
  const Safetensors& header() const { return header_; }

  // The tensor `name` (in the header; its dtype F32, F16 or BF16, as HfFiles::Locate checked)
  // as a float32 host tensor.
  absl::StatusOr<Tensor> ReadFloat(const std::string& name) {
    SafetensorsEntry e = header_.tensors.at(name);
    std::string bytes;
    BATON_RETURN_IF_ERROR(Read(data_start_ + e.offset, SafetensorsDataBytes(e), &bytes));
    e.data = bytes;
    return EntryToTensor(e, Device::kCpu);
  }

 private:
  Shard() = default;
  absl::Status Errno(absl::string_view what) const {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(kField, ": ", what, " '", shown_, "'"));
  }
  absl::Status Wrap(const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat(kField, ": ", shown_, ": ", s.message()));
  }
  absl::Status Read(uint64_t offset, uint64_t bytes, std::string* out) const {
    out->resize(bytes);
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t n = pread(fd_, out->data() + done, bytes - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno("cannot read");
      if (n == 0) {
        return absl::DataLossError(
            absl::StrCat(kField, ": '", shown_, "' ended early (it changed while read?)"));
      }
      done += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  std::string path_;
  std::string shown_;  // path_ escaped for messages
  int fd_ = -1;
  uint64_t data_start_ = 0;
  Safetensors header_;
};

// A plain file name in the directory (an index must not send us elsewhere).
bool PlainFileName(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos;
}

// `file` in `dir`, confined to the roots like the directory.
absl::StatusOr<std::string> InDir(const std::string& dir, const std::string& file,
                                  const std::vector<std::string>& roots) {
  return ConfineDataPath((fs::path(dir) / file).string(), roots, kField);
}

// The tensors of a model directory: model.safetensors, or the shards
// model.safetensors.index.json names, each opened (its header read and checked) when first
// needed. Not thread-safe.
class HfFiles {
 public:
  static absl::StatusOr<HfFiles> Open(const std::string& dir,
                                      const std::vector<std::string>& roots) {
    HfFiles f;
    f.dir_ = dir;
    f.roots_ = roots;
    const std::string single = (fs::path(dir) / "model.safetensors").string();
    const std::string sharded = (fs::path(dir) / "model.safetensors.index.json").string();
    std::error_code ec;
    if (fs::exists(single, ec)) {
      f.described_ = EchoInput(single);
      BATON_ASSIGN_OR_RETURN(Shard * shard, f.ShardOf("model.safetensors"));
      for (const auto& [name, e] : shard->header().tensors) f.file_of_[name] = "model.safetensors";
      return f;
    }
    if (!fs::exists(sharded, ec)) {
      return absl::NotFoundError(absl::StrCat(kField, ": ", dir,
                                              " has neither model.safetensors nor "
                                              "model.safetensors.index.json"));
    }
    f.described_ = EchoInput(sharded);
    BATON_ASSIGN_OR_RETURN(const std::string path,
                           InDir(dir, "model.safetensors.index.json", roots));
    absl::StatusOr<std::string> text = ReadFile(
        path, {.what = "init.from_hf index", .max_bytes = kMaxJsonBytes, .regular_only = true});
    if (!text.ok()) return text.status();
    BATON_ASSIGN_OR_RETURN(const Struct json, ParseHfConfig(*text, sharded));
    const Value* map = Find(json, "weight_map");
    if (map == nullptr || map->kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": ", sharded, " has no \"weight_map\" object"));
    }
    for (const auto& [name, file] : map->struct_value().fields()) {
      if (file.kind_case() != Value::kStringValue || !PlainFileName(file.string_value())) {
        return absl::InvalidArgumentError(absl::StrCat(kField, ": ", sharded, ": weight_map[\"",
                                                       EchoInput(name), "\"] is ", Show(&file),
                                                       ", not a file name in the model directory"));
      }
      f.file_of_[name] = file.string_value();
    }
    return f;
  }

  // The shard holding `part` (as named, or without GPT-2's "transformer." prefix, as old hub
  // files name it) and its name there, its entry checked against the part's shape and a
  // readable dtype. `for_param` is the baton parameter, for errors.
  absl::StatusOr<std::pair<Shard*, std::string>> Locate(const HfPart& part,
                                                        const std::string& for_param) {
    std::string name = part.name;
    auto found = file_of_.find(name);
    if (found == file_of_.end() && absl::StartsWith(name, "transformer.")) {
      found = file_of_.find(name.substr(12));
      if (found != file_of_.end()) name = name.substr(12);
    }
    if (found == file_of_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": tensor ", part.name, " (for baton's ", for_param, ", want ",
                       ShapeString(part.shape), ") is not in ", described_));
    }
    BATON_ASSIGN_OR_RETURN(Shard * shard, ShardOf(found->second));
    const auto entry = shard->header().tensors.find(name);
    if (entry == shard->header().tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(kField, ": tensor ", name, " is not in ",
                                                     shard->path(), " (", described_,
                                                     " says it is)"));
    }
    const SafetensorsEntry& e = entry->second;
    if (e.shape != part.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": tensor ", name, " in ", shard->path(), " is ", e.file_dtype,
                       ShapeString(e.shape), "; baton's ", for_param, " wants ",
                       ShapeString(part.shape), " from config.json"));
    }
    if (e.dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(kField, ": tensor ", name, " in ",
                                                     shard->path(), " has dtype ", e.file_dtype,
                                                     "; want F32, F16 or BF16"));
    }
    return std::make_pair(shard, name);
  }

  // Locate, then the tensor's values as a float32 host tensor.
  absl::StatusOr<Tensor> Read(const HfPart& part, const std::string& for_param) {
    BATON_ASSIGN_OR_RETURN(const auto located, Locate(part, for_param));
    return located.first->ReadFloat(located.second);
  }

 private:
  HfFiles() = default;

  absl::StatusOr<Shard*> ShardOf(const std::string& file) {
    std::unique_ptr<Shard>& shard = shards_[file];
    if (shard == nullptr) {
      BATON_ASSIGN_OR_RETURN(const std::string path, InDir(dir_, file, roots_));
      BATON_ASSIGN_OR_RETURN(shard, Shard::Open(path));
    }
    return shard.get();
  }

  std::string dir_;
  std::vector<std::string> roots_;
  std::string described_;  // "DIR/model.safetensors" or "DIR/model.safetensors.index.json"
  std::map<std::string, std::string> file_of_;            // file name (in dir_) by tensor name
  std::map<std::string, std::unique_ptr<Shard>> shards_;  // by file name
};

// The directory spec.init().from_hf names, confined to the roots.
absl::StatusOr<std::string> HfDir(const std::string& from_hf,
                                  const std::vector<std::string>& roots) {
  if (from_hf.empty()) return absl::InvalidArgumentError("init.from_hf is empty");
  std::string path = from_hf;
  if (fs::path(from_hf).is_relative() && !roots.empty()) {
    std::error_code ec;
    for (const std::string& root : roots) {
      const fs::path candidate = fs::path(root) / from_hf;
      if (fs::exists(candidate, ec)) {
        path = candidate.string();
        break;
      }
    }
    if (path == from_hf) path = (fs::path(roots.front()) / from_hf).string();
  }
  return ConfineDataPath(path, roots, kField);
}

// Shortest decimal text that reads back as `f` (so 1e-5f is written "1e-05").
double ShortestDouble(float f) {
  for (int digits = 1; digits < 10; ++digits) {
    const std::string s = absl::StrFormat("%.*g", digits, static_cast<double>(f));
    const double d = std::strtod(s.c_str(), nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

}  // namespace

absl::StatusOr<Struct> ParseHfConfig(const std::string& json, const std::string& where) {
  Struct out;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  const auto st = google::protobuf::util::JsonStringToMessage(json, &out, opts);
  if (!st.ok()) {
    // Text that is not UTF-8 is named by its first bad byte; otherwise the parser's
    // description (JsonParseError).
    for (size_t i = 0; i < json.size();) {
      const unsigned char c = static_cast<unsigned char>(json[i]);
      const size_t n =
          c < 0x80 ? 1 : log_text_internal::Utf8SequenceLength(absl::string_view(json).substr(i));
      if (n == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s is not a JSON object: byte %d (0x%02X) is not UTF-8 text", where, i, c));
      }
      i += n;
    }
    const auto message = st.message();
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a JSON object: ",
                     JsonParseError(absl::string_view(message.data(), message.size()))));
  }
  return out;
}

absl::StatusOr<Struct> ReadHfConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  absl::StatusOr<std::string> text = ReadFile(
      path, {.what = "Hugging Face config", .max_bytes = kMaxJsonBytes, .regular_only = true});
  if (!text.ok()) return text.status();
  return ParseHfConfig(*text, path);
}

absl::StatusOr<baton::v1::ModelSpec> ModelSpecFromHfConfig(const Struct& config) {
  const Value* type = Find(config, "model_type");
  if (type != nullptr && type->kind_case() == Value::kStringValue) {
    if (type->string_value() == "gpt2") return Gpt2Spec(config);
    if (type->string_value() == "llama") return LlamaSpecOf(config);
  }
  return Refuse("model_type", type, "baton reads \"gpt2\" and \"llama\" models");
}

namespace {

// The spec's model family, for messages.
std::string SpecFamily(const baton::v1::ModelSpec& spec) {
  if (spec.has_gpt()) return "model.gpt";
  if (spec.has_llama()) return "model.llama";
  if (spec.has_mlp()) return "model.mlp";
  return "not set";
}

}  // namespace

absl::Status CheckSpecAgainstHf(const baton::v1::ModelSpec& spec, const Struct& config) {
  BATON_ASSIGN_OR_RETURN(const baton::v1::ModelSpec hf, ModelSpecFromHfConfig(config));
  struct Field {
    const char* spec_field;
    double spec_value;
    const char* key;
    double hf_value;
    bool at_most = false;  // the spec's value may be smaller (the context)
  };
  std::vector<Field> fields;
  std::string family;
  if (hf.has_gpt()) {
    if (!spec.has_gpt()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json model_type is \"gpt2\", a GPT-2, but the spec's model is ",
                       SpecFamily(spec), "; a GPT-2 loads into model.gpt"));
    }
    family = "model.gpt.";
    const baton::v1::GptSpec& s = spec.gpt();
    const baton::v1::GptSpec& h = hf.gpt();
    fields = {{"vocab_size", double(s.vocab_size()), "vocab_size", double(h.vocab_size())},
              {"context", double(s.context()), "n_positions", double(h.context()), true},
              {"d_model", double(s.d_model()), "n_embd", double(h.d_model())},
              {"heads", double(s.heads()), "n_head", double(h.heads())},
              {"layers", double(s.layers()), "n_layer", double(h.layers())},
              {"tie_embeddings", double(!s.has_tie_embeddings() || s.tie_embeddings()),
               "tie_word_embeddings", double(h.tie_embeddings())}};
  } else {
    if (!spec.has_llama()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json model_type is \"llama\", a LLaMA, but the spec's model is ",
                       SpecFamily(spec), "; a LLaMA loads into model.llama"));
    }
    family = "model.llama.";
    const baton::v1::LlamaSpec& s = spec.llama();
    const baton::v1::LlamaSpec& h = hf.llama();
    const float theta = s.rope_theta() > 0 ? s.rope_theta() : kDefaultRopeTheta;
    const float eps = s.rms_norm_eps() > 0 ? s.rms_norm_eps() : kDefaultRmsNormEps;
    fields = {
        {"vocab_size", double(s.vocab_size()), "vocab_size", double(h.vocab_size())},
        {"context", double(s.context()), "max_position_embeddings", double(h.context()), true},
        {"d_model", double(s.d_model()), "hidden_size", double(h.d_model())},
        {"heads", double(s.heads()), "num_attention_heads", double(h.heads())},
        {"kv_heads", double(s.kv_heads() > 0 ? s.kv_heads() : s.heads()), "num_key_value_heads",
         double(h.kv_heads())},
        {"layers", double(s.layers()), "num_hidden_layers", double(h.layers())},
        {"intermediate_size", double(s.intermediate_size()), "intermediate_size",
         double(h.intermediate_size())},
        {"rope_theta", double(theta), "rope_theta", double(h.rope_theta())},
        {"rms_norm_eps", double(eps), "rms_norm_eps", double(h.rms_norm_eps())},
        {"tie_embeddings", double(s.has_tie_embeddings() && s.tie_embeddings()),
         "tie_word_embeddings", double(h.tie_embeddings())}};
  }
  for (const Field& f : fields) {
    const bool ok = f.at_most ? f.spec_value <= f.hf_value : f.spec_value == f.hf_value;
    if (ok) continue;
    const bool boolean = absl::StrContains(f.key, "tie_");
    auto show = [&](double v) {
      if (boolean) return std::string(v != 0 ? "true" : "false");
      // Floats (epsilons, rope_theta) as their shortest text: 1e-05, not 9.99999975e-06.
      return absl::StrFormat("%.9g", v == std::floor(v) ? v : ShortestDouble(float(v)));
    };
    return absl::InvalidArgumentError(absl::StrCat(
        family, f.spec_field, " is ", show(f.spec_value), " but config.json ", f.key, " is ",
        show(f.hf_value), f.at_most ? " (the context may be at most that)" : ""));
  }
  return absl::OkStatus();
}

namespace {

// A model directory's config.json, checked against the model, and the mapping of the model's
// parameters onto its tensors.
struct HfModel {
  Struct config;
  int64_t positions = 0;                 // config.json n_positions or max_position_embeddings
  std::map<std::string, HfParam> table;  // by baton name
};

absl::StatusOr<HfModel> ReadHfModel(const baton::v1::ModelSpec& model, const std::string& dir,
                                    const std::vector<std::string>& roots) {
  BATON_ASSIGN_OR_RETURN(const std::string config_path, InDir(dir, "config.json", roots));
  absl::StatusOr<std::string> text =
      ReadFile(config_path,
               {.what = "init.from_hf config", .max_bytes = kMaxJsonBytes, .regular_only = true});
  if (!text.ok()) return text.status();
  HfModel out;
  BATON_ASSIGN_OR_RETURN(out.config, ParseHfConfig(*text, config_path));
  if (absl::Status s = CheckSpecAgainstHf(model, out.config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kField, ": ", s.message()));
  }
  BATON_ASSIGN_OR_RETURN(const baton::v1::ModelSpec hf, ModelSpecFromHfConfig(out.config));
  out.positions = hf.has_gpt() ? hf.gpt().context() : hf.llama().context();
  for (HfParam& p : HfTable(model, out.positions)) out.table.emplace(p.baton, std::move(p));
  return out;
}

}  // namespace

absl::Status CheckHfModelAtSubmit(const baton::v1::JobSpec& spec,
                                  const std::vector<std::string>& data_roots) {
  BATON_ASSIGN_OR_RETURN(const std::string dir, HfDir(spec.init().from_hf(), data_roots));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return absl::OkStatus();  // the workers' to find
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": '", EchoInput(dir),
                     "' is not a directory (a Hugging Face model directory holds config.json "
                     "and model.safetensors)"));
  }
  const std::pair<const char*, int64_t> files[] = {{"config.json", kMaxJsonBytes},
                                                   {"model.safetensors", -1},
                                                   {"model.safetensors.index.json", kMaxJsonBytes}};
  for (const auto& [file, max_bytes] : files) {
    BATON_RETURN_IF_ERROR(
        CheckDataFileAtSubmit((fs::path(dir) / file).string(), kField, max_bytes));
  }
  // The directory is here: what the workers would refuse is refused now. config.json
  // against the model, then every tensor the model maps: present, its shape, its dtype,
  // within its file (each header read, no tensor data).
  BATON_ASSIGN_OR_RETURN(HfModel hf, ReadHfModel(spec.model(), dir, data_roots));
  BATON_ASSIGN_OR_RETURN(HfFiles files_here, HfFiles::Open(dir, data_roots));
  for (const auto& [name, p] : hf.table) {
    for (const HfPart& part : p.parts) {
      BATON_RETURN_IF_ERROR(files_here.Locate(part, name).status());
    }
  }
  return absl::OkStatus();
}

absl::Status LoadHfWeights(const baton::v1::JobSpec& spec,
                           const std::vector<std::string>& data_roots, int first_block,
                           Sequential* blocks) {
  BATON_ASSIGN_OR_RETURN(const std::string dir, HfDir(spec.init().from_hf(), data_roots));
  BATON_ASSIGN_OR_RETURN(const HfModel hf, ReadHfModel(spec.model(), dir, data_roots));
  BATON_ASSIGN_OR_RETURN(HfFiles files, HfFiles::Open(dir, data_roots));
  const std::string where_block = absl::StrCat(" (model blocks from ", first_block, ")");
  for (Parameter* param : blocks->Parameters()) {
    const auto it = hf.table.find(param->name);
    if (it == hf.table.end()) {
      return absl::InvalidArgumentError(absl::StrCat(kField, ": baton parameter ", param->name,
                                                     where_block,
                                                     " has no Hugging Face counterpart"));
    }
    const HfParam& p = it->second;
    if (param->value.shape() != p.shape || param->value.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, ": baton parameter ", param->name, " is ", param->value.DebugString(),
          " but the Hugging Face mapping gives f32", ShapeString(p.shape)));
    }
    std::vector<float> host(static_cast<size_t>(NumElements(p.shape)));
    int64_t row = 0;
    const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
    for (const HfPart& part : p.parts) {
      BATON_ASSIGN_OR_RETURN(const Tensor t, files.Read(part, param->name));
      const float* src = t.f32();
      const auto [rows, part_cols] = BatonRowsCols(part, p.rows);
      if (part_cols != cols || row + rows > (p.shape.empty() ? 0 : p.shape[0])) {
        return absl::InternalError(
            absl::StrCat("hf: the mapping of ", param->name, " does not fit ", part.name));
      }
      float* dst = host.data() + row * cols;
      if (part.transpose) {
        // Hugging Face [a = cols, b = rows]: dst[j][i] = src[i][j].
        for (int64_t i = 0; i < cols; ++i) {
          for (int64_t j = 0; j < rows; ++j) dst[j * cols + i] = src[i * rows + j];
        }
      } else {
        std::memcpy(dst, src, static_cast<size_t>(rows * cols) * sizeof(float));
      }
      row += rows;
    }
    if (row * cols != static_cast<int64_t>(host.size())) {
      return absl::InternalError(
          absl::StrCat("hf: the mapping of ", param->name, " covers ", row, " rows"));
    }
    BATON_RETURN_IF_ERROR(param->value.CopyFromHost(host.data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HfConfigJson(const baton::v1::ModelSpec& spec, DType dtype,
                                         const Struct* imported) {
  int64_t positions = spec.has_gpt() ? spec.gpt().context() : spec.llama().context();
  if (imported != nullptr) {
    BATON_RETURN_IF_ERROR(CheckSpecAgainstHf(spec, *imported));
    BATON_ASSIGN_OR_RETURN(const baton::v1::ModelSpec hf, ModelSpecFromHfConfig(*imported));
    positions = hf.has_gpt() ? hf.gpt().context() : hf.llama().context();
  }
  Struct c;
  auto& f = *c.mutable_fields();
  auto num = [&](const char* k, double v) { f[k].set_number_value(v); };
  auto str = [&](const char* k, const std::string& v) { f[k].set_string_value(v); };
  auto boolean = [&](const char* k, bool v) { f[k].set_bool_value(v); };
  auto null = [&](const char* k) { f[k].set_null_value(google::protobuf::NULL_VALUE); };
  auto arch = [&](const char* a) {
    f["architectures"].mutable_list_value()->add_values()->set_string_value(a);
  };
  if (spec.has_gpt()) {
    const baton::v1::GptSpec& g = spec.gpt();
    arch("GPT2LMHeadModel");
    str("model_type", "gpt2");
    num("vocab_size", g.vocab_size());
    num("n_positions", static_cast<double>(positions));
    num("n_ctx", static_cast<double>(positions));
    num("n_embd", g.d_model());
    num("n_head", g.heads());
    num("n_layer", g.layers());
    null("n_inner");
    str("activation_function", "gelu_new");
    num("layer_norm_epsilon", kGpt2LayerNormEps);
    // baton has no dropout: the exported model trains as baton does.
    for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"}) {
      num(k, 0);
    }
    boolean("scale_attn_weights", true);
    boolean("scale_attn_by_inverse_layer_idx", false);
    boolean("reorder_and_upcast_attn", false);
    num("initializer_range", 0.02);
    boolean("tie_word_embeddings", !g.has_tie_embeddings() || g.tie_embeddings());
  } else if (spec.has_llama()) {
    const baton::v1::LlamaSpec& l = spec.llama();
    const double theta = ShortestDouble(l.rope_theta() > 0 ? l.rope_theta() : kDefaultRopeTheta);
    arch("LlamaForCausalLM");
    str("model_type", "llama");
    num("vocab_size", l.vocab_size());
    num("max_position_embeddings", static_cast<double>(positions));
    num("hidden_size", l.d_model());
    num("num_attention_heads", l.heads());
    num("num_key_value_heads", l.kv_heads() > 0 ? l.kv_heads() : l.heads());
    num("head_dim", l.d_model() / l.heads());
    num("num_hidden_layers", l.layers());
    num("intermediate_size", l.intermediate_size());
    str("hidden_act", "silu");
    num("rms_norm_eps",
        ShortestDouble(l.rms_norm_eps() > 0 ? l.rms_norm_eps() : kDefaultRmsNormEps));
    num("rope_theta", theta);
    null("rope_scaling");
    Struct& rp = *f["rope_parameters"].mutable_struct_value();
    (*rp.mutable_fields())["rope_type"].set_string_value("default");
    (*rp.mutable_fields())["rope_theta"].set_number_value(theta);
    boolean("attention_bias", false);
    boolean("mlp_bias", false);
    num("attention_dropout", 0);
    num("pretraining_tp", 1);
    num("initializer_range", 0.02);
    boolean("tie_word_embeddings", l.has_tie_embeddings() && l.tie_embeddings());
  } else {
    return absl::InvalidArgumentError(
        "a Hugging Face model is written for model.gpt or model.llama only");
  }
  // The tensors' type, under the key transformers 5 reads ("dtype") and the one earlier
  // versions read ("torch_dtype"): from_pretrained loads the parameters in it.
  const char* const type = dtype == DType::kBFloat16 ? "bfloat16" : "float32";
  str("torch_dtype", type);
  str("dtype", type);
  boolean("use_cache", true);
  if (imported != nullptr) {
    // Keys baton does not write (token ids, task settings, ...) are the import's; so are
    // those that do not change what the model computes (dropout, initialization). The
    // rest (dimensions, norms, rotary, dtype) are baton's, equal to the import's where
    // CheckSpecAgainstHf compared them.
    static constexpr const char* kImportsOwn[] = {"n_ctx",
                                                  "resid_pdrop",
                                                  "embd_pdrop",
                                                  "attn_pdrop",
                                                  "summary_first_dropout",
                                                  "attention_dropout",
                                                  "initializer_range",
                                                  "pretraining_tp",
                                                  "use_cache"};
    for (const auto& [key, value] : imported->fields()) {
      const bool imports_own =
          std::find(std::begin(kImportsOwn), std::end(kImportsOwn), key) != std::end(kImportsOwn);
      if (imports_own || f.find(key) == f.end()) f[key] = value;
    }
  }
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  const auto st = google::protobuf::util::MessageToJsonString(c, &out, opts);
  if (!st.ok()) return absl::InternalError(absl::StrCat("config.json: ", st.ToString()));
  return out;
}

absl::Status WriteHfModel(const baton::v1::ModelSpec& spec,
                          const std::map<std::string, const Tensor*>& params_by_baton_name,
                          const std::string& dir, const HfExportOptions& options) {
  const DType dtype = options.dtype;
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("hf export: weights are written as f32 or bf16, not ", DTypeName(dtype)));
  }
  int64_t positions = spec.has_gpt() ? spec.gpt().context() : spec.llama().context();
  std::optional<HfModel> base;
  std::optional<HfFiles> base_files;
  if (!options.base_dir.empty()) {
    absl::StatusOr<HfModel> read = ReadHfModel(spec, options.base_dir, {});
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrCat("hf export: the base model ", options.base_dir, ": ",
                                       read.status().message()));
    }
    base = *std::move(read);
    positions = base->positions;
    BATON_ASSIGN_OR_RETURN(base_files, HfFiles::Open(options.base_dir, {}));
  }
  BATON_ASSIGN_OR_RETURN(const std::string config,
                         HfConfigJson(spec, dtype, base ? &base->config : nullptr));
  std::vector<Tensor> tensors;  // kept alive for `named`
  std::vector<std::string> names;
  for (const HfParam& p : HfTable(spec, positions)) {
    if (!p.write) continue;
    const auto it = params_by_baton_name.find(p.baton);
    if (it == params_by_baton_name.end() || it->second == nullptr || !it->second->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("hf export: the model has no parameter ", p.baton));
    }
    const Tensor& value = *it->second;
    if (value.shape() != p.shape || value.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("hf export: parameter ", p.baton, " is ",
                                                     value.DebugString(), ", want f32",
                                                     ShapeString(p.shape)));
    }
    std::vector<float> host(static_cast<size_t>(value.numel()));
    BATON_RETURN_IF_ERROR(value.CopyToHost(host.data()));
    const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
    int64_t row = 0;
    for (const HfPart& part : p.parts) {
      const auto [rows, part_cols] = BatonRowsCols(part, p.rows);
      Tensor t = Tensor::Empty(part.shape);
      const float* src = host.data() + row * cols;
      float* dst = t.f32();
      if (part.transpose) {
        for (int64_t i = 0; i < cols; ++i) {
          for (int64_t j = 0; j < rows; ++j) dst[i * rows + j] = src[j * cols + i];
        }
      } else {
        std::memcpy(dst, src, static_cast<size_t>(rows * part_cols) * sizeof(float));
      }
      if (!part.transpose && rows < part.shape[0]) {
        // GPT-2's position rows past the context: baton never trained them, so they are
        // the imported ones (HfTable gives the part more rows only with a base).
        BATON_ASSIGN_OR_RETURN(const Tensor imported, base_files->Read(part, p.baton));
        std::memcpy(dst + rows * part_cols, imported.f32() + rows * part_cols,
                    static_cast<size_t>((part.shape[0] - rows) * part_cols) * sizeof(float));
      }
      row += rows;
      if (dtype == DType::kBFloat16) {
        Tensor b = Tensor::Empty(t.shape(), DType::kBFloat16);
        CpuBackend()->ToBf16(t.numel(), t.f32(), b.bf16());
        t = std::move(b);
      }
      tensors.push_back(std::move(t));
      names.push_back(part.name);
    }
  }
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < tensors.size(); ++i) named.push_back({names[i], &tensors[i]});
  BATON_ASSIGN_OR_RETURN(const std::string file, EncodeSafetensors(named, {{"format", "pt"}}));
  // The base's files that are not weights, byte for byte.
  std::vector<std::pair<std::string, std::string>> carried;  // name, bytes
  if (base) {
    for (const char* name : kHfCarriedFiles) {
      const std::string from = (fs::path(options.base_dir) / name).string();
      std::error_code ec;
      if (!fs::exists(from, ec)) continue;
      absl::StatusOr<std::string> bytes = ReadFile(from, {.what = "hf export: the base model's",
                                                          .max_bytes = kMaxJsonBytes,
                                                          .regular_only = true});
      if (!bytes.ok()) return bytes.status();
      carried.emplace_back(name, *std::move(bytes));
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("hf export: cannot create ", dir, ": ", ec.message()));
  }
  for (const auto& [name, bytes] : carried) {
    BATON_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / name).string(), bytes));
  }
  BATON_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / "config.json").string(), config));
  return WriteFileAtomically((fs::path(dir) / "model.safetensors").string(), file);
}

}  // namespace baton
