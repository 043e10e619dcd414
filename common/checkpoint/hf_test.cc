#include "common/checkpoint/hf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/file.h"
#include "common/core/log_text.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A block holding parameters only: the mapping is tested without the model's layers.
class ParamBag final : public Module {
 public:
  explicit ParamBag(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch&, const Tensor&, Tensor*) override {
    return absl::UnimplementedError("bag");
  }
  absl::Status BackwardInput(const MicroBatch&, const Tensor&, Tensor*) override {
    return absl::UnimplementedError("bag");
  }
  absl::Status BackwardWeight(const MicroBatch&) override {
    return absl::UnimplementedError("bag");
  }
  void CollectParameters(std::vector<Parameter*>* out) override {
    for (Parameter& p : params_) out->push_back(&p);
  }
  int InFlight() const override { return 0; }
  void Discard(int) override {}
  void Add(std::string name, const Shape& shape) {
    Parameter p;
    p.name = std::move(name);
    p.value = Tensor::Zeros(shape);
    params_.push_back(std::move(p));
  }

 private:
  std::string name_;
  std::vector<Parameter> params_;
};

// Every parameter of the model by block, as baton names and shapes them (model.h).
std::vector<std::pair<std::string, std::vector<std::pair<std::string, Shape>>>> Layout(
    const baton::v1::ModelSpec& spec) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, Shape>>>> out;
  if (spec.has_gpt()) {
    const auto& g = spec.gpt();
    const int64_t V = g.vocab_size(), T = g.context(), C = g.d_model();
    out.push_back({"embed", {{"embed.token", {V, C}}, {"embed.position", {T, C}}}});
    for (int i = 0; i < g.layers(); ++i) {
      const std::string b = absl::StrCat("block.", i);
      out.push_back({b,
                     {{b + ".ln1.weight", {C}},
                      {b + ".ln1.bias", {C}},
                      {b + ".attn.qkv.weight", {3 * C, C}},
                      {b + ".attn.qkv.bias", {3 * C}},
                      {b + ".attn.proj.weight", {C, C}},
                      {b + ".attn.proj.bias", {C}},
                      {b + ".ln2.weight", {C}},
                      {b + ".ln2.bias", {C}},
                      {b + ".mlp.fc.weight", {4 * C, C}},
                      {b + ".mlp.fc.bias", {4 * C}},
                      {b + ".mlp.proj.weight", {C, 4 * C}},
                      {b + ".mlp.proj.bias", {C}}}});
    }
    out.push_back(
        {"head", {{"head.ln.weight", {C}}, {"head.ln.bias", {C}}, {"head.logits.weight", {V, C}}}});
  } else {
    const auto& l = spec.llama();
    const int64_t V = l.vocab_size(), C = l.d_model(), H = l.heads(), KV = l.kv_heads(), D = C / H,
                  I = l.intermediate_size();
    out.push_back({"embed", {{"embed.token", {V, C}}}});
    for (int i = 0; i < l.layers(); ++i) {
      const std::string b = absl::StrCat("block.", i);
      out.push_back({b,
                     {{b + ".attn_norm.weight", {C}},
                      {b + ".attn.qkv.weight", {(H + 2 * KV) * D, C}},
                      {b + ".attn.proj.weight", {C, C}},
                      {b + ".mlp_norm.weight", {C}},
                      {b + ".mlp.gate_up.weight", {2 * I, C}},
                      {b + ".mlp.down.weight", {C, I}}}});
    }
    out.push_back({"head", {{"head.norm.weight", {C}}, {"head.logits.weight", {V, C}}}});
  }
  return out;
}

// Blocks [first, last) of the model, parameters zero (or random from `seed` when not 0).
std::unique_ptr<Sequential> Bags(const baton::v1::ModelSpec& spec, int first, int last,
                                 uint32_t seed) {
  auto layout = Layout(spec);
  if (last < 0) last = static_cast<int>(layout.size());
  std::vector<std::unique_ptr<Module>> blocks;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int b = first; b < last; ++b) {
    auto bag = std::make_unique<ParamBag>(layout[b].first);
    for (const auto& [name, shape] : layout[b].second) bag->Add(name, shape);
    if (seed != 0) {
      for (Parameter* p : bag->Parameters()) {
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = normal(rng);
      }
    }
    blocks.push_back(std::move(bag));
  }
  return std::make_unique<Sequential>("model", std::move(blocks));
}

std::map<std::string, const Tensor*> ByName(Sequential& model) {
  std::map<std::string, const Tensor*> out;
  for (Parameter* p : model.Parameters()) out[p->name] = &p->value;
  return out;
}

baton::v1::ModelSpec Gpt(bool tied) {
  baton::v1::ModelSpec s;
  auto* g = s.mutable_gpt();
  g->set_vocab_size(11);
  g->set_context(6);
  g->set_d_model(8);
  g->set_heads(2);
  g->set_layers(2);
  g->set_tie_embeddings(tied);
  return s;
}

baton::v1::ModelSpec Llama() {
  baton::v1::ModelSpec s;
  auto* l = s.mutable_llama();
  l->set_vocab_size(13);
  l->set_context(8);
  l->set_d_model(16);
  l->set_heads(4);
  l->set_kv_heads(2);
  l->set_layers(2);
  l->set_intermediate_size(24);
  l->set_rope_theta(10000.0f);
  l->set_rms_norm_eps(1e-5f);
  l->set_tie_embeddings(false);
  return s;
}

class HfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "hf_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a random model to dir_/name and returns the source model.
  std::unique_ptr<Sequential> Written(const baton::v1::ModelSpec& spec, const std::string& name,
                                      uint32_t seed = 7) {
    auto model = Bags(spec, 0, -1, seed);
    EXPECT_TRUE(WriteHfModel(spec, ByName(*model), (dir_ / name).string()).ok());
    return model;
  }

  absl::Status Load(const baton::v1::ModelSpec& spec, const std::string& name, int first,
                    Sequential* blocks, const std::vector<std::string>& roots = {}) {
    baton::v1::JobSpec job;
    *job.mutable_model() = spec;
    job.mutable_init()->set_from_hf((dir_ / name).string());
    return LoadHfWeights(job, roots, first, blocks);
  }

  static void ExpectSame(Sequential& a, Sequential& b) {
    auto pa = a.Parameters();
    auto pb = b.Parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      ASSERT_EQ(pa[i]->name, pb[i]->name);
      ASSERT_EQ(pa[i]->value.shape(), pb[i]->value.shape());
      EXPECT_EQ(std::memcmp(pa[i]->value.f32(), pb[i]->value.f32(), pa[i]->value.nbytes()), 0)
          << pa[i]->name;
    }
  }

  Safetensors ReadFile(const std::string& name) {
    bytes_ = *baton::ReadFile((dir_ / name / "model.safetensors").string());
    return *ParseSafetensors(bytes_);
  }

  // Rewrites dir_/name/model.safetensors with `edit` applied to its tensors (host copies).
  void Rewrite(const std::string& name,
               const std::function<void(std::vector<std::pair<std::string, Tensor>>*)>& edit) {
    Safetensors st = ReadFile(name);
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const std::string& n : st.order)
      ts.push_back({n, *EntryToTensor(st.tensors.at(n), Device::kCpu)});
    edit(&ts);
    std::vector<NamedTensor> named;
    for (auto& [n, t] : ts) named.push_back({n, &t});
    ASSERT_TRUE(WriteFileAtomically((dir_ / name / "model.safetensors").string(),
                                    *EncodeSafetensors(named, {{"format", "pt"}}))
                    .ok());
  }

  std::string Config(const std::string& name) {
    return *baton::ReadFile((dir_ / name / "config.json").string());
  }
  void SetConfig(const std::string& name, const std::string& text) {
    ASSERT_TRUE(WriteFileAtomically((dir_ / name / "config.json").string(), text).ok());
  }

  fs::path dir_;
  std::string bytes_;
};

TEST_F(HfTest, Gpt2RoundTripsBitExactTiedAndUntied) {
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    baton::v1::ModelSpec spec = Gpt(tied);
    auto src = Written(spec, "gpt");
    if (tied) {
      // The head is a copy of the embedding, as baton keeps it.
      auto ps = src->Parameters();
      std::memcpy(ps.back()->value.f32(), ps.front()->value.f32(), ps.front()->value.nbytes());
    }
    ASSERT_TRUE(WriteHfModel(spec, ByName(*src), (dir_ / "gpt").string()).ok());
    auto dst = Bags(spec, 0, -1, 0);
    ASSERT_TRUE(Load(spec, "gpt", 0, dst.get()).ok());
    ExpectSame(*src, *dst);

    Safetensors st = ReadFile("gpt");
    EXPECT_EQ(st.tensors.contains("lm_head.weight"), !tied);
    EXPECT_EQ(st.metadata.at("format"), "pt");
    // Conv1D: c_attn.weight is [C, 3C], the transpose of baton's qkv.weight.
    const SafetensorsEntry& attn = st.tensors.at("transformer.h.1.attn.c_attn.weight");
    ASSERT_EQ(attn.shape, (Shape{8, 24}));
    Tensor hf = *EntryToTensor(attn, Device::kCpu);
    const Tensor& qkv = *ByName(*src).at("block.1.attn.qkv.weight");
    EXPECT_EQ(hf.f32()[3 * 24 + 17], qkv.f32()[17 * 8 + 3]);
    EXPECT_THAT(Config("gpt"), HasSubstr("\"GPT2LMHeadModel\""));
  }
}

TEST_F(HfTest, LlamaWithGroupedQueryAttentionRoundTripsBitExact) {
  baton::v1::ModelSpec spec = Llama();
  auto src = Written(spec, "llama");
  auto dst = Bags(spec, 0, -1, 0);
  ASSERT_TRUE(Load(spec, "llama", 0, dst.get()).ok());
  ExpectSame(*src, *dst);
  Safetensors st = ReadFile("llama");
  EXPECT_EQ(st.tensors.at("model.layers.0.self_attn.q_proj.weight").shape, (Shape{16, 16}));
  EXPECT_EQ(st.tensors.at("model.layers.0.self_attn.k_proj.weight").shape, (Shape{8, 16}));
  EXPECT_EQ(st.tensors.at("model.layers.0.mlp.up_proj.weight").shape, (Shape{24, 16}));
  EXPECT_TRUE(st.tensors.contains("lm_head.weight"));
  // v_proj is the last 8 rows of qkv; up_proj the second half of gate_up.
  Tensor v = *EntryToTensor(st.tensors.at("model.layers.1.self_attn.v_proj.weight"), Device::kCpu);
  EXPECT_EQ(
      std::memcmp(v.f32(), ByName(*src).at("block.1.attn.qkv.weight")->f32() + 24 * 16, v.nbytes()),
      0);
  // The config reads back as the same model.
  auto config = ParseHfConfig(Config("llama"));
  ASSERT_TRUE(config.ok());
  auto back = ModelSpecFromHfConfig(*config);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->DebugString(), spec.DebugString());
}

// transformers reads "dtype" (and, before version 5, "torch_dtype") for the parameters'
// type: both must name what the tensors are, or a bf16 export loads as float32.
TEST_F(HfTest, TheConfigNamesTheTensorsDtypeUnderBothKeys) {
  for (const baton::v1::ModelSpec& spec : {Gpt(true), Llama()}) {
    auto src = Bags(spec, 0, -1, 7);
    for (const auto& [dtype, name, safetensors] :
         {std::tuple{DType::kFloat32, "float32", "F32"},
          std::tuple{DType::kBFloat16, "bfloat16", "BF16"}}) {
      HfExportOptions options;
      options.dtype = dtype;
      ASSERT_TRUE(WriteHfModel(spec, ByName(*src), (dir_ / "m").string(), options).ok());
      const std::string config = Config("m");
      EXPECT_THAT(config, HasSubstr(absl::StrCat("\"dtype\": \"", name, "\"")));
      EXPECT_THAT(config, HasSubstr(absl::StrCat("\"torch_dtype\": \"", name, "\"")));
      EXPECT_EQ(ReadFile("m").tensors.begin()->second.file_dtype, safetensors) << name;
    }
  }
}

TEST_F(HfTest, ATiedLlamaIsWrittenWithoutLmHead) {
  baton::v1::ModelSpec spec = Llama();
  spec.mutable_llama()->set_tie_embeddings(true);
  auto src = Written(spec, "llama");
  auto ps = src->Parameters();
  std::memcpy(ps.back()->value.f32(), ps.front()->value.f32(), ps.front()->value.nbytes());
  ASSERT_TRUE(WriteHfModel(spec, ByName(*src), (dir_ / "llama").string()).ok());
  EXPECT_FALSE(ReadFile("llama").tensors.contains("lm_head.weight"));
  EXPECT_THAT(Config("llama"), HasSubstr("\"tie_word_embeddings\": true"));
  auto dst = Bags(spec, 0, -1, 0);
  ASSERT_TRUE(Load(spec, "llama", 0, dst.get()).ok());
  ExpectSame(*src, *dst);
}

TEST_F(HfTest, AStageLoadsOnlyItsBlocksFromAShardedIndex) {
  baton::v1::ModelSpec spec = Llama();
  auto src = Written(spec, "llama");
  // Split into two shards: the embedding alone, and the rest.
  Safetensors st = ReadFile("llama");
  std::vector<std::pair<std::string, Tensor>> a, b;
  for (const std::string& n : st.order) {
    (n == "model.embed_tokens.weight" ? a : b)
        .push_back({n, *EntryToTensor(st.tensors.at(n), Device::kCpu)});
  }
  std::string map;
  for (auto* part : {&a, &b}) {
    std::vector<NamedTensor> named;
    const std::string file =
        part == &a ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    for (auto& [n, t] : *part) {
      named.push_back({n, &t});
      absl::StrAppend(&map, map.empty() ? "" : ",", "\"", n, "\":\"", file, "\"");
    }
    ASSERT_TRUE(WriteFileAtomically((dir_ / "llama" / file).string(),
                                    *EncodeSafetensors(named, {{"format", "pt"}}))
                    .ok());
  }
  fs::remove(dir_ / "llama" / "model.safetensors");
  ASSERT_TRUE(WriteFileAtomically((dir_ / "llama" / "model.safetensors.index.json").string(),
                                  absl::StrCat("{\"metadata\":{},\"weight_map\":{", map, "}}"))
                  .ok());
  auto whole = Bags(spec, 0, -1, 0);
  ASSERT_TRUE(Load(spec, "llama", 0, whole.get()).ok());
  ExpectSame(*src, *whole);
  // Blocks 1..2 (block.0, block.1) need nothing from the first shard: remove it.
  fs::remove(dir_ / "llama" / "model-00001-of-00002.safetensors");
  auto stage = Bags(spec, 1, 3, 0);
  absl::Status s = Load(spec, "llama", 1, stage.get());
  ASSERT_TRUE(s.ok()) << s;
  auto src_params = ByName(*src);
  for (Parameter* p : stage->Parameters()) {
    EXPECT_EQ(std::memcmp(p->value.f32(), src_params.at(p->name)->f32(), p->value.nbytes()), 0)
        << p->name;
  }
  auto embed = Bags(spec, 0, 1, 0);
  EXPECT_THAT(Load(spec, "llama", 0, embed.get()).message(),
              HasSubstr("model-00001-of-00002.safetensors"));
}

TEST_F(HfTest, Bf16AndF16TensorsLoad) {
  baton::v1::ModelSpec spec = Gpt(true);
  auto src = Written(spec, "gpt");
  // Values that bf16 holds exactly: round each to bf16 and store the upper halves.
  Safetensors st = ReadFile("gpt");
  std::string header = "{";
  std::string data;
  std::map<std::string, std::vector<float>> want;
  int k = 0;
  for (const std::string& n : st.order) {
    Tensor t = *EntryToTensor(st.tensors.at(n), Device::kCpu);
    const bool bf16 = (k++ % 2) == 0;
    std::vector<float>& w = want[n];
    const size_t begin = data.size();
    for (int64_t i = 0; i < t.numel(); ++i) {
      float f = t.f32()[i];
      uint16_t h;
      if (bf16) {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        h = static_cast<uint16_t>(bits >> 16);
        bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&f, &bits, 4);
      } else {
        // Small halves: i / 1024 - 1 (exact in f16, normal and subnormal alike).
        f = (i % 3 == 0) ? std::ldexp(static_cast<float>(i % 7), -20)
                         : static_cast<float>(i) / 1024.0f - 1.0f;
        // Encode to f16 by hand for these values.
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint32_t sign = (bits >> 16) & 0x8000;
        const int exp = static_cast<int>((bits >> 23) & 0xff) - 127;
        const uint32_t mant = bits & 0x7fffff;
        if (f == 0.0f) {
          h = static_cast<uint16_t>(sign);
        } else if (exp < -14) {  // subnormal
          h = static_cast<uint16_t>(sign | ((mant | 0x800000) >> (-exp - 14 + 13)));
        } else {
          h = static_cast<uint16_t>(sign | ((exp + 15) << 10) | (mant >> 13));
        }
      }
      w.push_back(f);
      data.push_back(static_cast<char>(h & 0xff));
      data.push_back(static_cast<char>(h >> 8));
    }
    absl::StrAppend(&header, header.size() > 1 ? "," : "", "\"", n, "\":{\"dtype\":\"",
                    bf16 ? "BF16" : "F16", "\",\"shape\":[", absl::StrJoin(t.shape(), ","),
                    "],\"data_offsets\":[", begin, ",", data.size(), "]}");
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header + data;
  ASSERT_TRUE(WriteFileAtomically((dir_ / "gpt" / "model.safetensors").string(), file).ok());
  auto dst = Bags(spec, 0, -1, 0);
  absl::Status s = Load(spec, "gpt", 0, dst.get());
  ASSERT_TRUE(s.ok()) << s;
  auto got = ByName(*dst);
  // embed.token <- wte (BF16, the first tensor written).
  const std::vector<float>& wte = want.at("transformer.wte.weight");
  EXPECT_EQ(std::memcmp(got.at("embed.token")->f32(), wte.data(), wte.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got.at("head.logits.weight")->f32(), wte.data(), wte.size() * 4), 0);
  const std::vector<float>& ln = want.at("transformer.h.0.ln_1.weight");
  EXPECT_EQ(std::memcmp(got.at("block.0.ln1.weight")->f32(), ln.data(), ln.size() * 4), 0);
  const std::vector<float>& bias = want.at("transformer.h.0.ln_1.bias");
  EXPECT_EQ(std::memcmp(got.at("block.0.ln1.bias")->f32(), bias.data(), bias.size() * 4), 0);
}

TEST_F(HfTest, OldHubNamesWithoutThePrefixAndAShorterContextLoad) {
  baton::v1::ModelSpec spec = Gpt(true);
  auto src = Written(spec, "gpt");
  Rewrite("gpt", [](std::vector<std::pair<std::string, Tensor>>* ts) {
    for (auto& [n, t] : *ts) {
      if (n.rfind("transformer.", 0) == 0) n = n.substr(12);
    }
    ts->push_back({"h.0.attn.bias", Tensor::Zeros({1, 1, 6, 6})});  // a buffer: ignored
  });
  baton::v1::ModelSpec shorter = spec;
  shorter.mutable_gpt()->set_context(4);
  auto dst = Bags(shorter, 0, -1, 0);
  absl::Status s = Load(shorter, "gpt", 0, dst.get());
  ASSERT_TRUE(s.ok()) << s;
  const Tensor& want = *ByName(*src).at("embed.position");
  const Tensor& got = *ByName(*dst).at("embed.position");
  EXPECT_EQ(std::memcmp(got.f32(), want.f32(), got.nbytes()), 0);  // rows 0..3 of 6
  EXPECT_EQ(std::memcmp(ByName(*dst).at("embed.token")->f32(),
                        ByName(*src).at("embed.token")->f32(), 11 * 8 * 4),
            0);
}

TEST_F(HfTest, AMissingOrMisshapenTensorIsNamed) {
  baton::v1::ModelSpec spec = Gpt(false);
  Written(spec, "gpt");
  Rewrite("gpt", [](std::vector<std::pair<std::string, Tensor>>* ts) {
    std::erase_if(*ts, [](const auto& e) { return e.first == "transformer.h.1.mlp.c_fc.bias"; });
  });
  auto dst = Bags(spec, 0, -1, 0);
  absl::Status s = Load(spec, "gpt", 0, dst.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("transformer.h.1.mlp.c_fc.bias"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("[32]"));

  Written(spec, "gpt");
  Rewrite("gpt", [](std::vector<std::pair<std::string, Tensor>>* ts) {
    for (auto& [n, t] : *ts) {
      if (n == "lm_head.weight") t = Tensor::Zeros({10, 8});
    }
  });
  s = Load(spec, "gpt", 0, dst.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lm_head.weight"));
  EXPECT_THAT(s.message(), HasSubstr("[10,8]"));
  EXPECT_THAT(s.message(), HasSubstr("[11,8]"));
  EXPECT_THAT(s.message(), HasSubstr((dir_ / "gpt" / "model.safetensors").string()));

  Written(spec, "gpt");
  Rewrite("gpt", [](std::vector<std::pair<std::string, Tensor>>* ts) {
    for (auto& [n, t] : *ts) {
      if (n == "transformer.ln_f.bias") t = Tensor::Zeros({8}, DType::kInt32);
    }
  });
  s = Load(spec, "gpt", 0, dst.get());
  EXPECT_THAT(s.message(), HasSubstr("transformer.ln_f.bias"));
  EXPECT_THAT(s.message(), HasSubstr("I32"));
}

TEST_F(HfTest, TheDirectoryIsConfinedToTheDataRoots) {
  baton::v1::ModelSpec spec = Gpt(true);
  Written(spec, "gpt");
  auto dst = Bags(spec, 0, -1, 0);
  fs::create_directories(dir_ / "root");
  absl::Status s = Load(spec, "gpt", 0, dst.get(), {(dir_ / "root").string()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("init.from_hf"));
  // A relative path is looked up under the roots.
  baton::v1::JobSpec job;
  *job.mutable_model() = spec;
  job.mutable_init()->set_from_hf("gpt");
  EXPECT_TRUE(LoadHfWeights(job, {(dir_ / "root").string(), dir_.string()}, 0, dst.get()).ok());
}

TEST_F(HfTest, TheSpecMustMatchTheConfig) {
  baton::v1::ModelSpec spec = Gpt(true);
  Written(spec, "gpt");
  auto config = *ParseHfConfig(Config("gpt"));
  EXPECT_TRUE(CheckSpecAgainstHf(spec, config).ok());
  baton::v1::ModelSpec other = spec;
  other.mutable_gpt()->set_d_model(64);
  EXPECT_EQ(CheckSpecAgainstHf(other, config).message(),
            "model.gpt.d_model is 64 but config.json n_embd is 8");
  other = spec;
  other.mutable_gpt()->set_context(7);
  EXPECT_THAT(CheckSpecAgainstHf(other, config).message(),
              HasSubstr("model.gpt.context is 7 but config.json n_positions is 6"));
  other = spec;
  other.mutable_gpt()->clear_tie_embeddings();  // unset = tied: agrees
  EXPECT_TRUE(CheckSpecAgainstHf(other, config).ok());
  other.mutable_gpt()->set_tie_embeddings(false);
  EXPECT_THAT(
      CheckSpecAgainstHf(other, config).message(),
      HasSubstr("model.gpt.tie_embeddings is false but config.json tie_word_embeddings is true"));
  EXPECT_THAT(CheckSpecAgainstHf(Llama(), config).message(),
              HasSubstr("config.json model_type is \"gpt2\""));

  baton::v1::ModelSpec llama = Llama();
  Written(llama, "llama");
  auto lconfig = *ParseHfConfig(Config("llama"));
  EXPECT_TRUE(CheckSpecAgainstHf(llama, lconfig).ok());
  llama.mutable_llama()->set_kv_heads(4);
  EXPECT_EQ(CheckSpecAgainstHf(llama, lconfig).message(),
            "model.llama.kv_heads is 4 but config.json num_key_value_heads is 2");
  llama = Llama();
  llama.mutable_llama()->set_rope_theta(500000);
  EXPECT_THAT(CheckSpecAgainstHf(llama, lconfig).message(),
              HasSubstr("model.llama.rope_theta is 500000 but config.json rope_theta is 10000"));
  // A load checks it too, and names init.from_hf.
  auto dst = Bags(other, 0, -1, 0);
  EXPECT_THAT(Load(other, "gpt", 0, dst.get()).message(), HasSubstr("init.from_hf: model.gpt"));
}

struct Refusal {
  const char* family;  // "gpt2" or "llama"
  const char* json;    // merged into a valid config (top-level keys replaced)
  const char* key;     // what the error must name
};

std::string Gpt2Config(const std::string& extra) {
  return absl::StrCat(R"({"model_type":"gpt2","architectures":["GPT2LMHeadModel"],"vocab_size":50,)"
                      R"("n_positions":16,"n_embd":8,"n_head":2,"n_layer":1,"n_inner":null,)"
                      R"("activation_function":"gelu_new","layer_norm_epsilon":1e-05)",
                      extra, "}");
}
std::string LlamaConfig(const std::string& extra) {
  return absl::StrCat(
      R"({"model_type":"llama","architectures":["LlamaForCausalLM"],"vocab_size":50,)"
      R"("max_position_embeddings":16,"hidden_size":8,"num_attention_heads":2,)"
      R"("num_key_value_heads":1,"num_hidden_layers":1,"intermediate_size":12,)"
      R"("hidden_act":"silu","rms_norm_eps":1e-06,"rope_theta":10000.0,"rope_scaling":null)",
      extra, "}");
}

TEST(HfConfig, ReadsGpt2AndLlamaWithTheirDefaults) {
  auto g = ModelSpecFromHfConfig(*ParseHfConfig(Gpt2Config("")));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->gpt().vocab_size(), 50);
  EXPECT_EQ(g->gpt().context(), 16);
  EXPECT_TRUE(g->gpt().tie_embeddings());
  auto l = ModelSpecFromHfConfig(*ParseHfConfig(LlamaConfig("")));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->llama().kv_heads(), 1);
  EXPECT_EQ(l->llama().intermediate_size(), 12);
  EXPECT_FALSE(l->llama().tie_embeddings());
  EXPECT_EQ(l->llama().rms_norm_eps(), 1e-6f);
  // transformers 5 keeps rope_theta in rope_parameters.
  auto v5 = ModelSpecFromHfConfig(*ParseHfConfig(absl::StrReplaceAll(
      LlamaConfig(R"(,"rope_parameters":{"rope_type":"default","rope_theta":500000.0})"),
      {{"\"rope_theta\":10000.0,", ""}})));
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ(v5->llama().rope_theta(), 500000.0f);
}

TEST(HfConfig, RefusesWhatBatonDoesNotComputeNamingTheKey) {
  const std::vector<Refusal> refusals = {
      {"gpt2", R"(,"model_type":"gpt_neox")", "model_type"},
      {"gpt2", R"(,"architectures":["GPT2ForSequenceClassification"])", "architectures"},
      {"llama", R"(,"rope_scaling":{"type":"linear","factor":2.0})", "rope_scaling"},
      {"llama", R"(,"rope_parameters":{"rope_type":"llama3","rope_theta":10000})",
       "rope_parameters.rope_type"},
      {"llama", R"(,"num_local_experts":8)", "num_local_experts"},
      {"llama", R"(,"num_experts":8)", "num_experts"},
      {"llama", R"(,"n_routed_experts":8)", "n_routed_experts"},
      {"llama", R"(,"sliding_window":4096)", "sliding_window"},
      {"llama", R"(,"attention_bias":true)", "attention_bias"},
      {"llama", R"(,"mlp_bias":true)", "mlp_bias"},
      {"llama", R"(,"hidden_act":"gelu")", "hidden_act"},
      {"llama", R"(,"head_dim":8)", "head_dim"},
      {"llama", R"(,"hidden_size":"8")", "hidden_size"},
      {"gpt2", R"(,"activation_function":"relu")", "activation_function"},
      {"gpt2", R"(,"layer_norm_epsilon":1e-06)", "layer_norm_epsilon"},
      {"gpt2", R"(,"n_inner":64)", "n_inner"},
      {"gpt2", R"(,"head_dim":3)", "head_dim"},
      {"gpt2", R"(,"n_layer":1.5)", "n_layer"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.json);
    // A later duplicate key wins in protobuf's JSON parser? Not guaranteed: replace instead.
    std::string base = std::string(r.family) == "gpt2" ? Gpt2Config("") : LlamaConfig("");
    auto config = ParseHfConfig(base);
    ASSERT_TRUE(config.ok());
    auto extra = ParseHfConfig(absl::StrCat("{", std::string(r.json).substr(1), "}"));
    ASSERT_TRUE(extra.ok()) << extra.status();
    for (const auto& [k, v] : extra->fields()) (*config->mutable_fields())[k] = v;
    auto spec = ModelSpecFromHfConfig(*config);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(absl::StrCat("config.json ", r.key, " is ")));
  }
}

// The values a config.json refusal quotes come back escaped and bounded.
TEST(HfConfig, RefusalsQuoteTheFileBoundedAndEscaped) {
  auto config = ParseHfConfig(Gpt2Config(""));
  ASSERT_TRUE(config.ok());
  (*config->mutable_fields())["model_type"].set_string_value(std::string(1 << 20, 'g') +
                                                             "\x1b[2J\xff");
  absl::Status s = ModelSpecFromHfConfig(*config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config.json model_type is \"ggg"));
  EXPECT_LT(s.message().size(), 1024u);
  (*config->mutable_fields())["model_type"].set_string_value("gpt\x1b[2J");
  s = ModelSpecFromHfConfig(*config).status();
  EXPECT_THAT(s.message(), HasSubstr("config.json model_type is \"gpt\\x1b[2J\""));
}

// An export with its base (the directory the model was initialized from) keeps what baton
// did not train: GPT-2's position rows past the context, the imported context and config
// keys, generation_config.json and the tokenizer files. Without one it writes the trained
// model alone; a base that is not the model's is refused, naming it.
TEST_F(HfTest, AnExportWithItsBaseKeepsThePositionsTheConfigAndTheTokenizer) {
  const baton::v1::ModelSpec imported = Gpt(true);  // n_positions 6
  auto src = Written(imported, "base");
  google::protobuf::Struct config = *ParseHfConfig(Config("base"));
  auto& f = *config.mutable_fields();
  f["bos_token_id"].set_number_value(3);
  f["eos_token_id"].set_number_value(4);
  f["resid_pdrop"].set_number_value(0.1);
  f["transformers_version"].set_string_value("5.0.0");
  std::string text;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(config, &text).ok());
  SetConfig("base", text);
  const std::string generation = "{\"bos_token_id\": 3, \"eos_token_id\": 4}\n";
  const std::string tokenizer = "{\"model\": {\"type\": \"BPE\"}, \"x\": \"\xc3\xa9\"}";
  ASSERT_TRUE(
      WriteFileAtomically((dir_ / "base" / "generation_config.json").string(), generation).ok());
  ASSERT_TRUE(WriteFileAtomically((dir_ / "base" / "tokenizer.json").string(), tokenizer).ok());

  baton::v1::ModelSpec spec = imported;
  spec.mutable_gpt()->set_context(4);  // fine-tuned at a shorter context
  auto model = Bags(spec, 0, -1, 0);
  ASSERT_TRUE(Load(spec, "base", 0, model.get()).ok());
  for (Parameter* p : model->Parameters()) {  // "training" moves every weight
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] += 1.0f;
  }
  absl::Status s = WriteHfModel(spec, ByName(*model), (dir_ / "out").string(),
                                {.base_dir = (dir_ / "base").string()});
  ASSERT_TRUE(s.ok()) << s;
  Safetensors out = ReadFile("out");
  absl::StatusOr<Tensor> wpe =
      EntryToTensor(out.tensors.at("transformer.wpe.weight"), Device::kCpu);
  ASSERT_TRUE(wpe.ok());
  ASSERT_EQ(wpe->shape(), (Shape{6, 8}));
  const float* trained = ByName(*model).at("embed.position")->f32();
  const float* as_imported = ByName(*src).at("embed.position")->f32();
  EXPECT_EQ(std::memcmp(wpe->f32(), trained, 4 * 8 * sizeof(float)), 0);  // rows 0..3
  EXPECT_EQ(std::memcmp(wpe->f32() + 4 * 8, as_imported + 4 * 8, 2 * 8 * sizeof(float)), 0);
  google::protobuf::Struct written = *ParseHfConfig(Config("out"));
  const auto& w = written.fields();
  EXPECT_EQ(w.at("n_positions").number_value(), 6);
  EXPECT_EQ(w.at("n_ctx").number_value(), 6);
  EXPECT_EQ(w.at("bos_token_id").number_value(), 3);
  EXPECT_EQ(w.at("eos_token_id").number_value(), 4);
  EXPECT_EQ(w.at("resid_pdrop").number_value(), 0.1);
  EXPECT_EQ(w.at("transformers_version").string_value(), "5.0.0");
  EXPECT_EQ(w.at("dtype").string_value(), "float32");
  EXPECT_EQ(*baton::ReadFile((dir_ / "out" / "generation_config.json").string()), generation);
  EXPECT_EQ(*baton::ReadFile((dir_ / "out" / "tokenizer.json").string()), tokenizer);
  EXPECT_FALSE(fs::exists(dir_ / "out" / "merges.txt"));  // the base has none
  // Loaded back at the full context, the model is the trained one with the imported rows.
  auto again = Bags(imported, 0, -1, 0);
  ASSERT_TRUE(Load(imported, "out", 0, again.get()).ok());

  // Without a base: the trained model alone.
  ASSERT_TRUE(WriteHfModel(spec, ByName(*model), (dir_ / "alone").string()).ok());
  EXPECT_EQ(ReadFile("alone").tensors.at("transformer.wpe.weight").shape, (Shape{4, 8}));
  written = *ParseHfConfig(Config("alone"));
  EXPECT_EQ(written.fields().at("n_positions").number_value(), 4);
  EXPECT_FALSE(written.fields().contains("bos_token_id"));
  EXPECT_FALSE(fs::exists(dir_ / "alone" / "tokenizer.json"));

  // A base that is not the model's.
  baton::v1::ModelSpec other = Gpt(true);
  other.mutable_gpt()->set_vocab_size(12);
  Written(other, "other");
  s = WriteHfModel(spec, ByName(*model), (dir_ / "refused").string(),
                   {.base_dir = (dir_ / "other").string()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the base model " + (dir_ / "other").string()));
  EXPECT_THAT(s.message(),
              HasSubstr("model.gpt.vocab_size is 11 but config.json vocab_size is 12"));
  EXPECT_FALSE(fs::exists(dir_ / "refused"));
}

// A LLaMA exported with its base keeps the imported max_position_embeddings.
TEST_F(HfTest, ALlamaExportedWithItsBaseKeepsItsContext) {
  const baton::v1::ModelSpec imported = Llama();  // max_position_embeddings 8
  Written(imported, "base");
  baton::v1::ModelSpec spec = imported;
  spec.mutable_llama()->set_context(4);
  auto model = Bags(spec, 0, -1, 0);
  ASSERT_TRUE(Load(spec, "base", 0, model.get()).ok());
  ASSERT_TRUE(WriteHfModel(spec, ByName(*model), (dir_ / "out").string(),
                           {.base_dir = (dir_ / "base").string()})
                  .ok());
  EXPECT_EQ(ParseHfConfig(Config("out"))->fields().at("max_position_embeddings").number_value(), 8);
  ASSERT_TRUE(WriteHfModel(spec, ByName(*model), (dir_ / "alone").string()).ok());
  EXPECT_EQ(ParseHfConfig(Config("alone"))->fields().at("max_position_embeddings").number_value(),
            4);
}

// The coordinator's submit check refuses, when it sees the directory, what every worker
// would refuse a second later: the wrong model, another architecture, a truncated file, a
// missing tensor. A directory it does not see is the workers' to find.
TEST_F(HfTest, TheSubmitCheckRefusesWhatTheWorkersWould) {
  const baton::v1::ModelSpec spec = Gpt(false);
  Written(spec, "gpt");
  auto job_for = [&](const std::string& name, const baton::v1::ModelSpec& model) {
    baton::v1::JobSpec job;
    *job.mutable_model() = model;
    job.mutable_init()->set_from_hf((dir_ / name).string());
    return job;
  };
  EXPECT_TRUE(CheckHfModelAtSubmit(job_for("gpt", spec), {}).ok());
  EXPECT_TRUE(CheckHfModelAtSubmit(job_for("elsewhere", spec), {}).ok());

  baton::v1::ModelSpec wrong = spec;
  wrong.mutable_gpt()->set_vocab_size(12);
  absl::Status s = CheckHfModelAtSubmit(job_for("gpt", wrong), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "init.from_hf: model.gpt.vocab_size is 12 but config.json vocab_size is 11");

  fs::create_directories(dir_ / "qwen");
  fs::copy_file(dir_ / "gpt" / "model.safetensors", dir_ / "qwen" / "model.safetensors");
  SetConfig("qwen", R"({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})");
  s = CheckHfModelAtSubmit(job_for("qwen", spec), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("init.from_hf: config.json model_type is \"qwen2\""));

  fs::create_directories(dir_ / "cut");
  fs::copy_file(dir_ / "gpt" / "config.json", dir_ / "cut" / "config.json");
  fs::copy_file(dir_ / "gpt" / "model.safetensors", dir_ / "cut" / "model.safetensors");
  fs::resize_file(dir_ / "cut" / "model.safetensors",
                  fs::file_size(dir_ / "cut" / "model.safetensors") - 100);
  s = CheckHfModelAtSubmit(job_for("cut", spec), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("init.from_hf: " + (dir_ / "cut" / "model.safetensors").string() +
                        ": safetensors: the file is truncated"))
      << s.message();
  // The same words on a worker, naming the same tensor every time.
  auto blocks = Bags(spec, 0, -1, 0);
  EXPECT_EQ(Load(spec, "cut", 0, blocks.get()).message(), s.message());

  Rewrite("gpt", [](std::vector<std::pair<std::string, Tensor>>* ts) {
    std::erase_if(*ts, [](const auto& e) { return e.first == "transformer.h.1.ln_2.bias"; });
  });
  s = CheckHfModelAtSubmit(job_for("gpt", spec), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor transformer.h.1.ln_2.bias (for baton's "
                                     "block.1.ln2.bias, want [8]) is not in"));
}

// A shard index names files: its names are quoted escaped in every message.
TEST_F(HfTest, AShardFileNameFromTheIndexIsQuotedEscaped) {
  const baton::v1::ModelSpec spec = Gpt(true);
  Written(spec, "gpt");
  fs::remove(dir_ / "gpt" / "model.safetensors");
  ASSERT_TRUE(WriteFileAtomically((dir_ / "gpt" / "model.safetensors.index.json").string(),
                                  R"({"weight_map": {"transformer.wte.weight": "a\nb\u001b[2J"}})")
                  .ok());
  auto blocks = Bags(spec, 0, -1, 0);
  absl::Status s = Load(spec, "gpt", 0, blocks.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("a\\nb\\x1b[2J"));
  EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << s.message();
  EXPECT_EQ(s.message().find('\x1b'), absl::string_view::npos) << s.message();
}

// Messages read as a user reads them: the family mismatch says what the directory holds and
// where it loads; floats print as config.json writes them.
TEST_F(HfTest, MismatchMessagesNameTheFamilyAndPrintFloatsShortest) {
  Written(Gpt(true), "gpt");
  const google::protobuf::Struct gpt = *ParseHfConfig(Config("gpt"));
  EXPECT_EQ(CheckSpecAgainstHf(Llama(), gpt).message(),
            "config.json model_type is \"gpt2\", a GPT-2, but the spec's model is model.llama; "
            "a GPT-2 loads into model.gpt");
  Written(Llama(), "llama");
  const google::protobuf::Struct llama = *ParseHfConfig(Config("llama"));
  EXPECT_EQ(CheckSpecAgainstHf(Gpt(true), llama).message(),
            "config.json model_type is \"llama\", a LLaMA, but the spec's model is model.gpt; "
            "a LLaMA loads into model.llama");
  baton::v1::ModelSpec eps = Llama();
  eps.mutable_llama()->set_rms_norm_eps(1e-6f);
  EXPECT_EQ(CheckSpecAgainstHf(eps, llama).message(),
            "model.llama.rms_norm_eps is 1e-06 but config.json rms_norm_eps is 1e-05");
}

// A config.json or index that is not JSON is refused in one line of valid UTF-8: the bytes
// escaped, no caret line.
TEST(HfConfig, ATextThatIsNotJsonIsRefusedInOneEscapedLine) {
  for (const std::string& text : {std::string("\xff\xfe{\"a\": \x01\x80}\n\n"),
                                  std::string("{\"vocab_size\": 5,\n  oops\n}")}) {
    absl::Status s = ParseHfConfig(text, "dir/config.json").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("dir/config.json is not a JSON object"));
    EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << s.message();
    EXPECT_EQ(s.message().find('^'), absl::string_view::npos) << s.message();
    EXPECT_EQ(s.message().find('\xff'), absl::string_view::npos) << s.message();
  }
}

// A model.safetensors whose length field puts its header over the format's 100,000,000
// bytes is refused from those 8 bytes: nothing reads or allocates the header (here a sparse
// file of 128 MiB claiming a 101,000,000-byte header).
TEST_F(HfTest, AnOversizedSafetensorsHeaderIsRefusedUnread) {
  baton::v1::ModelSpec spec = Gpt(true);
  Written(spec, "gpt");
  const std::string file = (dir_ / "gpt" / "model.safetensors").string();
  std::string first8(8, '\0');
  const uint64_t n = 101'000'000;
  for (int i = 0; i < 8; ++i) first8[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  ASSERT_TRUE(WriteFileAtomically(file, first8).ok());
  fs::resize_file(file, uint64_t{128} << 20);
  auto dst = Bags(spec, 0, -1, 0);
  absl::Status s = Load(spec, "gpt", 0, dst.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the header is too large"));
  EXPECT_THAT(s.message(), HasSubstr(file));
}

}  // namespace
}  // namespace baton
