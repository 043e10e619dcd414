// hf_peer_tool: baton's side of the checks against Hugging Face transformers
// (tests/peer/test_hf_peer.py, scripts/peer-test.sh). Test-only; CPU only.
//
//   hf_peer_tool logits --hf DIR --tokens FILE --out FILE
//       The model of DIR/config.json (ModelSpecFromHfConfig) built with BuildBlocks, its
//       weights loaded with LoadHfWeights; FILE holds int32 "tokens" [B, T] (safetensors);
//       writes float32 "logits" [B, T, V] (safetensors).
//   hf_peer_tool train --hf DIR --batches FILE --steps N --lr LR [--beta1 B1] [--beta2 B2]
//                      [--eps EPS] [--weight-decay WD] --out-losses FILE [--export DIR]
//                      [--weight-decay-scope matrices|matrices_and_embeddings|all]
//                      [--warmup W --decay constant|cosine|linear|wsd --min-lr MIN
//                       --decay-steps D] [--clip MAX_NORM] [--precision fp32|bf16]
//       AdamW on the int32 "tokens" [S, B, T + 1] in FILE: step k trains on batch k mod S
//       (inputs tokens[:, :-1], targets tokens[:, 1:], one micro-batch), with the training
//       recipe of the flags (docs/training.md: LearningRateAt per step; clipping from
//       BlockGradSquares block by block, as the pipeline's CLIP_GRAD). Writes JSON
//       {"losses": [the loss of every step, before its update], "lrs": [each step's rate],
//       "grad_norms": [each step's norm before clipping, when --clip], "final_loss": the loss
//       of batch 0 after the last step} and, with --export, the trained weights
//       (WriteHfModel). --steps 0 gives the loaded model's loss on batch 0.
//   hf_peer_tool roundtrip --hf IN --out OUT
//       LoadHfWeights then WriteHfModel.
// Exits 0 on success; 1 with the error on stderr.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/v1/job.pb.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/hf.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/file.h"
#include "common/core/status.h"
#include "common/nn/model.h"
#include "common/nn/transformer.h"
#include "common/optim/optimizer.h"

namespace baton {
namespace {

using Flags = std::map<std::string, std::string>;

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat("want --flag VALUE, got ", a));
    }
    f[a.substr(2)] = argv[++i];
  }
  return f;
}

absl::StatusOr<std::string> Need(const Flags& f, const std::string& name) {
  const auto it = f.find(name);
  if (it == f.end()) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return it->second;
}

float FloatFlag(const Flags& f, const std::string& name, float dflt) {
  const auto it = f.find(name);
  return it == f.end() ? dflt : std::stof(it->second);
}

// The job spec of an HF directory: its model, loaded from it.
absl::StatusOr<baton::v1::JobSpec> SpecFor(const std::string& dir) {
  BATON_ASSIGN_OR_RETURN(const google::protobuf::Struct config, ReadHfConfig(dir));
  baton::v1::JobSpec spec;
  BATON_ASSIGN_OR_RETURN(*spec.mutable_model(), ModelSpecFromHfConfig(config));
  spec.mutable_init()->set_from_hf(dir);
  return spec;
}

absl::StatusOr<std::unique_ptr<Sequential>> LoadModel(const baton::v1::JobSpec& spec) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequential> model, BuildBlocks(spec.model(), /*seed=*/1));
  BATON_RETURN_IF_ERROR(LoadHfWeights(spec, {}, 0, model.get()));
  return model;
}

// The int32 tensor "tokens" of a safetensors file.
absl::StatusOr<Tensor> ReadTokens(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  BATON_ASSIGN_OR_RETURN(const Safetensors st, ParseSafetensors(bytes));
  const auto it = st.tensors.find("tokens");
  if (it == st.tensors.end() || it->second.dtype != DType::kInt32) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has no int32 tensor \"tokens\""));
  }
  return EntryToTensor(it->second, Device::kCpu);
}

std::map<std::string, const Tensor*> ByName(Sequential& model) {
  std::map<std::string, const Tensor*> out;
  for (Parameter* p : model.Parameters()) out[p->name] = &p->value;
  return out;
}

absl::Status Logits(const Flags& f) {
  BATON_ASSIGN_OR_RETURN(const std::string dir, Need(f, "hf"));
  BATON_ASSIGN_OR_RETURN(const std::string tokens_path, Need(f, "tokens"));
  BATON_ASSIGN_OR_RETURN(const std::string out, Need(f, "out"));
  BATON_ASSIGN_OR_RETURN(const baton::v1::JobSpec spec, SpecFor(dir));
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequential> model, LoadModel(spec));
  BATON_ASSIGN_OR_RETURN(Tensor x, ReadTokens(tokens_path));
  MicroBatch mb;
  for (int i = 0; i + 1 < model->size(); ++i) {
    Tensor y;
    BATON_RETURN_IF_ERROR(model->at(i).Forward(mb, x, &y));
    model->at(i).Discard(mb.index);
    x = y;
  }
  auto* head = dynamic_cast<LmHead*>(&model->at(model->size() - 1));
  if (head == nullptr) return absl::InternalError("the last block is not an LmHead");
  BATON_ASSIGN_OR_RETURN(const Tensor logits, head->Logits(x));
  BATON_ASSIGN_OR_RETURN(const Tensor host, logits.On(Device::kCpu));
  BATON_ASSIGN_OR_RETURN(const std::string bytes, EncodeSafetensors({{"logits", &host}}, {}));
  return WriteFileAtomically(out, bytes);
}

// Rows [b] of tokens [S, B, T + 1] split into inputs and targets [B, T].
void Split(const Tensor& batches, int64_t s, Tensor* x, Tensor* y) {
  const int64_t B = batches.dim(1), T1 = batches.dim(2), T = T1 - 1;
  *x = Tensor::Empty({B, T}, DType::kInt32);
  *y = Tensor::Empty({B, T}, DType::kInt32);
  const int32_t* src = batches.i32() + s * B * T1;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      x->i32()[b * T + t] = src[b * T1 + t];
      y->i32()[b * T + t] = src[b * T1 + t + 1];
    }
  }
}

absl::StatusOr<float> Loss(Sequential& model, const Tensor& x, const Tensor& y, bool keep,
                           Precision precision) {
  MicroBatch mb;
  mb.targets = &y;
  mb.precision = precision;
  Tensor loss;
  BATON_RETURN_IF_ERROR(model.Forward(mb, x, &loss));
  if (!keep) model.Discard(mb.index);
  BATON_ASSIGN_OR_RETURN(const Tensor host, loss.On(Device::kCpu));
  return host.f32()[0];
}

absl::Status Train(const Flags& f) {
  BATON_ASSIGN_OR_RETURN(const std::string dir, Need(f, "hf"));
  BATON_ASSIGN_OR_RETURN(const std::string batches_path, Need(f, "batches"));
  BATON_ASSIGN_OR_RETURN(const std::string out, Need(f, "out-losses"));
  BATON_ASSIGN_OR_RETURN(const std::string steps_flag, Need(f, "steps"));
  const int steps = std::stoi(steps_flag);
  BATON_ASSIGN_OR_RETURN(const baton::v1::JobSpec spec, SpecFor(dir));
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequential> model, LoadModel(spec));
  BATON_ASSIGN_OR_RETURN(const Tensor batches, ReadTokens(batches_path));
  if (batches.rank() != 3 || batches.dim(2) < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("want tokens [S, B, T + 1], got ", batches.DebugString()));
  }
  baton::v1::OptimizerSpec opt;
  baton::v1::AdamWSpec* a = opt.mutable_adamw();
  a->set_learning_rate(FloatFlag(f, "lr", 1e-3f));
  a->set_beta1(FloatFlag(f, "beta1", 0.9f));
  a->set_beta2(FloatFlag(f, "beta2", 0.999f));
  a->set_epsilon(FloatFlag(f, "eps", 1e-8f));
  a->set_weight_decay(FloatFlag(f, "weight-decay", 0.01f));
  if (const auto it = f.find("weight-decay-scope"); it != f.end()) {
    const std::map<std::string, baton::v1::WeightDecayScope> scopes = {
        {"matrices", baton::v1::WEIGHT_DECAY_SCOPE_MATRICES},
        {"matrices_and_embeddings", baton::v1::WEIGHT_DECAY_SCOPE_MATRICES_AND_EMBEDDINGS},
        {"all", baton::v1::WEIGHT_DECAY_SCOPE_ALL}};
    const auto scope = scopes.find(it->second);
    if (scope == scopes.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown --weight-decay-scope ", it->second));
    }
    opt.set_weight_decay_scope(scope->second);
  }
  if (const auto it = f.find("decay"); it != f.end()) {
    const std::map<std::string, baton::v1::LrDecay> decays = {
        {"constant", baton::v1::LR_DECAY_CONSTANT},
        {"cosine", baton::v1::LR_DECAY_COSINE},
        {"linear", baton::v1::LR_DECAY_LINEAR},
        {"wsd", baton::v1::LR_DECAY_WSD}};
    const auto decay = decays.find(it->second);
    if (decay == decays.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown --decay ", it->second));
    }
    baton::v1::LrSchedule* l = opt.mutable_lr_schedule();
    l->set_decay(decay->second);
    l->set_warmup_steps(static_cast<int32_t>(FloatFlag(f, "warmup", 0.0f)));
    l->set_min_lr(FloatFlag(f, "min-lr", 0.0f));
    l->set_decay_steps(static_cast<int32_t>(FloatFlag(f, "decay-steps", 0.0f)));
  }
  opt.set_clip_grad_norm(FloatFlag(f, "clip", 0.0f));
  Precision precision = Precision::kFp32;
  if (const auto it = f.find("precision"); it != f.end()) {
    if (it->second != "fp32" && it->second != "bf16") {
      return absl::InvalidArgumentError(absl::StrCat("unknown --precision ", it->second));
    }
    if (it->second == "bf16") precision = Precision::kBf16;
  }
  std::vector<Parameter*> params = model->Parameters();
  Parameter* tied_embedding = nullptr;
  Parameter* tied_output = nullptr;
  const bool tied = spec.model().has_gpt() ? spec.model().gpt().tie_embeddings()
                                           : spec.model().llama().tie_embeddings();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, MakeOptimizer(opt, params, tied));
  if (tied) {
    tied_embedding = FindParameter(model->at(0), kTiedEmbeddingName);
    tied_output = FindParameter(model->at(model->size() - 1), kTiedOutputName);
    if (tied_embedding == nullptr || tied_output == nullptr) {
      return absl::InternalError("tied model without its tied parameters");
    }
  }
  std::vector<float> losses, lrs, norms;
  Tensor one = Tensor::Empty({1});
  one.f32()[0] = 1.0f;
  for (int step = 0; step < steps; ++step) {
    Tensor x, y;
    Split(batches, step % batches.dim(0), &x, &y);
    ZeroGrad(params);
    BATON_ASSIGN_OR_RETURN(const float loss, Loss(*model, x, y, /*keep=*/true, precision));
    MicroBatch mb;
    mb.targets = &y;
    mb.precision = precision;
    Tensor dx;
    BATON_RETURN_IF_ERROR(model->Backward(mb, one, &dx));
    if (tied) SumTiedGradients(*tied_embedding, *tied_output, *CpuBackend());
    if (opt.clip_grad_norm() > 0.0f) {  // as the reference trainer and CLIP_GRAD do
      std::vector<double> parts;
      for (int b = 0; b < model->size(); ++b) {
        BATON_ASSIGN_OR_RETURN(double part, BlockGradSquares(model->at(b), tied));
        parts.push_back(part);
      }
      const GradClip clip = ClipFromBlockSquares(parts, opt.clip_grad_norm());
      norms.push_back(static_cast<float>(clip.norm));
      if (clip.clips()) BATON_RETURN_IF_ERROR(ScaleGradients(params, clip.coef));
    }
    const float lr = LearningRateAt(opt, step, steps);
    lrs.push_back(lr);
    optimizer->Step(lr);
    losses.push_back(loss);
    std::printf("step %d loss %.9g\n", step + 1, loss);
  }
  Tensor x, y;
  Split(batches, 0, &x, &y);
  BATON_ASSIGN_OR_RETURN(const float final_loss, Loss(*model, x, y, /*keep=*/false, precision));
  std::printf("final loss %.9g\n", final_loss);
  std::string json = "{\"losses\": [";
  for (size_t i = 0; i < losses.size(); ++i) {
    absl::StrAppend(&json, i ? ", " : "", absl::StrFormat("%.9g", losses[i]));
  }
  for (const auto& [name, values] : {std::pair<const char*, const std::vector<float>*>{"lrs", &lrs},
                                     {"grad_norms", &norms}}) {
    absl::StrAppend(&json, "], \"", name, "\": [");
    for (size_t i = 0; i < values->size(); ++i) {
      absl::StrAppend(&json, i ? ", " : "", absl::StrFormat("%.9g", (*values)[i]));
    }
  }
  absl::StrAppend(&json, "], \"final_loss\": ", absl::StrFormat("%.9g", final_loss), "}\n");
  BATON_RETURN_IF_ERROR(WriteFileAtomically(out, json));
  if (const auto it = f.find("export"); it != f.end()) {
    BATON_RETURN_IF_ERROR(
        WriteHfModel(spec.model(), ByName(*model), it->second, {.base_dir = dir}));
  }
  return absl::OkStatus();
}

absl::Status Roundtrip(const Flags& f) {
  BATON_ASSIGN_OR_RETURN(const std::string dir, Need(f, "hf"));
  BATON_ASSIGN_OR_RETURN(const std::string out, Need(f, "out"));
  BATON_ASSIGN_OR_RETURN(const baton::v1::JobSpec spec, SpecFor(dir));
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Sequential> model, LoadModel(spec));
  return WriteHfModel(spec.model(), ByName(*model), out, {.base_dir = dir});
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hf_peer_tool logits|train|roundtrip --flag VALUE ...\n");
    return 2;
  }
  const std::string cmd = argv[1];
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  absl::Status s = flags.status();
  if (s.ok()) {
    if (cmd == "logits") {
      s = Logits(*flags);
    } else if (cmd == "train") {
      s = Train(*flags);
    } else if (cmd == "roundtrip") {
      s = Roundtrip(*flags);
    } else {
      s = absl::InvalidArgumentError(absl::StrCat("unknown command ", cmd));
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "hf_peer_tool %s: %s\n", cmd.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
