#include "common/nn/model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/core/check.h"
#include "common/core/status.h"
#include "common/nn/attention_core.h"
#include "common/nn/layers.h"
#include "common/nn/llama.h"
#include "common/nn/transformer.h"
#include "common/spec/spec.h"

namespace baton {

// ---------------------------------------------------------------- Sequential

Sequential::Sequential(std::string name, std::vector<std::unique_ptr<Module>> modules)
    : name_(std::move(name)), modules_(std::move(modules)) {}

absl::Status Sequential::Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  absl::Status s = ForwardSteps(mb, x, y);
  if (!s.ok()) Discard(mb.index);
  return s;
}

void Sequential::Discard(int mb) {
  for (auto& m : modules_) m->Discard(mb);
}

absl::Status Sequential::ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y) {
  Tensor cur = x;
  for (auto& m : modules_) {
    Tensor next;
    BATON_RETURN_IF_ERROR(m->Forward(mb, cur, &next));
    cur = std::move(next);
  }
  *y = std::move(cur);
  return absl::OkStatus();
}

absl::Status Sequential::BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
  Tensor cur = dy;
  for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) {
    Tensor next;
    BATON_RETURN_IF_ERROR((*it)->BackwardInput(mb, cur, &next));
    cur = std::move(next);
  }
  *dx = std::move(cur);
  return absl::OkStatus();
}

absl::Status Sequential::BackwardWeight(const MicroBatch& mb) {
  for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) {
    BATON_RETURN_IF_ERROR((*it)->BackwardWeight(mb));
  }
  return absl::OkStatus();
}

void Sequential::CollectParameters(std::vector<Parameter*>* out) {
  for (auto& m : modules_) m->CollectParameters(out);
}

int Sequential::InFlight() const {
  int n = 0;
  for (const auto& m : modules_) n = std::max(n, m->InFlight());
  return n;
}

// ---------------------------------------------------------------- block catalogue

namespace {

int NumBlocks(const baton::v1::ModelSpec& spec) {
  return static_cast<int>(ModelBlockCount(spec));
}

// LLaMA's output projection: no bias, N(0, 0.02); drawn as the embedding when tied.
Linear::Options LlamaLogitsOptions(bool tied) {
  Linear::Options o;
  o.bias = false;
  o.init_stddev = 0.02f;
  if (tied) o.init_name = kTiedEmbeddingName;
  return o;
}

std::unique_ptr<Module> BuildMlpBlock(const baton::v1::MlpSpec& s, int index, uint64_t seed,
                                      Device device) {
  const int64_t width = s.width();
  if (index < s.depth()) {
    const int64_t in = index == 0 ? s.input_dim() : width;
    Linear::Options o;
    o.gelu = true;
    o.compute_input_grad = index != 0;  // the first block's input is data
    o.init_stddev = 1.0f / std::sqrt(static_cast<float>(in));
    return std::make_unique<Linear>("hidden." + std::to_string(index), in, width, o, seed, device);
  }
  Linear::Options o;
  o.init_stddev = 1.0f / std::sqrt(static_cast<float>(width));
  std::vector<std::unique_ptr<Module>> parts;
  parts.push_back(std::make_unique<Linear>("out", width, s.output_dim(), o, seed, device));
  parts.push_back(std::make_unique<MseLoss>("out.mse", device));
  return std::make_unique<Sequential>("out", std::move(parts));
}

std::unique_ptr<Module> BuildGptBlock(const baton::v1::GptSpec& s, int index, uint64_t seed,
                                      Device device) {
  if (index == 0) {
    return std::make_unique<Embedding>("embed", s.vocab_size(), s.context(), s.d_model(), seed,
                                       device);
  }
  if (index <= s.layers()) {
    return std::make_unique<TransformerBlock>("block." + std::to_string(index - 1), s.d_model(),
                                              s.heads(), s.layers(), seed, device);
  }
  const bool tied = !s.has_tie_embeddings() || s.tie_embeddings();
  return GptHead("head", s.d_model(), s.vocab_size(), tied, seed, device);
}

// The floats of one row of an LM head's logits: the vocabulary padded to
// LmHead::kLogitsAlign.
int64_t PaddedLogits(int64_t vocab) {
  return (vocab + LmHead::kLogitsAlign - 1) / LmHead::kLogitsAlign * LmHead::kLogitsAlign;
}

std::unique_ptr<Module> BuildLlamaBlock(const baton::v1::LlamaSpec& s, int index, uint64_t seed,
                                        Device device) {
  if (index == 0) {
    return std::make_unique<Embedding>("embed", s.vocab_size(), s.context(), s.d_model(), seed,
                                       device, /*positions=*/false);
  }
  const float eps = LlamaRmsNormEps(s);
  if (index <= s.layers()) {
    return std::make_unique<LlamaBlock>("block." + std::to_string(index - 1), s.d_model(),
                                        s.heads(), LlamaKvHeads(s), s.intermediate_size(),
                                        LlamaRopeTheta(s), eps, s.layers(), seed, device);
  }
  const bool tied = s.has_tie_embeddings() && s.tie_embeddings();
  return std::make_unique<LmHead>("head", s.d_model(), s.vocab_size(),
                                  std::make_unique<RmsNorm>("head.norm", s.d_model(), eps, device),
                                  LlamaLogitsOptions(tied), seed, device);
}

}  // namespace

namespace {
// BlockCostOptions' change to a transformer block's activation_floats (per sequence): the
// fused and tiled kernels keep the same (PlannedAttentionKernel says which runs).
int64_t AttentionStashChange(const BlockCostOptions& o, int64_t T, int64_t C, int64_t H) {
  const bool flash =
      PlannedAttentionKernel(o.attention, C / H, o.bf16) != AttentionKernel::kMaterialised;
  return flash ? -H * T * T + H * T + (o.bf16 ? T * C : 0) : 0;
}
}  // namespace

std::vector<BlockInfo> DescribeBlocks(const baton::v1::ModelSpec& spec,
                                      const BlockCostOptions& options) {
  std::vector<BlockInfo> out;
  if (spec.has_mlp()) {
    const auto& s = spec.mlp();
    for (int i = 0; i <= s.depth(); ++i) {
      const int64_t in = i == 0 ? s.input_dim() : s.width();
      const int64_t o = i < s.depth() ? s.width() : s.output_dim();
      // A hidden block keeps its input and its pre-activation; the output block its input
      // and the loss's difference to the targets. In bf16 the input is kept as bf16.
      out.push_back({i < s.depth() ? "hidden." + std::to_string(i) : "out", in * o + o, 2 * in * o,
                     in + o, in, in * o, in * o});
    }
  } else if (spec.has_gpt()) {
    const auto& s = spec.gpt();
    const int64_t C = s.d_model(), T = s.context(), V = s.vocab_size();
    // The embedding keeps its token ids (int32, as wide as a float).
    out.push_back({"embed", V * C + T * C, T * C, T, 0, 0,  // one add per output element
                   std::max(V * C, T * C)});
    // Per sequence: qkv 6TC^2, attention scores and mixing 4T^2C, proj 2TC^2, MLP 16TC^2.
    const int64_t block_params = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) +
                                 (4 * C * C + 4 * C) + (4 * C * C + C);
    const int64_t block_flops = 24 * T * C * C + 4 * T * T * C;
    // A block keeps its input and the first LayerNorm's output (2TC), q, k and v (3TC),
    // the attention probabilities (H T^2), the mixed heads (TC), the residual sum and the
    // second LayerNorm's output (2TC), the MLP's pre-activation and activation (8TC), and
    // both LayerNorms' mean and inverse deviation (4T). In bf16 all but the
    // pre-activation, the probabilities and the statistics are bf16 (12TC).
    const int64_t H = s.heads();
    const int64_t block_acts =
        16 * T * C + H * T * T + 4 * T + AttentionStashChange(options, T, C, H);
    for (int i = 0; i < s.layers(); ++i) {
      out.push_back({"block." + std::to_string(i), block_params, block_flops, block_acts,
                     12 * T * C, 12 * C * C,  // the four projections' weights
                     4 * C * C});             // the MLP's two
    }
    // The head keeps its input, its LayerNorm's output and statistics, the logits (T rows
    // of V padded to LmHead::kLogitsAlign) and each row's softmax statistics (2 T), from
    // which the backward recomputes the probabilities; the targets are the batch's. In bf16
    // the input and the LayerNorm's output are bf16.
    out.push_back({"head", 2 * C + C * V, 2 * T * C * V, 2 * T * C + 4 * T + T * PaddedLogits(V),
                   2 * T * C, C * V, C * V});
  } else if (spec.has_llama()) {
    const auto& s = spec.llama();
    const int64_t C = s.d_model(), T = s.context(), V = s.vocab_size();
    // The embedding has no positions and keeps its token ids.
    out.push_back({"embed", V * C, 0, T, 0, 0, V * C});
    const LlamaCosts block = LlamaBlockCosts(T, C, s.heads(), LlamaKvHeads(s),
                                             s.intermediate_size());
    for (int i = 0; i < s.layers(); ++i) {
      out.push_back({"block." + std::to_string(i), block.parameters, block.forward_flops,
                     block.activation_floats + AttentionStashChange(options, T, C, s.heads()),
                     block.activation_bf16, block.operand_parameters, block.largest_parameter});
    }
    // The head keeps its input, its RMSNorm's output and inverse RMS, the logits (padded)
    // and each row's softmax statistics; in bf16 the input and the RMSNorm's output are bf16.
    out.push_back({"head", C + C * V, 2 * T * C * V, 2 * T * C + 3 * T + T * PaddedLogits(V),
                   2 * T * C, C * V, C * V});
  }
  return out;
}

int64_t ActivationBytes(const BlockInfo& block, bool bf16) {
  return 4 * block.activation_floats - (bf16 ? 2 * block.activation_bf16 : 0);
}

double TrainingFlops(const std::vector<BlockInfo>& blocks, int first, int last, double samples) {
  double forward = 0;
  for (int b = first; b < last; ++b) forward += static_cast<double>(blocks[b].forward_flops);
  return 3.0 * forward * samples;
}

Shape BlockInputShape(const baton::v1::ModelSpec& spec, int /*block*/, int64_t rows) {
  // Every block after the first takes the hidden representation; only block 0 differs.
  if (spec.has_mlp()) return {rows, spec.mlp().width()};
  const TokenModel t = *TokenModelOf(spec);
  return {rows, t.context, t.d_model};
}

absl::StatusOr<std::unique_ptr<Sequential>> BuildBlocks(const baton::v1::ModelSpec& spec,
                                                        uint64_t seed, int first, int last,
                                                        Device device) {
  const int n = NumBlocks(spec);
  if (n == 0) {
    return absl::InvalidArgumentError("model: no architecture set (want mlp, gpt or llama)");
  }
  if (last < 0) last = n;
  if (first < 0 || first >= last || last > n) {
    return absl::InvalidArgumentError(absl::StrCat("model: block range [", first, ", ", last,
                                                   ") is not within the ", n, " blocks"));
  }
  if (absl::StatusOr<Backend*> be = BackendFor(device); !be.ok()) {
    return absl::Status(be.status().code(),
                        absl::StrCat("model on ", DeviceName(device), ": ", be.status().message()));
  }
  std::vector<std::unique_ptr<Module>> blocks;
  for (int i = first; i < last; ++i) {
    blocks.push_back(spec.has_mlp()   ? BuildMlpBlock(spec.mlp(), i, seed, device)
                     : spec.has_gpt() ? BuildGptBlock(spec.gpt(), i, seed, device)
                                      : BuildLlamaBlock(spec.llama(), i, seed, device));
  }
  auto model = std::make_unique<Sequential>("model", std::move(blocks));
  BATON_RETURN_IF_ERROR(CheckParameters(model->Parameters()));
  return model;
}

Digest BlockDigest(Module& block) {
  Sha256 h;
  std::vector<float> host;
  for (Parameter* p : block.Parameters()) {
    const float* data = p->value.f32();
    if (p->value.device() != Device::kCpu) {
      host.resize(static_cast<size_t>(p->value.numel()));
      BATON_CHECK_OK(p->value.CopyToHost(host.data()));  // a device fault: nothing to digest
      data = host.data();
    }
    h.UpdateFloats(absl::MakeConstSpan(data, static_cast<size_t>(p->value.numel())));
  }
  return h.Finish();
}

std::vector<Digest> BlockDigests(Sequential& blocks) {
  std::vector<Digest> out;
  for (int i = 0; i < blocks.size(); ++i) out.push_back(BlockDigest(blocks.at(i)));
  return out;
}

Parameter* FindParameter(Module& block, const std::string& name) {
  for (Parameter* p : block.Parameters()) {
    if (p->name == name) return p;
  }
  return nullptr;
}

void SumTiedGradients(Parameter& embedding, Parameter& output, Backend& backend) {
  backend.Add(embedding.grad.numel(), embedding.grad.f32(), output.grad.f32(),
              embedding.grad.f32());
  backend.Copy(embedding.grad.numel(), embedding.grad.f32(), output.grad.f32());
}

void ZeroGrad(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) p->grad.SetZero();
}

Precision PrecisionOf(const baton::v1::JobSpec& spec) {
  return spec.precision() == baton::v1::PRECISION_BF16 ? Precision::kBf16 : Precision::kFp32;
}

bool UsesTf32(const baton::v1::JobSpec& spec) {
  return spec.allow_tf32() || PrecisionOf(spec) == Precision::kBf16;
}

AttentionKernel AttentionKernelOf(const baton::v1::JobSpec& spec) {
  switch (spec.attention()) {
    case baton::v1::ATTENTION_KERNEL_MATERIALISED:
      return AttentionKernel::kMaterialised;
    case baton::v1::ATTENTION_KERNEL_FUSED:
      return AttentionKernel::kFused;
    case baton::v1::ATTENTION_KERNEL_TILED:
      return AttentionKernel::kTiled;
    default:
      return DefaultAttentionKernel();
  }
}

}  // namespace baton
