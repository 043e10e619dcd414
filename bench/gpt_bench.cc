// GPT forward+backward throughput on one core, for the default spec (client/examples/gpt.json).
//
// What is measured (all with OpenBLAS pinned to one thread, wall-clock time):
//   BM_GptForwardBackward  one micro-batch (batch_size / microbatches sequences of `context`
//                          tokens) forward through every block, then, last block first,
//                          BackwardInput + BackwardWeight per block: exactly the inner loop
//                          of the reference trainer. Gradients accumulate across iterations
//                          (as across the micro-batches of a step); nothing is zeroed.
//   BM_GptForward          the forward half alone: a training forward that stashes what
//                          backward needs, then Discard releases the stash.
//   BM_GptTrainerStep      one whole ReferenceTrainer::Step: zero grads, every micro-batch
//                          of the global batch (data generation included), AdamW update.
//   BM_GptCheckpointSave   one whole-model checkpoint after a step (safetensors per block
//                          with AdamW state, fsync, rename, manifest) under $TMPDIR: the
//                          cost checkpoint.every_steps adds, against BM_GptTrainerStep.
//   BM_GptCheckpointSnapshot the part of it a cluster rank's step stands still for: the
//                          checkpoint encoded in memory (the files are written while the
//                          next steps run).
//   BM_Kernel_*            the Backend kernels at the exact shapes the model calls them with,
//                          to see where a micro-batch's time goes (docs/benchmarks.md).
//
// Counters: items_per_second and tokens_per_second are tokens/s; model_flops_per_second
// uses the model's nominal FLOPs (DescribeBlocks forward FLOPs, x3 for forward+backward);
// system_allocations_per_iter is the CPU allocator's calls to the system allocator per
// iteration after warm-up (0 means the hot loop allocates nothing new: every tensor comes
// from the caching allocator).
//
// Flags: --spec=PATH (default: $BATON_SOURCE_DIR/client/examples/gpt.json), --device=cpu|cuda
// (default cpu; cuda runs BM_GptTrainerStep on the GPU, the reference trainer on the CUDA
// backend, and skips the CPU-only benchmarks), --parts=N (no benchmarks: N trainer steps
// through the part profiler, each part's device time a step: RunParts), plus Google
// Benchmark's own (--benchmark_filter, --benchmark_repetitions, --benchmark_format=json...).
// See docs/benchmarks.md for results and bench/run_gpt_bench.sh for the PyTorch comparison.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/core/backend.h"
#include "common/core/blas_kernels.h"
#include "common/core/part_profiler.h"
#include "common/core/tensor.h"
#include "common/data/dataset.h"
#include "common/nn/model.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"

#ifndef BATON_SOURCE_DIR
#define BATON_SOURCE_DIR "."
#endif

namespace baton {
namespace {

bool& OnCuda() {
  static bool cuda = false;
  return cuda;
}

std::string& SpecPath() {
  static std::string path = std::string(BATON_SOURCE_DIR) + "/client/examples/gpt.json";
  return path;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "gpt_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// The validated spec, loaded once.
const baton::v1::JobSpec& Spec() {
  static const baton::v1::JobSpec* const spec = [] {
    absl::StatusOr<baton::v1::JobSpec> s = LoadJobSpecFile(SpecPath());
    if (!s.ok()) Die("loading " + SpecPath(), s.status());
    auto* out = new baton::v1::JobSpec(*std::move(s));
    absl::Status v = ValidateAndDefaultJobSpec(out);
    if (!v.ok()) Die("validating " + SpecPath(), v);
    if (!out->model().has_gpt()) {
      Die(SpecPath(), absl::InvalidArgumentError("gpt_bench needs a gpt model spec"));
    }
    out->set_device(OnCuda() ? baton::v1::DEVICE_KIND_CUDA : baton::v1::DEVICE_KIND_CPU);
    return out;
  }();
  return *spec;
}

int64_t MicroBatchSequences() {
  return Spec().data().batch_size() / Spec().pipeline().microbatches();
}

// Nominal forward FLOPs of one sequence through the whole model.
int64_t ForwardFlopsPerSequence() {
  int64_t f = 0;
  for (const BlockInfo& b : DescribeBlocks(Spec().model())) f += b.forward_flops;
  return f;
}

// The whole model and micro-batch 0 of step 0, built once per benchmark run.
struct GptFixture {
  std::unique_ptr<Sequential> model;
  Batch batch;
  int64_t tokens = 0;  // per micro-batch

  static GptFixture Make() {
    GptFixture f;
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(Spec());
    if (!valid.ok()) Die("validating the spec", valid.status());
    absl::StatusOr<std::unique_ptr<Dataset>> data = MakeDataset(*valid, DataAccess());
    if (!data.ok()) Die("building the dataset", data.status());
    absl::StatusOr<Batch> b = (*data)->Get(0, 0, MicroBatchSequences());
    if (!b.ok()) Die("reading micro-batch 0", b.status());
    f.batch = *std::move(b);
    absl::StatusOr<std::unique_ptr<Sequential>> m = BuildBlocks(Spec().model(), Spec().seed());
    if (!m.ok()) Die("building the model", m.status());
    f.model = *std::move(m);
    f.tokens = f.batch.inputs.numel();
    return f;
  }

  // Forward of micro-batch `mb`; returns the loss.
  absl::StatusOr<float> Forward(const MicroBatch& mb) {
    Tensor loss;
    absl::Status s = model->Forward(mb, batch.inputs, &loss);
    if (!s.ok()) return s;
    return LossValue(loss);
  }

  // Backward as the reference trainer runs it: block by block, input then weight gradient.
  absl::Status Backward(const MicroBatch& mb, const Tensor& scale) {
    Tensor grad = scale;
    for (int i = model->size() - 1; i >= 0; --i) {
      Tensor next;
      absl::Status s = model->at(i).BackwardInput(mb, grad, &next);
      if (!s.ok()) return s;
      s = model->at(i).BackwardWeight(mb);
      if (!s.ok()) return s;
      grad = std::move(next);
    }
    return absl::OkStatus();
  }
};

Tensor ScaleTensor(float v) {
  Tensor t = Tensor::Empty({1});
  t.f32()[0] = v;
  return t;
}

void SetCommonCounters(benchmark::State& state, int64_t tokens_per_iter, int64_t flops_per_iter,
                       int64_t allocations_before) {
  const int64_t allocs = CpuAllocator()->Stats().system_allocations - allocations_before;
  const double iters = static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * tokens_per_iter);
  state.counters["tokens_per_second"] = benchmark::Counter(
      static_cast<double>(tokens_per_iter) * iters, benchmark::Counter::kIsRate);
  state.counters["model_flops_per_second"] = benchmark::Counter(
      static_cast<double>(flops_per_iter) * iters, benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
  state.counters["system_allocations_per_iter"] =
      iters > 0 ? static_cast<double>(allocs) / iters : 0.0;
  state.counters["tokens_per_iter"] = static_cast<double>(tokens_per_iter);
  state.counters["peak_MiB"] =
      static_cast<double>(CpuAllocator()->Stats().peak_bytes_in_use) / (1024.0 * 1024.0);
}

constexpr int kWarmup = 3;

// The benchmarks below that build blocks themselves run on the CPU only.
bool SkipOnCuda(benchmark::State& state) {
  if (!OnCuda()) return false;
  state.SkipWithError("CPU only (--device=cuda runs BM_GptTrainerStep)");
  return true;
}

void BM_GptForwardBackward(benchmark::State& state) {
  if (SkipOnCuda(state)) return;
  SetBlasThreads(1);
  GptFixture f = GptFixture::Make();
  const Tensor scale = ScaleTensor(1.0f / static_cast<float>(Spec().pipeline().microbatches()));
  const MicroBatch mb{0, &f.batch.targets};
  for (int i = 0; i < kWarmup; ++i) {
    absl::StatusOr<float> loss = f.Forward(mb);
    if (!loss.ok() || !std::isfinite(*loss)) {
      state.SkipWithError(loss.ok() ? "non-finite loss" : loss.status().ToString().c_str());
      return;
    }
    absl::Status s = f.Backward(mb, scale);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  const int64_t allocs_before = CpuAllocator()->Stats().system_allocations;
  for (auto _ : state) {
    absl::StatusOr<float> loss = f.Forward(mb);
    absl::Status s = loss.ok() ? f.Backward(mb, scale) : loss.status();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(*loss);
  }
  SetCommonCounters(state, f.tokens, 3 * ForwardFlopsPerSequence() * MicroBatchSequences(),
                    allocs_before);
}

void BM_GptForward(benchmark::State& state) {
  if (SkipOnCuda(state)) return;
  SetBlasThreads(1);
  GptFixture f = GptFixture::Make();
  const MicroBatch mb{0, &f.batch.targets};
  for (int i = 0; i < kWarmup; ++i) {
    absl::StatusOr<float> loss = f.Forward(mb);
    if (!loss.ok()) {
      state.SkipWithError(loss.status().ToString().c_str());
      return;
    }
    f.model->Discard(mb.index);
  }
  const int64_t allocs_before = CpuAllocator()->Stats().system_allocations;
  for (auto _ : state) {
    absl::StatusOr<float> loss = f.Forward(mb);
    if (!loss.ok()) {
      state.SkipWithError(loss.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(*loss);
    f.model->Discard(mb.index);  // releases the stash (back to the caching allocator)
  }
  SetCommonCounters(state, f.tokens, ForwardFlopsPerSequence() * MicroBatchSequences(),
                    allocs_before);
}

void BM_GptTrainerStep(benchmark::State& state) {
  SetBlasThreads(1);
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(Spec());
  if (!t.ok()) {
    state.SkipWithError(t.status().ToString().c_str());
    return;
  }
  ReferenceTrainer& trainer = **t;
  int64_t tokens = 0;
  for (int i = 0; i < kWarmup; ++i) {
    absl::StatusOr<StepStats> s = trainer.Step();
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    tokens = s->tokens;
  }
  const int64_t allocs_before = CpuAllocator()->Stats().system_allocations;
  for (auto _ : state) {
    absl::StatusOr<StepStats> s = trainer.Step();
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(s->loss);
  }
  SetCommonCounters(state, tokens,
                    3 * ForwardFlopsPerSequence() * Spec().data().batch_size(), allocs_before);
}

// A reference trainer on the default spec after kWarmup steps (its optimizer state filled
// in, as a checkpoint holds it); null, with the benchmark skipped, on an error.
std::unique_ptr<ReferenceTrainer> WarmTrainer(benchmark::State& state) {
  if (SkipOnCuda(state)) return nullptr;
  SetBlasThreads(1);
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(Spec());
  if (!t.ok()) {
    state.SkipWithError(t.status().ToString().c_str());
    return nullptr;
  }
  for (int i = 0; i < kWarmup; ++i) {
    if (absl::StatusOr<StepStats> s = (*t)->Step(); !s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return nullptr;
    }
  }
  return *std::move(t);
}

// One checkpoint of the whole model after a step (what every_steps costs a step, summed
// over the ranks): every block's safetensors file with its AdamW state, fsync, rename, the
// manifest. Written under $TMPDIR (default /tmp); the same step is rewritten each time.
void BM_GptCheckpointSave(benchmark::State& state) {
  std::unique_ptr<ReferenceTrainer> t = WarmTrainer(state);
  if (t == nullptr) return;
  ReferenceTrainer& trainer = *t;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                    "/gpt_bench_ckpt.XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  int64_t bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<std::vector<CheckpointBlockFile>> files = trainer.SaveCheckpoint(dir, "bench");
    if (!files.ok()) {
      state.SkipWithError(files.status().ToString().c_str());
      break;
    }
    bytes = 0;
    for (const CheckpointBlockFile& f : *files) bytes += f.bytes;
  }
  std::filesystem::remove_all(dir);
  state.counters["checkpoint_bytes"] = static_cast<double>(bytes);
  state.SetBytesProcessed(state.iterations() * bytes);
}

// What a step stands still for when the write overlaps training (the cluster workers):
// encoding the whole model's checkpoint in memory (safetensors + SHA-256), no file I/O.
void BM_GptCheckpointSnapshot(benchmark::State& state) {
  std::unique_ptr<ReferenceTrainer> t = WarmTrainer(state);
  if (t == nullptr) return;
  ReferenceTrainer& trainer = *t;
  int64_t bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<CheckpointSnapshot> snap = trainer.SnapshotCheckpoint("/nonexistent", "bench");
    if (!snap.ok()) {
      state.SkipWithError(snap.status().ToString().c_str());
      break;
    }
    bytes = snap->file_bytes();
    benchmark::DoNotOptimize(snap->manifest.data());
  }
  state.counters["checkpoint_bytes"] = static_cast<double>(bytes);
  state.SetBytesProcessed(state.iterations() * bytes);
}

// ---------------------------------------------------------------- kernels at model shapes

struct Dims {
  int64_t B, T, C, H, D, V, R;
};
Dims ModelDims() {
  const auto& g = Spec().model().gpt();
  Dims d;
  d.B = MicroBatchSequences();
  d.T = g.context();
  d.C = g.d_model();
  d.H = g.heads();
  d.D = d.C / d.H;
  d.V = g.vocab_size();
  d.R = d.B * d.T;
  return d;
}

Tensor Filled(const Shape& shape, float v) {
  Tensor t = Tensor::Empty(shape);
  float* p = t.f32();
  // A deterministic, non-constant pattern in [-v, v].
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = v * static_cast<float>((i * 37) % 101 - 50) / 50.0f;
  return t;
}

// Gemm(trans_a, trans_b, m, n, k) with contiguous operands. Args: ta, tb, m, n, k.
void BM_Kernel_Gemm(benchmark::State& state) {
  SetBlasThreads(1);
  const bool ta = state.range(0) != 0, tb = state.range(1) != 0;
  const int64_t m = state.range(2), n = state.range(3), k = state.range(4);
  Tensor a = Filled({m * k}, 0.5f), b = Filled({k * n}, 0.5f), c = Filled({m * n}, 0.1f);
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  Backend* be = CpuBackend();
  for (auto _ : state) {
    be->Gemm(ta, tb, m, n, k, 1.0f, a.f32(), lda, b.f32(), ldb, 0.0f, c.f32(), n);
    benchmark::ClobberMemory();
  }
  state.counters["flops"] = benchmark::Counter(2.0 * m * n * k * state.iterations(),
                                               benchmark::Counter::kIsRate,
                                               benchmark::Counter::kIs1000);
}

void BM_Kernel_AttentionForward(benchmark::State& state) {
  SetBlasThreads(1);
  const Dims d = ModelDims();
  Tensor qkv = Filled({d.R, 3 * d.C}, 1.0f), att = Tensor::Empty({d.B, d.H, d.T, d.T}),
         y = Tensor::Empty({d.R, d.C});
  for (auto _ : state) {
    CpuBackend()->AttentionForward(d.B, d.T, d.H, d.D, qkv.f32(), att.f32(), y.f32());
    benchmark::ClobberMemory();
  }
}

void BM_Kernel_AttentionBackward(benchmark::State& state) {
  SetBlasThreads(1);
  const Dims d = ModelDims();
  Tensor qkv = Filled({d.R, 3 * d.C}, 1.0f), att = Tensor::Empty({d.B, d.H, d.T, d.T}),
         y = Tensor::Empty({d.R, d.C}), dy = Filled({d.R, d.C}, 0.1f),
         dqkv = Tensor::Empty({d.R, 3 * d.C}), scratch = Tensor::Empty({d.T, d.T});
  CpuBackend()->AttentionForward(d.B, d.T, d.H, d.D, qkv.f32(), att.f32(), y.f32());
  for (auto _ : state) {
    CpuBackend()->AttentionBackward(d.B, d.T, d.H, d.D, qkv.f32(), att.f32(), dy.f32(),
                                    dqkv.f32(), scratch.f32());
    benchmark::ClobberMemory();
  }
}

void BM_Kernel_LayerNorm(benchmark::State& state) {
  const Dims d = ModelDims();
  Tensor x = Filled({d.R, d.C}, 1.0f), g = Filled({d.C}, 1.0f), b = Filled({d.C}, 0.1f),
         y = Tensor::Empty({d.R, d.C}), mean = Tensor::Empty({d.R}), rstd = Tensor::Empty({d.R}),
         dy = Filled({d.R, d.C}, 0.1f), dx = Tensor::Empty({d.R, d.C}), dg = Tensor::Zeros({d.C}),
         db = Tensor::Zeros({d.C});
  Backend* be = CpuBackend();
  for (auto _ : state) {
    // Forward, backward input and backward weight: one LayerNorm's work per micro-batch.
    be->LayerNormForward(d.R, d.C, 1e-5f, x.f32(), g.f32(), b.f32(), y.f32(), mean.f32(),
                         rstd.f32());
    be->LayerNormBackwardInput(d.R, d.C, x.f32(), mean.f32(), rstd.f32(), g.f32(), dy.f32(),
                               dx.f32());
    be->LayerNormBackwardWeight(d.R, d.C, x.f32(), mean.f32(), rstd.f32(), dy.f32(), dg.f32(),
                                db.f32());
    benchmark::ClobberMemory();
  }
}

void BM_Kernel_BiasGelu(benchmark::State& state) {
  const Dims d = ModelDims();
  const int64_t n = 4 * d.C;
  Tensor x = Filled({d.R, n}, 2.0f), b = Filled({n}, 0.1f), pre = Tensor::Empty({d.R, n}),
         out = Tensor::Empty({d.R, n}), dy = Filled({d.R, n}, 0.1f), dx = Tensor::Empty({d.R, n});
  Backend* be = CpuBackend();
  for (auto _ : state) {
    // Forward and backward of the MLP's GELU.
    be->BiasGelu(d.R, n, x.f32(), b.f32(), pre.f32(), out.f32(), false);
    be->GeluBackward(d.R * n, pre.f32(), dy.f32(), dx.f32());
    benchmark::ClobberMemory();
  }
}

void BM_Kernel_SoftmaxCrossEntropy(benchmark::State& state) {
  const Dims d = ModelDims();
  Tensor logits = Filled({d.R, d.V}, 3.0f), dlogits = Tensor::Empty({d.R, d.V}),
         stats = Tensor::Empty({d.R, 2}), losses = Tensor::Empty({d.R}),
         targets = Tensor::Empty({d.R}, DType::kInt32);
  for (int64_t r = 0; r < d.R; ++r) targets.i32()[r] = static_cast<int32_t>(r % d.V);
  Backend* be = CpuBackend();
  for (auto _ : state) {
    be->SoftmaxCrossEntropyForward(d.R, d.V, d.V, logits.f32(), targets.i32(), stats.f32(),
                                   losses.f32());
    be->SoftmaxCrossEntropyBackward(d.R, d.V, d.V, logits.f32(), stats.f32(), targets.i32(), 0.01f,
                                    dlogits.f32());
    benchmark::ClobberMemory();
  }
}

void BM_Kernel_AdamW(benchmark::State& state) {
  int64_t n = 0;
  for (const BlockInfo& b : DescribeBlocks(Spec().model())) n += b.parameters;
  Tensor w = Filled({n}, 0.1f), g = Filled({n}, 0.01f), m = Tensor::Zeros({n}),
         v = Tensor::Zeros({n});
  for (auto _ : state) {
    CpuBackend()->AdamWStep(n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.1f, 0.001f, w.f32(), g.f32(),
                            m.f32(), v.f32());
    benchmark::ClobberMemory();
  }
  state.counters["parameters"] = static_cast<double>(n);
}

// The GEMM shapes of one micro-batch (R = B*T rows), as Linear and the attention core
// call them. Registered from main() once the spec is known.
void RegisterKernelBenchmarks() {
  const Dims d = ModelDims();
  const int64_t R = d.R, C = d.C, V = d.V, T = d.T, D = d.D;
  struct G {
    const char* what;
    int64_t ta, tb, m, n, k;
  };
  const std::vector<G> gemms = {
      // Linear forward: y = x W^T  [R, out] = [R, in] x [out, in]^T
      {"fwd.qkv", 0, 1, R, 3 * C, C},
      {"fwd.attn_proj", 0, 1, R, C, C},
      {"fwd.mlp_fc", 0, 1, R, 4 * C, C},
      {"fwd.mlp_proj", 0, 1, R, C, 4 * C},
      {"fwd.head", 0, 1, R, V, C},
      // Linear backward input: dx = dz W  [R, in] = [R, out] x [out, in]
      {"bwd_in.qkv", 0, 0, R, C, 3 * C},
      {"bwd_in.attn_proj", 0, 0, R, C, C},
      {"bwd_in.mlp_fc", 0, 0, R, C, 4 * C},
      {"bwd_in.mlp_proj", 0, 0, R, 4 * C, C},
      {"bwd_in.head", 0, 0, R, C, V},
      // Linear backward weight: dW += dz^T x  [out, in] = [R, out]^T x [R, in]
      {"bwd_w.qkv", 1, 0, 3 * C, C, R},
      {"bwd_w.attn_proj", 1, 0, C, C, R},
      {"bwd_w.mlp_fc", 1, 0, 4 * C, C, R},
      {"bwd_w.mlp_proj", 1, 0, C, 4 * C, R},
      {"bwd_w.head", 1, 0, V, C, R},
      // Attention core, per (sequence, head).
      {"attn.scores_qkT", 0, 1, T, T, D},
      {"attn.mix_att_v", 0, 0, T, D, T},
      {"attn.dv_attT_dy", 1, 0, T, D, T},
  };
  for (const G& g : gemms) {
    benchmark::RegisterBenchmark(
        ("BM_Kernel_Gemm/" + std::string(g.what)).c_str(), BM_Kernel_Gemm)
        ->Args({g.ta, g.tb, g.m, g.n, g.k})
        ->ArgNames({"ta", "tb", "m", "n", "k"})
        ->UseRealTime()
        ->MinTime(0.2);
  }
  benchmark::RegisterBenchmark("BM_Kernel_AttentionForward", BM_Kernel_AttentionForward)
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark("BM_Kernel_AttentionBackward", BM_Kernel_AttentionBackward)
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark("BM_Kernel_LayerNormFwdBwd", BM_Kernel_LayerNorm)
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark("BM_Kernel_BiasGeluFwdBwd", BM_Kernel_BiasGelu)
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark("BM_Kernel_SoftmaxCrossEntropyFwdBwd",
                               BM_Kernel_SoftmaxCrossEntropy)
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark("BM_Kernel_AdamWAllParameters", BM_Kernel_AdamW)
      ->UseRealTime()
      ->MinTime(0.2);
}

}  // namespace
// --parts=N: where a trainer step's device time goes (common/core/part_profiler.h). Builds
// the reference trainer over the part profiler, runs kWarmup steps, then N profiled steps,
// and prints, per step: each part's time, share of the step and calls, the parts' sum, the
// step's wall time and what of it the device spent idle (the host issuing work). Returns
// the exit status.
int RunParts(int steps) {
  const Device device = OnCuda() ? Device::kCuda : Device::kCpu;
  absl::StatusOr<Backend*> inner = BackendFor(device);
  if (!inner.ok()) Die("the backend", inner.status());
  PartProfiler profiler(*inner, Spec().model().gpt().vocab_size());  // outlives the trainer
  SetBackendOverride(device, &profiler);
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(Spec());
  SetBackendOverride(device, nullptr);  // the trainer's modules keep it
  if (!t.ok()) Die("the trainer", t.status());
  for (int i = 0; i < kWarmup; ++i) {
    if (absl::StatusOr<StepStats> s = (*t)->Step(); !s.ok()) Die("a warm-up step", s.status());
  }
  if (absl::Status s = profiler.Collect(); !s.ok()) Die("reading the device's times", s);
  profiler.ResetTotals();
  int64_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<StepStats> s = (*t)->Step();
    if (!s.ok()) Die("a profiled step", s.status());
    tokens = s->tokens;
    if (absl::Status c = profiler.Collect(); !c.ok()) Die("reading the device's times", c);
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      steps;
  const auto& g = Spec().model().gpt();
  std::printf(
      "parts: %s on %s, %s, d_model %d, %d layers, context %d, %lld tokens a step, "
      "%d profiled steps (after %d warm-up)\n",
      SpecPath().c_str(), DeviceName(device),
      Spec().precision() == baton::v1::PRECISION_BF16 ? "bf16" : "fp32", g.d_model(), g.layers(),
      g.context(), static_cast<long long>(tokens), steps, kWarmup);
  double sum_ms = 0;
  for (int p = 0; p < kStepParts; ++p) {
    const PartProfiler::Part& part = profiler.totals()[p];
    const double ms = static_cast<double>(part.ns) / 1e6 / steps;
    sum_ms += ms;
    std::printf("part %-13s %10.3f ms/step %5.1f%% %8lld calls/step\n",
                StepPartName(static_cast<StepPart>(p)), ms, 100 * ms / wall_ms,
                static_cast<long long>(part.calls / steps));
  }
  std::printf("parts' sum         %10.3f ms/step %5.1f%%\n", sum_ms, 100 * sum_ms / wall_ms);
  // Then each kernel in each part, the most time first.
  struct Row {
    double ms;
    long long calls;
    const char* part;
    std::string kernel;
  };
  std::vector<Row> rows;
  for (int p = 0; p < kStepParts; ++p) {
    for (const auto& [name, k] : profiler.kernels(static_cast<StepPart>(p))) {
      if (k.calls == 0) continue;
      rows.push_back({static_cast<double>(k.ns) / 1e6 / steps,
                      static_cast<long long>(k.calls / steps),
                      StepPartName(static_cast<StepPart>(p)), name});
    }
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.ms > b.ms; });
  for (const Row& r : rows) {
    std::printf("kernel %-26s %10.3f ms/step %5.1f%% %8lld calls/step (%s)\n", r.kernel.c_str(),
                r.ms, 100 * r.ms / wall_ms, r.calls, r.part);
  }
  std::printf("step (wall)        %10.3f ms/step; the device %s %.3f ms/step (%.1f%%)\n", wall_ms,
              device == Device::kCuda ? "idle" : "outside the kernels", wall_ms - sum_ms,
              100 * (wall_ms - sum_ms) / wall_ms);
  return 0;
}

}  // namespace baton

BENCHMARK(baton::BM_GptForwardBackward)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
BENCHMARK(baton::BM_GptForward)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
BENCHMARK(baton::BM_GptTrainerStep)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
BENCHMARK(baton::BM_GptCheckpointSave)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
BENCHMARK(baton::BM_GptCheckpointSnapshot)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  baton::ChooseBlasKernels(argv);  // the kernels a worker runs (may re-execute)
  // Our own flag first: Google Benchmark rejects flags it does not know.
  int kept = 1;
  int parts = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--parts=", 8) == 0) {
      parts = std::atoi(argv[i] + 8);
      if (parts < 1) {
        std::fprintf(stderr, "gpt_bench: --parts=N needs N >= 1 steps, got '%s'\n", argv[i] + 8);
        return 2;
      }
    } else if (std::strncmp(argv[i], "--spec=", 7) == 0) {
      baton::SpecPath() = argv[i] + 7;
    } else if (std::strcmp(argv[i], "--device=cuda") == 0) {
      baton::OnCuda() = true;
    } else if (std::strcmp(argv[i], "--device=cpu") == 0) {
      baton::OnCuda() = false;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (parts > 0) {
    baton::SetBlasThreads(1);
    return baton::RunParts(parts);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  baton::SetBlasThreads(1);
  const auto& g = baton::Spec().model().gpt();
  benchmark::AddCustomContext("spec", baton::SpecPath());
  benchmark::AddCustomContext(
      "model", "gpt vocab=" + std::to_string(g.vocab_size()) +
                   " context=" + std::to_string(g.context()) +
                   " d_model=" + std::to_string(g.d_model()) +
                   " heads=" + std::to_string(g.heads()) + " layers=" + std::to_string(g.layers()));
  benchmark::AddCustomContext(
      "micro_batch", std::to_string(baton::MicroBatchSequences()) + " sequences x " +
                         std::to_string(g.context()) + " tokens");
  benchmark::AddCustomContext("blas_threads", std::to_string(baton::BlasThreads()));
  benchmark::AddCustomContext("kernels", baton::CurrentBlasKernels().Describe());
  benchmark::AddCustomContext("device", baton::OnCuda() ? "cuda" : "cpu");
  if (!baton::OnCuda()) baton::RegisterKernelBenchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
