// Training on a GPU against training on the CPU: the CUDA reference trainer repeats its bits,
// its digest is not the CPU's (other kernels, other rounding: docs/architecture.md), its
// loss curve follows the CPU's within a stated tolerance, and a model too large for the
// device is RESOURCE_EXHAUSTED, not an abort. Skips without a CUDA device (fails instead
// under BATON_REQUIRE_GPU); ctest label gpu.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/nn/model.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "common/core/cuda_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {


baton::v1::JobSpec Gpt(baton::v1::DeviceKind device, int steps) {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(R"({
    "model": {"gpt": {"vocabSize": 40, "context": 32, "dModel": 64, "heads": 4, "layers": 2}},
    "data": {"text": {"inlineText": "the quick brown fox jumps over the lazy dog, and the dog sleeps on. the end."},
             "batchSize": 16},
    "pipeline": {"microbatches": 2},
    "optimizer": {"adamw": {"learningRate": 0.003}},
    "seed": 11})");
  EXPECT_TRUE(s.ok()) << s.status();
  s->set_device(device);
  s->set_steps(steps);
  return *s;
}

baton::v1::JobSpec Mlp(baton::v1::DeviceKind device, int steps) {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(R"({
    "model": {"mlp": {"inputDim": 6, "width": 64, "depth": 3, "outputDim": 2}},
    "data": {"synthetic": {"teacherWidth": 8}, "batchSize": 32},
    "pipeline": {"microbatches": 4},
    "optimizer": {"sgd": {"learningRate": 0.05, "momentum": 0.9}},
    "seed": 7})");
  EXPECT_TRUE(s.ok()) << s.status();
  s->set_device(device);
  s->set_steps(steps);
  return *s;
}

struct TrainedRun {
  std::vector<float> losses;
  std::string digest;
  Device device = Device::kCpu;
};

TrainedRun Train(const baton::v1::JobSpec& spec) {
  TrainedRun out;
  auto t = ReferenceTrainer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return out;
  out.device = (*t)->device();
  for (int i = 0; i < spec.steps(); ++i) {
    auto s = (*t)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return out;
    out.losses.push_back(s->loss);
  }
  out.digest = DigestHex((*t)->WeightsDigest());
  return out;
}

TEST(CudaTrainingTest, RepeatsItsBitsRunToRun) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const baton::v1::JobSpec spec =
        gpt ? Gpt(baton::v1::DEVICE_KIND_CUDA, 5) : Mlp(baton::v1::DEVICE_KIND_CUDA, 5);
    const TrainedRun a = Train(spec);
    const TrainedRun b = Train(spec);
    EXPECT_EQ(a.device, Device::kCuda);
    EXPECT_EQ(a.losses, b.losses);  // exact float equality
    EXPECT_EQ(a.digest, b.digest);
  }
}

// Tolerance: the per-step mean loss agrees with the CPU's within 1e-3 relative over the
// first 20 steps. The kernels round differently (cuBLAS vs OpenBLAS blocking, tree vs
// sequential row reductions), and the differences grow with training, slowly.
TEST(CudaTrainingTest, FollowsTheCpuLossCurve) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const int steps = 20;
    const TrainedRun cpu = Train(gpt ? Gpt(baton::v1::DEVICE_KIND_CPU, steps)
                                     : Mlp(baton::v1::DEVICE_KIND_CPU, steps));
    const TrainedRun cuda = Train(gpt ? Gpt(baton::v1::DEVICE_KIND_CUDA, steps)
                                      : Mlp(baton::v1::DEVICE_KIND_CUDA, steps));
    ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(steps));
    ASSERT_EQ(cuda.losses.size(), static_cast<size_t>(steps));
    double worst = 0.0;
    for (int i = 0; i < steps; ++i) {
      const double rel = std::fabs(cuda.losses[i] - cpu.losses[i]) / std::fabs(cpu.losses[i]);
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 1e-3) << "step " << i + 1 << ": cpu " << cpu.losses[i] << ", cuda "
                           << cuda.losses[i];
    }
    EXPECT_LT(cuda.losses.back(), cuda.losses.front());  // it trains
    // It ran on the GPU. (The digests usually differ, the kernels rounding differently, but
    // nothing says they must: a small model's few reductions may round alike.)
    EXPECT_EQ(cuda.device, Device::kCuda);
    EXPECT_EQ(cpu.device, Device::kCpu);
    std::printf("%s: worst relative loss difference cuda vs cpu over %d steps: %.3g\n",
                gpt ? "gpt" : "mlp", steps, worst);
  }
}

// The gradients of every parameter of a whole model, one micro-batch forward and backward,
// on CUDA against the CPU's (which the nn tests check against finite differences).
// Tolerance per parameter: max |cuda - cpu| <= 1e-4 * max |cpu| + 1e-7, the reductions of
// the two devices rounding differently.
TEST(CudaTrainingTest, GradientsMatchTheCpuBackends) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const baton::v1::JobSpec spec =
        gpt ? Gpt(baton::v1::DEVICE_KIND_CPU, 1) : Mlp(baton::v1::DEVICE_KIND_CPU, 1);
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    const baton::v1::JobSpec& validated = **valid;
    absl::StatusOr<std::unique_ptr<Dataset>> data = MakeDataset(*valid, DataAccess());
    ASSERT_TRUE(data.ok()) << data.status();
    absl::StatusOr<Batch> batch = (*data)->Get(0, 0, validated.data().batch_size());
    ASSERT_TRUE(batch.ok()) << batch.status();
    std::vector<std::vector<float>> grads[2];
    for (int d = 0; d < 2; ++d) {
      const Device device = d == 0 ? Device::kCpu : Device::kCuda;
      absl::StatusOr<std::unique_ptr<Sequential>> m =
          BuildBlocks(validated.model(), validated.seed(), 0, -1, device);
      ASSERT_TRUE(m.ok()) << m.status();
      MicroBatch mb{0, &batch->targets};
      Tensor loss, dx;
      ASSERT_TRUE((*m)->Forward(mb, batch->inputs, &loss).ok());
      Tensor scale = Tensor::Empty({1});
      scale.f32()[0] = 1.0f;
      ASSERT_TRUE((*m)->Backward(mb, scale, &dx).ok());
      for (Parameter* p : (*m)->Parameters()) {
        std::vector<float> host(static_cast<size_t>(p->grad.numel()));
        ASSERT_TRUE(p->grad.CopyToHost(host.data()).ok());
        grads[d].push_back(std::move(host));
      }
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) {
      float max_ref = 0.0f, max_diff = 0.0f;
      for (size_t j = 0; j < grads[0][i].size(); ++j) {
        max_ref = std::max(max_ref, std::fabs(grads[0][i][j]));
        max_diff = std::max(max_diff, std::fabs(grads[1][i][j] - grads[0][i][j]));
      }
      EXPECT_LE(max_diff, 1e-4f * max_ref + 1e-7f) << "parameter " << i;
    }
  }
}

TEST(CudaTrainingTest, AModelTooLargeForTheGpuIsResourceExhausted) {
  BATON_SKIP_WITHOUT_CUDA_DEVICE();
  // hidden.0.weight is [2^15, 2^31 - 1] floats: 256 TiB.
  baton::v1::ModelSpec spec = Mlp(baton::v1::DEVICE_KIND_CUDA, 1).model();
  spec.mutable_mlp()->set_input_dim(std::numeric_limits<int32_t>::max());
  spec.mutable_mlp()->set_width(1 << 15);
  const absl::StatusOr<std::unique_ptr<Sequential>> m = BuildBlocks(spec, 1, 0, 1, Device::kCuda);
  ASSERT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
  EXPECT_NE(m.status().message().find("parameter hidden.0.weight"), std::string::npos)
      << m.status();
  EXPECT_NE(m.status().message().find("cuda"), std::string::npos) << m.status();
  // And the device still works afterwards.
  const TrainedRun after = Train(Mlp(baton::v1::DEVICE_KIND_CUDA, 2));
  EXPECT_EQ(after.losses.size(), 2u);
}

}  // namespace
}  // namespace baton
