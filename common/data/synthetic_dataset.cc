// SyntheticDataset: regression onto a fixed random teacher, for the mlp. See dataset.h.
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/rng.h"
#include "common/core/status.h"
#include "common/data/dataset.h"

namespace baton {
namespace {

std::vector<float> DrawNormal(uint64_t seed, const char* name, int64_t n, float stddev) {
  std::vector<float> out(static_cast<size_t>(n));
  RngStream(seed, name).FillNormal(out.data(), n, 0.0f, stddev);
  return out;
}

float InvSqrt(int64_t fan_in) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SyntheticDataset>> SyntheticDataset::Create(const Options& options) {
  if (options.input_dim < 1 || options.output_dim < 1 || options.teacher_width < 1 ||
      options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic dataset: sizes must be at least 1 (input_dim=", options.input_dim,
                     ", output_dim=", options.output_dim, ", teacher_width=", options.teacher_width,
                     ", batch_size=", options.batch_size, ")"));
  }
  if (!std::isfinite(options.noise) || options.noise < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.synthetic.noise: must be finite and >= 0, got ", options.noise));
  }
  return std::unique_ptr<SyntheticDataset>(new SyntheticDataset(options));
}

SyntheticDataset::SyntheticDataset(const Options& options) : options_(options) {
  const int64_t in = options.input_dim, hidden = options.teacher_width, out = options.output_dim;
  w1_ = DrawNormal(options.seed, "data/teacher/W1", hidden * in, InvSqrt(in));
  b1_ = DrawNormal(options.seed, "data/teacher/b1", hidden, 0.1f);
  w2_ = DrawNormal(options.seed, "data/teacher/W2", out * hidden, InvSqrt(hidden));
  b2_ = DrawNormal(options.seed, "data/teacher/b2", out, 0.1f);
}

absl::StatusOr<Batch> SyntheticDataset::Get(int64_t step, int64_t first, int64_t count) const {
  BATON_RETURN_IF_ERROR(data_internal::CheckRange(step, first, count, options_.batch_size));
  const int64_t in = options_.input_dim, hidden = options_.teacher_width, out = options_.output_dim;
  Batch batch;
  BATON_ASSIGN_OR_RETURN(batch.inputs, Tensor::TryEmpty({count, in}, DType::kFloat32));
  BATON_ASSIGN_OR_RETURN(batch.targets, Tensor::TryEmpty({count, out}, DType::kFloat32));
  const std::string s = std::to_string(step);
  const RngStream xs(options_.seed, "data/synthetic/step/" + s);
  const RngStream noise(options_.seed, "data/noise/step/" + s);
  std::vector<double> h(static_cast<size_t>(hidden));
  for (int64_t k = 0; k < count; ++k) {
    const uint64_t i = static_cast<uint64_t>(first + k);
    float* x = batch.inputs.f32() + k * in;
    for (int64_t j = 0; j < in; ++j) x[j] = xs.Normal(i * in + j);
    for (int64_t t = 0; t < hidden; ++t) {
      double pre = b1_[t];
      const float* w = w1_.data() + t * in;
      for (int64_t j = 0; j < in; ++j) pre += static_cast<double>(w[j]) * x[j];
      h[t] = std::tanh(pre);
    }
    float* y = batch.targets.f32() + k * out;
    for (int64_t o = 0; o < out; ++o) {
      double acc = b2_[o];
      const float* w = w2_.data() + o * hidden;
      for (int64_t t = 0; t < hidden; ++t) acc += static_cast<double>(w[t]) * h[t];
      if (options_.noise != 0) {
        acc += static_cast<double>(options_.noise) * noise.Normal(i * out + o);
      }
      y[o] = static_cast<float>(acc);
    }
  }
  return batch;
}

std::string SyntheticDataset::Describe() const {
  return absl::StrCat("synthetic regression: x ~ N(0, 1)^", options_.input_dim,
                      " -> tanh teacher of width ", options_.teacher_width, " -> y in R^",
                      options_.output_dim, ", noise ", options_.noise, ", batch ",
                      options_.batch_size, ", seed ", options_.seed);
}

}  // namespace baton
