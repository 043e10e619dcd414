#include "common/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/core/status.h"
#include "common/nn/model.h"
#include "common/nn/transformer.h"

namespace baton {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a fixed stream for a seed on every platform, unlike
// the standard library's distributions.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t state_;
};

// The logits of the window's last position, on the host.
absl::StatusOr<std::vector<float>> LastLogits(Sequential& model, LmHead& head,
                                              const std::vector<int32_t>& window) {
  Tensor x = Tensor::Empty({1, static_cast<int64_t>(window.size())}, DType::kInt32);
  std::copy(window.begin(), window.end(), x.i32());
  MicroBatch mb;
  for (int i = 0; i + 1 < model.size(); ++i) {
    Tensor y;
    const absl::Status s = model.at(i).Forward(mb, x, &y);
    model.at(i).Discard(mb.index);  // forward only
    BATON_RETURN_IF_ERROR(s);
    x = std::move(y);
  }
  BATON_ASSIGN_OR_RETURN(const Tensor logits, head.Logits(x));
  BATON_ASSIGN_OR_RETURN(const Tensor host, logits.On(Device::kCpu));
  const int64_t V = host.dim(2);
  const float* last = host.f32() + (host.dim(1) - 1) * V;
  return std::vector<float>(last, last + V);
}

int32_t Pick(const std::vector<float>& logits, const GenerateOptions& opts, SplitMix64* rng) {
  const int32_t V = static_cast<int32_t>(logits.size());
  if (opts.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  if (opts.top_k > 0 && opts.top_k < V) {
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    ids.resize(opts.top_k);
    std::sort(ids.begin(), ids.end());  // id order for the cumulative sum
  }
  double top = -INFINITY;
  for (int32_t i : ids) top = std::max(top, static_cast<double>(logits[i]));
  std::vector<double> p(ids.size());
  double sum = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    p[j] = std::exp((static_cast<double>(logits[ids[j]]) - top) / opts.temperature);
    sum += p[j];
  }
  const double u = rng->Uniform() * sum;
  double cumulative = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    cumulative += p[j];
    if (cumulative > u) return ids[j];
  }
  return ids.back();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> Generate(Sequential& model, int64_t context,
                                              const std::vector<int32_t>& prompt,
                                              const GenerateOptions& opts) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (!(opts.temperature >= 0.0f) || !std::isfinite(opts.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the temperature must be 0 (greedy) or more, got ", opts.temperature));
  }
  if (opts.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k must be 0 (all) or more, got ", opts.top_k));
  }
  if (context < 1) return absl::InvalidArgumentError("the model's context must be at least 1");
  auto* head = model.size() > 0 ? dynamic_cast<LmHead*>(&model.at(model.size() - 1)) : nullptr;
  if (head == nullptr) return absl::InvalidArgumentError("the model does not end in an LM head");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= head->vocab()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is id ", prompt[i],
                                                     ", outside the vocabulary [0, ", head->vocab(),
                                                     ")"));
    }
  }
  std::vector<int32_t> tokens = prompt;
  std::vector<int32_t> out;
  SplitMix64 rng(opts.seed);
  for (int n = 0; n < opts.max_new_tokens; ++n) {
    const size_t from = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    const std::vector<int32_t> window(tokens.begin() + from, tokens.end());
    BATON_ASSIGN_OR_RETURN(const std::vector<float> logits, LastLogits(model, *head, window));
    const int32_t next = Pick(logits, opts, &rng);
    out.push_back(next);
    tokens.push_back(next);
    if (next == opts.stop_id) break;
  }
  return out;
}

}  // namespace baton
