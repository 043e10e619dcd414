// The headline guarantee: a pipeline run of any schedule gives the same weights and the
// same per-step losses, bit for bit, as the single-process reference trainer with the same
// micro-batching.
//
// Built twice: pipeline_test runs every case on the CPU; cuda_pipeline_test (ctest label
// gpu, BATON_TEST_DEVICE_CUDA) runs the same cases with every rank and the reference on one
// GPU, and skips without one (fails instead under BATON_REQUIRE_GPU).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/collective/nccl_collective.h"
#include "common/core/cuda_device.h"
#include "common/core/cuda_test_util.h"
#include "common/core/status.h"
#include "common/nccl/nccl_fake_test_util.h"
#include "common/pipeline/local_pipeline.h"
#include "common/schedule/generators.h"
#include "common/spec/schedule_spec.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

#ifdef BATON_TEST_DEVICE_CUDA
constexpr baton::v1::DeviceKind kTestDevice = baton::v1::DEVICE_KIND_CUDA;

const testing::Environment* const kRequireCuda =
    testing::AddGlobalTestEnvironment(new RequireCudaEnvironment());
#else
constexpr baton::v1::DeviceKind kTestDevice = baton::v1::DEVICE_KIND_CPU;
#endif

// 8 blocks each, so that S*V up to 8 chunks fit.
baton::v1::JobSpec MlpJob() {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(R"({
    "model": {"mlp": {"inputDim": 5, "width": 12, "depth": 7, "outputDim": 3}},
    "data": {"synthetic": {"teacherWidth": 6}, "batchSize": 24},
    "optimizer": {"sgd": {"learningRate": 0.05, "momentum": 0.9}},
    "steps": 3, "seed": 5})");
  EXPECT_TRUE(s.ok()) << s.status();
  s->set_device(kTestDevice);
  return *s;
}

baton::v1::JobSpec GptJob() {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(R"({
    "model": {"gpt": {"vocabSize": 30, "context": 8, "dModel": 16, "heads": 2, "layers": 6}},
    "data": {"text": {"inlineText": "pipelines must agree with the reference to the last bit, always."},
             "batchSize": 24},
    "optimizer": {"adamw": {"learningRate": 0.01}},
    "steps": 3, "seed": 9})");
  EXPECT_TRUE(s.ok()) << s.status();
  s->set_device(kTestDevice);
  return *s;
}

// LLaMA with grouped-query attention (2 query heads per key/value head) and its output
// projection tied to the embedding, so the clock's TIE_GRAD runs here too.
baton::v1::JobSpec LlamaJob() {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(R"({
    "model": {"llama": {"vocabSize": 30, "context": 8, "dModel": 16, "heads": 4, "kvHeads": 2,
                        "layers": 6, "intermediateSize": 24, "tieEmbeddings": true}},
    "data": {"text": {"inlineText": "pipelines must agree with the reference to the last bit, always."},
             "batchSize": 24},
    "optimizer": {"adamw": {"learningRate": 0.01}},
    "steps": 3, "seed": 9})");
  EXPECT_TRUE(s.ok()) << s.status();
  s->set_device(kTestDevice);
  return *s;
}

// The models of the bit-exactness matrix: every block family, tied (GPT-2's default and
// the llama above) and untied.
enum class Model { kMlp, kGpt, kGptUntied, kLlama };
const char* ModelName(Model m) {
  switch (m) {
    case Model::kMlp:
      return "Mlp";
    case Model::kGpt:
      return "Gpt";
    case Model::kGptUntied:
      return "GptUntied";
    case Model::kLlama:
      return "Llama";
  }
  return "?";
}
baton::v1::JobSpec JobFor(Model m) {
  switch (m) {
    case Model::kMlp:
      return MlpJob();
    case Model::kGpt:
      return GptJob();
    case Model::kGptUntied: {
      baton::v1::JobSpec spec = GptJob();
      spec.mutable_model()->mutable_gpt()->set_tie_embeddings(false);
      return spec;
    }
    case Model::kLlama:
      return LlamaJob();
  }
  return MlpJob();
}

struct TrainRun {
  std::vector<float> losses;
  std::string digest;
  std::vector<int> peak_inflight;  // max over steps, per rank (pipeline only)
  std::vector<float> learning_rates;  // per step
  std::vector<float> grad_norms;      // per step; -1 when the job does not clip
};

TrainRun Reference(const baton::v1::JobSpec& spec) {
  TrainRun out;
  auto t = ReferenceTrainer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return out;
  for (int i = 0; i < spec.steps(); ++i) {
    auto s = (*t)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return out;
    out.losses.push_back(s->loss);
    out.learning_rates.push_back(s->learning_rate);
    out.grad_norms.push_back(s->grad_norm.value_or(-1.0f));
  }
  out.digest = DigestHex((*t)->WeightsDigest());
  return out;
}

absl::StatusOr<TrainRun> Pipeline(const baton::v1::JobSpec& spec, LocalPipelineOptions opts = {}) {
  auto t = LocalPipelineTrainer::Create(spec, std::move(opts));
  if (!t.ok()) return t.status();
  TrainRun out;
  for (int i = 0; i < spec.steps(); ++i) {
    auto s = (*t)->Step();
    if (!s.ok()) return s.status();
    out.losses.push_back(s->loss);
    out.peak_inflight.resize(s->peak_inflight.size(), 0);
    for (size_t r = 0; r < s->peak_inflight.size(); ++r) {
      out.peak_inflight[r] = std::max(out.peak_inflight[r], s->peak_inflight[r]);
    }
    EXPECT_EQ((*t)->hub().Pending(), 0) << "tensors left undelivered after step " << i;
    out.learning_rates.push_back(s->learning_rate);
    out.grad_norms.push_back(s->grad_norm.value_or(-1.0f));
    for (const RankStepResult& r : s->ranks) {  // every rank the same numbers
      EXPECT_EQ(r.learning_rate, s->learning_rate) << "rank " << r.rank << " step " << i;
      EXPECT_EQ(r.grad_norm, s->grad_norm) << "rank " << r.rank << " step " << i;
    }
  }
  out.digest = DigestHex((*t)->WeightsDigest());
  return out;
}

struct Case {
  baton::v1::Schedule schedule;
  int stages;
  int virtual_stages;
  int microbatches;
  Model model;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << baton::v1::Schedule_Name(c.schedule) << " S=" << c.stages << " V=" << c.virtual_stages
      << " M=" << c.microbatches << " " << ModelName(c.model);
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string kind = baton::v1::Schedule_Name(c.schedule).substr(9);  // drop "SCHEDULE_"
  kind.erase(std::remove(kind.begin(), kind.end(), '_'), kind.end());
  return absl::StrCat(ModelName(c.model), kind, "S", c.stages, "V", c.virtual_stages, "M",
                      c.microbatches);
}

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (Model model : {Model::kMlp, Model::kGpt, Model::kGptUntied, Model::kLlama}) {
    const int blocks = static_cast<int>(DescribeBlocks(JobFor(model).model()).size());
    for (auto sched : {baton::v1::SCHEDULE_GPIPE, baton::v1::SCHEDULE_1F1B,
                       baton::v1::SCHEDULE_INTERLEAVED_1F1B, baton::v1::SCHEDULE_ZB_H1,
                       baton::v1::SCHEDULE_ZB_V, baton::v1::SCHEDULE_V_HALF,
                       baton::v1::SCHEDULE_DUALPIPE_V}) {
      const bool interleaved = sched == baton::v1::SCHEDULE_INTERLEAVED_1F1B;
      const bool dual = sched == baton::v1::SCHEDULE_DUALPIPE_V;
      const bool v_shape = sched == baton::v1::SCHEDULE_ZB_V ||
                           sched == baton::v1::SCHEDULE_V_HALF || dual;
      for (int S = 1; S <= 4; ++S) {
        // Interleaving needs V >= 2 (with V = 1 it is 1F1B, which the generator says) and,
        // Megatron-style, M a multiple of S. A V takes two chunks per rank (each needs a
        // block of the model) and at least S micro-batches (2S for dualpipe-v).
        if (v_shape && 2 * S > blocks) continue;
        for (int V : interleaved || v_shape ? std::vector<int>{2} : std::vector<int>{1}) {
          for (int M : {1, 2, 3, 4, 8}) {
            if (interleaved && M % S != 0) continue;
            if (v_shape && M < (dual ? 2 * S : S)) continue;
            // The untied gpt is the old gpt: a few shapes suffice.
            if (model == Model::kGptUntied && (S > 2 || M > 2)) continue;
            out.push_back({sched, S, V, M, model});
          }
        }
      }
    }
  }
  return out;
}

// The case's model and pipeline.
baton::v1::JobSpec SpecFor(const Case& c) {
  baton::v1::JobSpec spec = JobFor(c.model);
  auto* p = spec.mutable_pipeline();
  p->set_schedule(c.schedule);
  p->set_stages(c.stages);
  p->set_virtual_stages(c.virtual_stages);
  p->set_microbatches(c.microbatches);
  return spec;
}

// The reference trainer on `reference` and the pipeline on `pipelined` (the same job, run
// another way: recomputing, say): the same losses, step by step, exact float equality, and
// the same digest.
void ExpectReferenceBits(const baton::v1::JobSpec& reference,
                         const baton::v1::JobSpec& pipelined) {
  const TrainRun ref = Reference(reference);
  absl::StatusOr<TrainRun> pipe = Pipeline(pipelined);
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  ASSERT_EQ(ref.losses.size(), 3u);
  EXPECT_EQ(pipe->losses, ref.losses);
  EXPECT_EQ(pipe->digest, ref.digest);
}

class BitExactTest : public testing::TestWithParam<Case> {};

TEST_P(BitExactTest, SameWeightsAndLossesAsTheReferenceTrainer) {
  const baton::v1::JobSpec spec = SpecFor(GetParam());
  ExpectReferenceBits(spec, spec);
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, BitExactTest, testing::ValuesIn(AllCases()), CaseName);

void AddRecipe(baton::v1::JobSpec* spec);  // below, with the recipe's tests

// bf16 mixed precision (docs/precision.md): the same rounding points in the pipeline and
// the reference trainer, so the same bits, under every schedule and partition; the
// activations and gradients between stages travel as bf16 and lose nothing.
void UseBf16(baton::v1::JobSpec* spec) { spec->set_precision(baton::v1::PRECISION_BF16); }

std::vector<Case> Bf16Cases() {
  std::vector<Case> out;
  for (const Case& c : AllCases()) {
    if (c.microbatches != 2 && c.microbatches != 4) continue;  // the runtime
    out.push_back(c);
  }
  return out;
}

class Bf16BitExactTest : public testing::TestWithParam<Case> {};

TEST_P(Bf16BitExactTest, SameWeightsAndLossesAsTheReferenceTrainer) {
  baton::v1::JobSpec spec = SpecFor(GetParam());
  UseBf16(&spec);
  ExpectReferenceBits(spec, spec);
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, Bf16BitExactTest, testing::ValuesIn(Bf16Cases()),
                         CaseName);

// A control for the above: bf16 really rounds (other weights than fp32), yet trains the
// same model (losses within a bf16-sized tolerance of fp32's).
TEST(Bf16ControlTest, RoundsButStaysCloseToFp32) {
  for (Model model : {Model::kMlp, Model::kGpt, Model::kLlama}) {
    baton::v1::JobSpec spec = JobFor(model);
    const TrainRun fp32 = Reference(spec);
    UseBf16(&spec);
    const TrainRun bf16 = Reference(spec);
    ASSERT_EQ(fp32.losses.size(), bf16.losses.size());
    EXPECT_NE(fp32.digest, bf16.digest) << ModelName(model);
    for (size_t i = 0; i < fp32.losses.size(); ++i) {
      EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 0.02 * std::abs(fp32.losses[i]) + 1e-3)
          << ModelName(model) << " step " << i;
    }
  }
}

// The tensors between stages are bf16: half the bytes of fp32, and a receiver refuses a
// float32 tensor where its plan says bf16.
TEST(Bf16WireTest, StagesExchangeHalfTheBytes) {
  auto wire_bytes = [](baton::v1::JobSpec spec) -> int64_t {
    spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_1F1B);
    spec.mutable_pipeline()->set_stages(2);
    auto t = LocalPipelineTrainer::Create(spec);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return -1;
    auto st = (*t)->Step();
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return -1;
    int64_t bytes = 0;
    for (const RankStepResult& r : st->ranks) {
      for (const ActionTiming& a : r.timeline) {
        if (a.action.kind == ActionKind::kSendF || a.action.kind == ActionKind::kSendB) {
          bytes += a.bytes;
        }
      }
    }
    return bytes;
  };
  baton::v1::JobSpec spec = JobFor(Model::kGpt);
  const int64_t fp32 = wire_bytes(spec);
  UseBf16(&spec);
  const int64_t bf16 = wire_bytes(spec);
  EXPECT_GT(fp32, 0);
  EXPECT_EQ(2 * bf16, fp32);
}

// Data parallelism and recomputation in bf16: the replica sums and the rerun forwards are
// the reference trainer's bits too.
TEST(Bf16BitExactTest, ReplicasAndRecomputeGiveTheReferenceBits) {
  for (Model model : {Model::kGpt, Model::kLlama}) {
    for (auto sched : {baton::v1::SCHEDULE_1F1B, baton::v1::SCHEDULE_ZB_V}) {
      for (bool shard : {false, true}) {  // and with the optimizer sharded
        SCOPED_TRACE(shard ? "sharded" : "not sharded");
        Case c{sched, 2, sched == baton::v1::SCHEDULE_ZB_V ? 2 : 1, 2, model};
        baton::v1::JobSpec spec = SpecFor(c);
        UseBf16(&spec);
        AddRecipe(&spec);
        spec.mutable_pipeline()->set_data_parallel(2);
        spec.mutable_pipeline()->set_recompute(baton::v1::RECOMPUTE_FULL);
        spec.mutable_optimizer()->set_shard(shard);
        const TrainRun ref = Reference(spec);
        auto t = LocalPipelineTrainer::Create(spec);
        ASSERT_TRUE(t.ok()) << t.status();
        std::vector<float> losses;
        for (int i = 0; i < spec.steps(); ++i) {
          auto st = (*t)->Step();
          ASSERT_TRUE(st.ok()) << st.status();
          losses.push_back(st->loss);
        }
        EXPECT_EQ(losses, ref.losses) << ModelName(model);
        for (int d = 0; d < 2; ++d) {
          EXPECT_EQ(DigestHex((*t)->WeightsDigest(d)), ref.digest) << ModelName(model);
        }
      }
    }
  }
}

// A sharded bf16 job keeps each Linear weight in float32 on its owner only: the other
// replicas hold its bf16 bits, all a product reads, and the all-gather after every step
// rounds the owner's update into them. Every replica still ends with the reference
// trainer's float32 weights (the digests and checkpoints read the owners'), D = 2 and 4.
TEST(Bf16BitExactTest, ShardedReplicasKeepTheWeightsTheyDoNotUpdateAsBf16Bits) {
  for (Model model : {Model::kGpt, Model::kLlama}) {
    for (int replicas : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(ModelName(model), " D=", replicas));
      const int S = 3;
      baton::v1::JobSpec spec = SpecFor(Case{baton::v1::SCHEDULE_1F1B, S, 1, 2, model});
      UseBf16(&spec);
      AddRecipe(&spec);
      spec.mutable_pipeline()->set_data_parallel(replicas);
      spec.mutable_optimizer()->set_shard(true);
      const TrainRun ref = Reference(spec);
      auto t = LocalPipelineTrainer::Create(spec);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int i = 0; i < spec.steps(); ++i) ASSERT_TRUE((*t)->Step().ok());
      for (int d = 0; d < replicas; ++d) EXPECT_EQ(DigestHex((*t)->WeightsDigest(d)), ref.digest);
      int64_t packed = 0;
      for (int r = 0; r < S; ++r) {
        std::map<std::string, int> float_holders;  // a bf16_operand parameter's float32 copies
        for (int d = 0; d < replicas; ++d) {
          StageExecutor& e = (*t)->executor(d * S + r);
          std::set<const Parameter*> owned;
          for (const Optimizer::Slot& slot : e.optimizer().Slots()) owned.insert(slot.param);
          int64_t kept_as_bits = 0;
          for (const Parameter* p : e.parameters()) {
            const bool bits = p->bf16_operand && !owned.contains(p);
            EXPECT_EQ(p->value.dtype(), bits ? DType::kBFloat16 : DType::kFloat32) << p->name;
            EXPECT_EQ(p->value.nbytes(), (bits ? 2u : 4u) * p->value.numel()) << p->name;
            if (p->bf16_operand && !bits) ++float_holders[p->name];
            if (bits) ++kept_as_bits;
          }
          EXPECT_EQ(e.KeepsBf16Weights(), kept_as_bits > 0);
          packed += kept_as_bits;
        }
        for (const Parameter* p : (*t)->executor(r).parameters()) {
          if (p->bf16_operand) EXPECT_EQ(float_holders[p->name], 1) << p->name << ": its owner";
        }
      }
      EXPECT_GT(packed, 0);
    }
  }
}

// The training recipe (docs/training.md): warmup then cosine decay, global-norm clipping
// with a bound the gradients exceed (so every step scales them), AdamW's weight decay on
// the matrices only. The norm's exchange (CLIP_GRAD) and the schedule give the reference
// trainer's bits under every schedule and partition, tied (gpt, llama) or not.
void AddRecipe(baton::v1::JobSpec* spec) {
  baton::v1::OptimizerSpec* o = spec->mutable_optimizer();
  o->mutable_adamw()->set_weight_decay(0.1f);
  o->set_weight_decay_scope(baton::v1::WEIGHT_DECAY_SCOPE_MATRICES);
  o->set_clip_grad_norm(0.05f);
  baton::v1::LrSchedule* l = o->mutable_lr_schedule();
  l->set_warmup_steps(2);
  l->set_decay(baton::v1::LR_DECAY_COSINE);
  l->set_min_lr(0.001f);
  spec->set_steps(4);  // two of warmup, the peak, half way down
}

std::vector<Case> RecipeCases() {
  std::vector<Case> out;
  for (const Case& c : AllCases()) {
    // A representative subset (the runtime): M of 2 and 4, every schedule and S.
    if (c.model == Model::kMlp || (c.microbatches != 2 && c.microbatches != 4)) continue;
    out.push_back(c);
  }
  return out;
}

class RecipeBitExactTest : public testing::TestWithParam<Case> {};

TEST_P(RecipeBitExactTest, SameWeightsLossesRatesAndNormsAsTheReferenceTrainer) {
  baton::v1::JobSpec spec = SpecFor(GetParam());
  AddRecipe(&spec);
  const TrainRun ref = Reference(spec);
  ASSERT_EQ(ref.grad_norms.size(), 4u);
  for (float n : ref.grad_norms) EXPECT_GT(n, 0.05f) << "the bound must clip";
  EXPECT_LT(ref.learning_rates[0], ref.learning_rates[1]);  // warmup
  EXPECT_GT(ref.learning_rates[2], ref.learning_rates[3]);  // cosine
  absl::StatusOr<TrainRun> pipe = Pipeline(spec);
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  EXPECT_EQ(pipe->losses, ref.losses);
  EXPECT_EQ(pipe->learning_rates, ref.learning_rates);
  EXPECT_EQ(pipe->grad_norms, ref.grad_norms);
  EXPECT_EQ(pipe->digest, ref.digest);
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, RecipeBitExactTest, testing::ValuesIn(RecipeCases()),
                         CaseName);

// Clipping changes the bits (a control: the recipe tests would pass vacuously otherwise),
// and so does the weight-decay scope.
TEST(RecipeControlTest, ClippingAndTheDecayScopeChangeTheWeights) {
  baton::v1::JobSpec spec = JobFor(Model::kGpt);
  AddRecipe(&spec);
  const std::string clipped = Reference(spec).digest;
  baton::v1::JobSpec unclipped = spec;
  unclipped.mutable_optimizer()->set_clip_grad_norm(0.0f);
  EXPECT_NE(Reference(unclipped).digest, clipped);
  baton::v1::JobSpec all = spec;
  all.mutable_optimizer()->set_weight_decay_scope(baton::v1::WEIGHT_DECAY_SCOPE_ALL);
  EXPECT_NE(Reference(all).digest, clipped);
}

// Data parallelism: D replicas of the pipeline, each stage's gradients summed over its
// replicas in replica order. Every replica ends with the reference trainer's weights for
// the same data_parallel grouping, bit for bit, under every schedule.
//
// With a sharded optimizer (optimizer.shard) the gradients are reduce-scattered to their
// owners, each replica updates only what it owns, and the weights are all-gathered: the
// same bits again, with tied embeddings, clipping (the norm from the owners' squares),
// recomputation, and D = 2, 3, 4.
struct DpCase {
  Case pipeline;
  int replicas;
  bool recipe = false;  // AddRecipe: the norm is of the replica sums, no exchange across them
  bool shard = false;
  bool recompute = false;
};

std::vector<DpCase> DataParallelCases() {
  std::vector<DpCase> out;
  for (const Case& c : AllCases()) {
    if (c.stages > 2 || c.microbatches != 2) continue;
    for (int d : {1, 2, 3}) out.push_back({c, d});
    for (int d : {2, 3, 4}) out.push_back({c, d, false, true});
    if (c.model == Model::kGpt || c.model == Model::kLlama) {
      out.push_back({c, 2, true});
      out.push_back({c, 2, true, true});
      out.push_back({c, 3, true, true, true});
    }
  }
  return out;
}

// The optimizer state a rank holds, in bytes.
int64_t OptimizerStateBytes(StageExecutor& e) {
  int64_t bytes = 0;
  for (const Optimizer::Slot& s : e.optimizer().Slots()) bytes += s.state->nbytes();
  return bytes;
}

class DataParallelBitExactTest : public testing::TestWithParam<DpCase> {};

TEST_P(DataParallelBitExactTest, EveryReplicaEndsWithTheReferenceWeights) {
  const DpCase& c = GetParam();
  baton::v1::JobSpec spec = SpecFor(c.pipeline);
  if (c.recipe) AddRecipe(&spec);
  auto* p = spec.mutable_pipeline();
  p->set_data_parallel(c.replicas);
  p->set_reduce_bucket_bytes(256);  // several buckets per stage, one parameter each at most
  if (c.recompute) p->set_recompute(baton::v1::RECOMPUTE_FULL);
  spec.mutable_optimizer()->set_shard(c.shard);
  const TrainRun ref = Reference(spec);
  auto t = LocalPipelineTrainer::Create(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ((*t)->replicas(), c.replicas);
  EXPECT_EQ((*t)->schedule().reduces_grads(), c.replicas > 1);
  std::vector<float> losses;
  for (int i = 0; i < spec.steps(); ++i) {
    auto st = (*t)->Step();
    ASSERT_TRUE(st.ok()) << st.status();
    losses.push_back(st->loss);
    ASSERT_EQ(st->ranks.size(), static_cast<size_t>(c.replicas * c.pipeline.stages));
    for (const RankStepResult& r : st->ranks) {  // every rank of every replica
      EXPECT_EQ(r.grad_norm.value_or(-1.0f), ref.grad_norms[i]) << "rank " << r.rank;
      EXPECT_EQ(r.learning_rate, ref.learning_rates[i]) << "rank " << r.rank;
    }
    if (c.replicas > 1) {
      // With 256-byte buckets, at least one reduction per block the rank holds, and
      // together they sum every gradient once.
      for (size_t g = 0; g < st->ranks.size(); ++g) {
        const RankStepResult& r = st->ranks[g];
        int64_t grad_bytes = 0;
        for (const Parameter* prm : (*t)->executor(static_cast<int>(g)).parameters()) {
          grad_bytes += prm->grad.numel() * static_cast<int64_t>(sizeof(float));
        }
        int64_t reduced = 0, gathered = 0;
        for (const ActionTiming& a : r.reductions) {
          // Sharded, STEP's all-gathers follow the reductions; nothing else runs.
          if (c.shard && a.action.kind == ActionKind::kStep) {
            gathered += a.bytes;
            continue;
          }
          EXPECT_EQ(a.action.kind, ActionKind::kReduceGrad);
          EXPECT_EQ(gathered, 0) << "a reduction after an all-gather";
          reduced += a.bytes;
        }
        EXPECT_EQ(reduced, grad_bytes) << "rank " << g;
        EXPECT_EQ(gathered, c.shard ? grad_bytes : 0) << "rank " << g;
        EXPECT_EQ(r.optimizer_state_bytes, OptimizerStateBytes((*t)->executor(static_cast<int>(g))))
            << "rank " << g;
        EXPECT_GE(r.reductions.size(), static_cast<size_t>(c.pipeline.virtual_stages));
      }
    }
  }
  if (c.replicas > 1) {
    // Each rank of a stage holds its own share of the optimizer state when sharded, and
    // the shares add up to the whole; unsharded, every replica holds the whole.
    const int ranks = c.pipeline.stages;
    for (int rank = 0; rank < ranks; ++rank) {
      const int64_t whole = OptimizerStateBytes((*t)->executor(rank));
      int64_t sum = 0;
      for (int d = 0; d < c.replicas; ++d) {
        const int64_t held = OptimizerStateBytes((*t)->executor(d * ranks + rank));
        sum += held;
        if (!c.shard) EXPECT_EQ(held, whole) << "rank " << rank << " replica " << d;
      }
      if (c.shard) {
        int64_t params = 0;
        for (const Parameter* prm : (*t)->executor(rank).parameters()) {
          params += prm->value.nbytes();
        }
        // The algorithm's slots per parameter (SGD with momentum 1, AdamW 2) times the
        // parameters, split over the replicas.
        EXPECT_EQ(sum % params, 0) << "rank " << rank;
        EXPECT_GT(sum, 0) << "rank " << rank;
        EXPECT_LT(whole, sum) << "rank " << rank << ": replica 0 holds it all";
      }
    }
  }
  EXPECT_EQ(losses, ref.losses);
  for (int d = 0; d < c.replicas; ++d) {
    EXPECT_EQ(DigestHex((*t)->WeightsDigest(d)), ref.digest) << "replica " << d;
  }
}

std::string DpCaseName(const testing::TestParamInfo<DpCase>& info) {
  return absl::StrCat(CaseName(testing::TestParamInfo<Case>(info.param.pipeline, info.index)), "D",
                      info.param.replicas, info.param.recipe ? "Recipe" : "",
                      info.param.shard ? "Sharded" : "", info.param.recompute ? "Recompute" : "");
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, DataParallelBitExactTest,
                         testing::ValuesIn(DataParallelCases()), DpCaseName);

// The same through Gloo over TCP on loopback (the engine CPU workers use between
// processes): the bits do not depend on the engine.
TEST(DataParallelGlooTest, EveryReplicaEndsWithTheReferenceWeights) {
  struct G {
    baton::v1::Schedule schedule;
    int stages, virtual_stages, microbatches, replicas;
    bool shard = false;  // reduce-scatter and all-gather through Gloo
  };
  for (const G& g :
       {G{baton::v1::SCHEDULE_1F1B, 2, 1, 2, 2}, G{baton::v1::SCHEDULE_ZB_H1, 2, 1, 2, 3},
        G{baton::v1::SCHEDULE_INTERLEAVED_1F1B, 1, 2, 4, 2},
        G{baton::v1::SCHEDULE_1F1B, 2, 1, 2, 3, true},
        G{baton::v1::SCHEDULE_ZB_V, 2, 2, 2, 2, true}}) {
    baton::v1::JobSpec spec = GptJob();
    auto* p = spec.mutable_pipeline();
    p->set_schedule(g.schedule);
    p->set_stages(g.stages);
    p->set_virtual_stages(g.virtual_stages);
    p->set_microbatches(g.microbatches);
    p->set_data_parallel(g.replicas);
    if (g.shard) {
      AddRecipe(&spec);
      spec.mutable_optimizer()->set_shard(true);
      p->set_reduce_bucket_bytes(4096);
    }
    const TrainRun ref = Reference(spec);
    LocalPipelineOptions opts;
    opts.engine = LocalPipelineOptions::Engine::kGloo;
    auto t = LocalPipelineTrainer::Create(spec, opts);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < spec.steps(); ++i) ASSERT_TRUE((*t)->Step().ok());
    for (int d = 0; d < g.replicas; ++d) {
      EXPECT_EQ(DigestHex((*t)->WeightsDigest(d)), ref.digest)
          << baton::v1::Schedule_Name(g.schedule) << " replica " << d << " shard " << g.shard;
    }
  }
}

// The NCCL engine's logic (all-gather, ordered-sum kernel, its stream and deadlines) over
// the fake NCCL, under the stage executor's communication thread: the same bits again.
absl::StatusOr<std::vector<std::unique_ptr<Collective>>> FakeNcclGroup(
    std::vector<std::unique_ptr<FakeNccl>>* apis, int size, bool ordered = true) {
  NcclUniqueId id;
  FakeNccl id_maker;
  if (id_maker.GetUniqueId(&id) != NcclResult::kSuccess) return absl::InternalError("no id");
  std::vector<absl::StatusOr<std::unique_ptr<NcclCollective>>> joined(size);
  std::vector<std::thread> joining;
  for (int d = 0; d < size; ++d) apis->push_back(MakeFakeNccl());
  const size_t first = apis->size() - size;
  for (int d = 0; d < size; ++d) {
    joining.emplace_back([&, d] {
      NcclCollectiveOptions o;
      o.api = (*apis)[first + d].get();
      o.id = id;
      o.ordered = ordered;
      joined[d] = NcclCollective::Connect(d, size, o);
    });
  }
  for (std::thread& t : joining) t.join();
  std::vector<std::unique_ptr<Collective>> out;
  for (auto& j : joined) {
    if (!j.ok()) return j.status();
    out.push_back(*std::move(j));
  }
  return out;
}

TEST(DataParallelNcclTest, EveryReplicaEndsWithTheReferenceWeights) {
  for (baton::v1::Schedule schedule : {baton::v1::SCHEDULE_1F1B, baton::v1::SCHEDULE_ZB_H1}) {
    for (bool shard : {false, true}) {
      baton::v1::JobSpec spec = GptJob();
      auto* p = spec.mutable_pipeline();
      p->set_schedule(schedule);
      p->set_stages(2);
      p->set_microbatches(2);
      p->set_data_parallel(schedule == baton::v1::SCHEDULE_ZB_H1 ? 3 : 2);
      if (shard) {
        AddRecipe(&spec);
        spec.mutable_optimizer()->set_shard(true);
        p->set_reduce_bucket_bytes(4096);
      }
      const TrainRun ref = Reference(spec);
      std::vector<std::unique_ptr<FakeNccl>> apis;  // outlive the trainer
      LocalPipelineOptions opts;
      opts.engine = LocalPipelineOptions::Engine::kCustom;
      opts.make_group = [&apis](int, int size) { return FakeNcclGroup(&apis, size); };
      auto t = LocalPipelineTrainer::Create(spec, opts);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int i = 0; i < spec.steps(); ++i) ASSERT_TRUE((*t)->Step().ok());
      for (int d = 0; d < p->data_parallel(); ++d) {
        EXPECT_EQ(DigestHex((*t)->WeightsDigest(d)), ref.digest)
            << baton::v1::Schedule_Name(schedule) << " replica " << d << " shard " << shard;
      }
    }
  }
}

// Fast mode (REDUCE_MODE_FAST): the engines' own ring. Replicas still agree with each other
// bit for bit; the losses stay within a relative 1e-4 of the reference trainer's over the
// run (the stated tolerance: each gradient element differs by a few float roundings).
TEST(DataParallelFastModeTest, ReplicasAgreeAndTrainWithinToleranceOfTheReference) {
  baton::v1::JobSpec spec = GptJob();
  auto* p = spec.mutable_pipeline();
  p->set_stages(2);
  p->set_microbatches(2);
  p->set_data_parallel(3);
  const TrainRun ref = Reference(spec);  // the grouping is the same; only the sum differs
  p->set_reduce_mode(baton::v1::REDUCE_MODE_FAST);
  for (const char* engine : {"gloo", "nccl"}) {
    std::vector<std::unique_ptr<FakeNccl>> apis;
    LocalPipelineOptions opts;
    if (std::string(engine) == "gloo") {
      opts.engine = LocalPipelineOptions::Engine::kGloo;
    } else {
      opts.engine = LocalPipelineOptions::Engine::kCustom;
      opts.make_group = [&apis](int, int size) {
        return FakeNcclGroup(&apis, size, /*ordered=*/false);
      };
    }
    auto t = LocalPipelineTrainer::Create(spec, opts);
    ASSERT_TRUE(t.ok()) << t.status();
    std::vector<float> losses;
    for (int i = 0; i < spec.steps(); ++i) {
      auto s = (*t)->Step();
      ASSERT_TRUE(s.ok()) << s.status();
      losses.push_back(s->loss);
    }
    ASSERT_EQ(losses.size(), ref.losses.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], ref.losses[i], 1e-4 * std::fabs(ref.losses[i]))
          << engine << " step " << i + 1;
    }
    for (int d = 1; d < 3; ++d) {
      EXPECT_EQ(DigestHex((*t)->WeightsDigest(d)), DigestHex((*t)->WeightsDigest(0)))
          << engine << " replica " << d;
    }
    // Else the tolerance above was never tested.
    EXPECT_NE(DigestHex((*t)->WeightsDigest(0)), ref.digest)
        << engine << ": fast mode ended on the ordered sum's bits";
  }
}

// The comparison above can fail: replicas summing in another order, or each training on
// the whole batch, end elsewhere. Two replicas' grouping is not one pipeline's.
TEST(DataParallelControlTest, TheGroupingChangesTheBits) {
  baton::v1::JobSpec spec = GptJob();
  spec.mutable_pipeline()->set_microbatches(2);
  const TrainRun one = Reference(spec);
  spec.mutable_pipeline()->set_data_parallel(2);
  const TrainRun two = Reference(spec);
  EXPECT_NE(one.digest, two.digest);
}

// A replica that fails ends the step on every replica with its reason, quickly.
TEST(PipelineFailureTest, AFailedReplicaStopsEveryReplica) {
  baton::v1::JobSpec spec = GptJob();
  auto* p = spec.mutable_pipeline();
  p->set_stages(2);
  p->set_microbatches(2);
  p->set_data_parallel(3);
  LocalPipelineOptions opts;
  // No rank waits for this deadline: the step ends on the failure (a rank that waited for
  // it would fail the step with DEADLINE_EXCEEDED instead of the reason checked below).
  opts.recv_timeout = absl::Minutes(10);
  auto t = LocalPipelineTrainer::Create(spec, opts);
  ASSERT_TRUE(t.ok()) << t.status();
  (*t)->hub(2).transport(1)->Abort(absl::UnavailableError("replica 2 lost its GPU"));
  auto s = (*t)->Step();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("replica 2 lost its GPU"), absl::string_view::npos)
      << s.status();
  EXPECT_EQ((*t)->Step().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Recomputation reruns each forward just before its backward: the same bits, for every
// schedule (ZB-H1's I/W split included) and partition.
std::vector<Case> RecomputeCases() {
  std::vector<Case> out;
  for (const Case& c : AllCases()) {
    if (c.stages <= 3 && (c.microbatches == 2 || c.microbatches == 3)) out.push_back(c);
  }
  return out;
}

class RecomputeBitExactTest : public testing::TestWithParam<Case> {};

TEST_P(RecomputeBitExactTest, SameWeightsAndLossesAsTheReferenceTrainer) {
  const baton::v1::JobSpec spec = SpecFor(GetParam());
  baton::v1::JobSpec recomputing = spec;
  recomputing.mutable_pipeline()->set_recompute(baton::v1::RECOMPUTE_FULL);
  ExpectReferenceBits(spec, recomputing);
}

INSTANTIATE_TEST_SUITE_P(AllSchedules, RecomputeBitExactTest, testing::ValuesIn(RecomputeCases()),
                         CaseName);

// Per-stage recomputation (pipeline.recompute_stages): only the first stage, or only the
// last, recomputes; the bits do not change.
TEST(RecomputeStagesTest, SomeStagesRecomputingGiveTheReferenceBits) {
  for (const Case& c : RecomputeCases()) {
    if (c.stages < 2) continue;
    baton::v1::JobSpec spec = SpecFor(c);
    const TrainRun ref = Reference(spec);
    const int chunks = c.stages * c.virtual_stages;
    for (int only : {0, chunks - 1}) {
      auto* p = spec.mutable_pipeline();
      p->set_recompute(baton::v1::RECOMPUTE_FULL);
      p->clear_recompute_stages();
      p->add_recompute_stages(only);
      absl::StatusOr<TrainRun> pipe = Pipeline(spec);
      ASSERT_TRUE(pipe.ok()) << pipe.status();
      EXPECT_EQ(pipe->digest, ref.digest) << CaseName(testing::TestParamInfo<Case>(c, 0)) << " recomputing stage " << only;
    }
  }
}

// What recomputation is for: with every micro-batch in flight at once (GPipe, one stage),
// a step's peak memory above the weights, gradients and optimizer state is the stash of
// all M micro-batches without it, and M inputs plus one micro-batch's stash with it.
TEST(PipelineMemoryTest, RecomputeHoldsFarLessDuringAStep) {
  baton::v1::JobSpec spec = GptJob();
  spec.set_steps(1);
  auto* p = spec.mutable_pipeline();
  p->set_schedule(baton::v1::SCHEDULE_GPIPE);
  p->set_stages(1);
  p->set_microbatches(8);
  absl::StatusOr<Device> device = LocalDeviceFor(spec);
  ASSERT_TRUE(device.ok()) << device.status();
  Allocator* allocator = AllocatorFor(*device);
  ASSERT_NE(allocator, nullptr);
  auto step_peak = [&](baton::v1::Recompute mode) -> int64_t {
    p->set_recompute(mode);
    auto t = LocalPipelineTrainer::Create(spec);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return -1;
    EXPECT_TRUE((*t)->Step().ok());  // the optimizer's state exists from the first step on
    const int64_t before = allocator->Stats().bytes_in_use;
    allocator->ResetPeak();
    EXPECT_TRUE((*t)->Step().ok());
    return allocator->Stats().peak_bytes_in_use - before;
  };
  const int64_t none = step_peak(baton::v1::RECOMPUTE_NONE);
  const int64_t full = step_peak(baton::v1::RECOMPUTE_FULL);
  RecordProperty("step_peak_bytes_none", std::to_string(none));
  RecordProperty("step_peak_bytes_full", std::to_string(full));
  ASSERT_GT(none, 0);
  ASSERT_GT(full, 0);
  EXPECT_LT(full * 3, none) << "recompute: " << full << " bytes, without: " << none;

  // Two stages, only the first recomputing: between the two (the second keeps its stash).
  p->set_stages(2);
  const int64_t none2 = step_peak(baton::v1::RECOMPUTE_NONE);
  const int64_t full2 = step_peak(baton::v1::RECOMPUTE_FULL);
  p->add_recompute_stages(0);
  const int64_t first = step_peak(baton::v1::RECOMPUTE_FULL);
  EXPECT_LT(first, none2) << "stage 0 recomputing: " << first << " bytes, none: " << none2;
  EXPECT_GT(first, full2) << "stage 0 recomputing: " << first << " bytes, all: " << full2;
}

// The comparison above can fail: the digest is sensitive to float rounding, so merely
// splitting the same batch differently (same data, same maths, another summation order)
// gives different weights.
// Checkpoints are per block, so any partition resumes any other's: every schedule, on the
// MLP (SGD momentum), the tied GPT and the tied LLaMA (AdamW), stops after step 1 or 2 on one partition (3
// stages, or the reference trainer) and finishes on another (2 stages of the same schedule,
// or the reference trainer); the final weights are the uninterrupted reference run's, bit
// for bit.
// Validation (JobSpec.eval) on token shards: after steps 2 and 4 (and the last, 5) every
// rank runs the validation batches forward, activations crossing ranks as in training;
// the loss equals the reference trainer's bit for bit, under every kind of placement and
// with replicas, and the weights are untouched by it (the digest is the training's).
TEST(PipelineEvalTest, ValidationLossEqualsTheReferenceTrainers) {
  const std::string dir = testing::TempDir() + "/pipeline-eval";
  std::filesystem::create_directories(dir);
  auto write_shard = [&](const std::string& name, int tokens, int salt) {
    std::vector<uint16_t> ids(tokens);
    for (int i = 0; i < tokens; ++i) ids[i] = static_cast<uint16_t>((i * 7 + salt * i / 5) % 30);
    const std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(ids.data(), sizeof(uint16_t), ids.size(), f);
    std::fclose(f);
    return path;
  };
  const std::string train = write_shard("train.bin", 4000, 1);
  const std::string val = write_shard("val.bin", 600, 3);
  for (Model model : {Model::kGpt, Model::kLlama}) {
    baton::v1::JobSpec spec = JobFor(model);
    spec.set_steps(5);
    spec.mutable_data()->clear_text();
    spec.mutable_data()->mutable_tokens()->add_train(train);
    spec.mutable_data()->mutable_tokens()->add_val(val);
    spec.mutable_eval()->set_every(2);
    spec.mutable_eval()->set_batches(2);
    spec.mutable_pipeline()->set_microbatches(4);
    // The reference of each replica count (replicas group the batch differently).
    std::map<int, std::vector<std::optional<float>>> wants;
    std::map<int, std::string> digests;
    for (int replicas : {1, 2}) {
      baton::v1::JobSpec r = spec;
      r.mutable_pipeline()->set_data_parallel(replicas);
      auto ref = ReferenceTrainer::Create(r);
      ASSERT_TRUE(ref.ok()) << ref.status();
      for (int i = 0; i < spec.steps(); ++i) {
        auto s = (*ref)->Step();
        ASSERT_TRUE(s.ok()) << s.status();
        wants[replicas].push_back(s->val_loss);
      }
      digests[replicas] = DigestHex((*ref)->WeightsDigest());
    }
    const std::vector<std::optional<float>>& want = wants[1];
    ASSERT_TRUE(want[1].has_value() && want[3].has_value() && want[4].has_value());
    EXPECT_FALSE(want[0].has_value() || want[2].has_value());
    EXPECT_NE(*want[1], *want[3]) << "the weights changed between evaluations";
    struct Placement {
      baton::v1::Schedule schedule;
      int stages, virtual_stages, replicas;
    };
    for (const Placement& pl : {Placement{baton::v1::SCHEDULE_1F1B, 3, 1, 1},
                                Placement{baton::v1::SCHEDULE_INTERLEAVED_1F1B, 2, 2, 1},
                                Placement{baton::v1::SCHEDULE_ZB_V, 2, 2, 1},
                                Placement{baton::v1::SCHEDULE_1F1B, 2, 1, 2}}) {
      baton::v1::JobSpec p = spec;
      p.mutable_pipeline()->set_schedule(pl.schedule);
      p.mutable_pipeline()->set_stages(pl.stages);
      p.mutable_pipeline()->set_virtual_stages(pl.virtual_stages);
      p.mutable_pipeline()->set_data_parallel(pl.replicas);
      auto t = LocalPipelineTrainer::Create(p);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int i = 0; i < spec.steps(); ++i) {
        auto s = (*t)->Step();
        ASSERT_TRUE(s.ok()) << s.status();
        EXPECT_EQ(s->val_loss, wants[pl.replicas][i]) << ModelName(model) << " "
                                        << baton::v1::Schedule_Name(pl.schedule) << " S="
                                        << pl.stages << " D=" << pl.replicas << " step " << i;
        EXPECT_EQ((*t)->hub().Pending(), 0) << "evaluation left tensors undelivered";
      }
      EXPECT_EQ(DigestHex((*t)->WeightsDigest()), digests[pl.replicas]);
    }
  }
}

// StageExecutorOptions::stop: a cancel must reach a rank that has nothing to receive. A step
// ends before its next compute action (weights untouched), an evaluation before its next
// micro-batch, each with ABORTED saying where; before, a first stage evaluating 10,000
// batches ran them all, cancelled or not.
TEST(PipelineStopTest, TheStopFlagEndsAStepAndAnEvaluationBetweenMicroBatches) {
  const std::string dir = testing::TempDir() + "/pipeline-stop";
  std::filesystem::create_directories(dir);
  auto write_shard = [&](const std::string& name, int tokens) {
    std::vector<uint16_t> ids(tokens);
    for (int i = 0; i < tokens; ++i) ids[i] = static_cast<uint16_t>((i * 7) % 30);
    const std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(ids.data(), sizeof(uint16_t), ids.size(), f);
    std::fclose(f);
    return path;
  };
  baton::v1::JobSpec spec = JobFor(Model::kGpt);
  spec.mutable_data()->clear_text();
  spec.mutable_data()->mutable_tokens()->add_train(write_shard("train.bin", 4000));
  spec.mutable_data()->mutable_tokens()->add_val(write_shard("val.bin", 600));
  spec.mutable_eval()->set_every(1);
  spec.mutable_eval()->set_batches(kMaxEvalBatches);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_microbatches(2);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  absl::StatusOr<Schedule> lowered = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<Schedule> sched = AddJobActions(*lowered, spec);  // the tied embedding's
  ASSERT_TRUE(sched.ok()) << sched.status();
  absl::StatusOr<std::vector<BlockRange>> blocks =
      PartitionBlocks(DescribeBlocks(spec.model()), 2);
  ASSERT_TRUE(blocks.ok()) << blocks.status();

  // Rank 0 alone: a step stopped after its first action.
  {
    InProcessHub hub(2);
    std::atomic<bool> stop{false};
    class StopAfterFirst : public StepObserver {
     public:
      explicit StopAfterFirst(std::atomic<bool>* s) : stop_(s) {}
      void OnAction(const ActionTiming&, int) override { stop_->store(true); }
      std::atomic<bool>* stop_;
    } observer(&stop);
    StageExecutorOptions opts;
    opts.stop = &stop;
    opts.observer = &observer;
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    auto rank0 = StageExecutor::Create(*valid, *sched, *blocks, 0, hub.transport(0), opts);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    auto digests = [&rank0] {
      std::vector<Digest> out;
      absl::StatusOr<std::vector<std::pair<int, Digest>>> d = (*rank0)->BlockDigests();
      EXPECT_TRUE(d.ok()) << d.status();
      if (d.ok()) {
        for (const auto& [index, digest] : *d) out.push_back(digest);
      }
      return out;
    };
    const std::vector<Digest> before = digests();
    auto r = (*rank0)->RunStep(0);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
    EXPECT_NE(r.status().message().find("stopped (rank 0 step 0 before "),
              absl::string_view::npos)
        << r.status();
    EXPECT_EQ(before, digests()) << "a stopped step changed the weights";
  }
  // Rank 0 evaluating, its activations piling up for a rank 1 that never runs: stopped
  // once a few are out, it ends at the next micro-batch.
  {
    InProcessHub hub(2);
    std::atomic<bool> stop{false};
    StageExecutorOptions opts;
    opts.stop = &stop;
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    auto rank0 = StageExecutor::Create(*valid, *sched, *blocks, 0, hub.transport(0), opts);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    absl::StatusOr<std::optional<float>> result;
    std::thread evaluating([&] { result = (*rank0)->Evaluate(0); });
    // A bound on a hang only: 3 activations leave within milliseconds.
    const absl::Time give_up = absl::Now() + absl::Minutes(2);
    while (hub.Pending() < 3 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    stop.store(true);
    evaluating.join();
    ASSERT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
    EXPECT_NE(result.status().message().find("rank 0 evaluation 1: stopped (batch "),
              absl::string_view::npos)
        << result.status();
    EXPECT_LT(hub.Pending(), 2 * kMaxEvalBatches) << "the evaluation ran to its end";
  }
  // Set before it starts: nothing runs.
  {
    InProcessHub hub(2);
    std::atomic<bool> stop{true};
    StageExecutorOptions opts;
    opts.stop = &stop;
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    auto rank0 = StageExecutor::Create(*valid, *sched, *blocks, 0, hub.transport(0), opts);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    EXPECT_EQ((*rank0)->Evaluate(0).status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(hub.Pending(), 0);
  }
}

// The reference trainer of `spec` resumed from checkpoint `step_dir` and trained to the
// end: its digest ("" after a failure, which fails the test).
std::string ReferenceResumedDigest(const baton::v1::JobSpec& spec, const std::string& step_dir) {
  auto r = ReferenceTrainer::Create(spec);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return "";
  const absl::Status loaded = (*r)->LoadCheckpoint(step_dir);
  EXPECT_TRUE(loaded.ok()) << loaded;
  if (!loaded.ok()) return "";
  while ((*r)->steps_done() < spec.steps()) {
    const auto s = (*r)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return "";
  }
  return DigestHex((*r)->WeightsDigest());
}

// The same for the in-process pipeline: the trainer, trained to the end, that resumed from
// `step_dir` at step `from`; null after a failure, which fails the test.
std::unique_ptr<LocalPipelineTrainer> ResumedPipeline(const baton::v1::JobSpec& spec,
                                                      const std::string& step_dir, int from) {
  auto t = LocalPipelineTrainer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  const absl::Status loaded = (*t)->LoadCheckpoint(step_dir);
  EXPECT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ((*t)->steps_done(), from);
  if (!loaded.ok()) return nullptr;
  for (int i = from; i < spec.steps(); ++i) {
    const auto s = (*t)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
  }
  return *std::move(t);
}

TEST(PipelineCheckpointTest, ResumeOnAnotherPartitionEndsWithTheUninterruptedDigest) {
  const std::string dir = testing::TempDir() + "/pipeline-ckpt";
  // The recipe's runs also continue the learning-rate schedule from the checkpoint's step.
  // bf16 jobs keep float32 masters in their checkpoints, so they resume bit-exact too.
  struct Run {
    Model model;
    bool recipe;
    bool bf16;
  };
  for (auto [model, recipe, bf16] : std::vector<Run>{{Model::kMlp, false, false},
                                                     {Model::kGpt, false, false},
                                                     {Model::kLlama, false, false},
                                                     {Model::kGpt, true, false},
                                                     {Model::kLlama, true, false},
                                                     {Model::kGpt, true, true},
                                                     {Model::kLlama, false, true}}) {
    baton::v1::JobSpec spec = JobFor(model);
    if (recipe) AddRecipe(&spec);
    if (bf16) UseBf16(&spec);
    spec.set_steps(4);
    spec.mutable_pipeline()->set_microbatches(4);
    const std::string want = Reference(spec).digest;
    for (auto sched : {baton::v1::SCHEDULE_GPIPE, baton::v1::SCHEDULE_1F1B,
                       baton::v1::SCHEDULE_INTERLEAVED_1F1B, baton::v1::SCHEDULE_ZB_H1}) {
      const bool interleaved = sched == baton::v1::SCHEDULE_INTERLEAVED_1F1B;
      if ((recipe || bf16) && sched != baton::v1::SCHEDULE_1F1B && !interleaved) continue;
      for (int stop : {1, 2}) {
        std::filesystem::remove_all(dir);
        baton::v1::JobSpec first = spec;
        first.mutable_pipeline()->set_schedule(sched);
        first.mutable_pipeline()->set_stages(interleaved ? 2 : 3);
        first.mutable_pipeline()->set_virtual_stages(interleaved ? 2 : 1);
        auto a = LocalPipelineTrainer::Create(first);
        ASSERT_TRUE(a.ok()) << a.status();
        for (int i = 0; i < stop; ++i) ASSERT_TRUE((*a)->Step().ok());
        ASSERT_TRUE((*a)->SaveCheckpoint(dir, "j").ok());
        const std::string step_dir = CheckpointStepDir(dir, stop);
        // The ranks' manifests together cover the model: it exports whole.
        ASSERT_TRUE(ExportWeights(step_dir).ok()) << ExportWeights(step_dir).status();
        // Another pipeline partition finishes it...
        baton::v1::JobSpec second = first;
        second.mutable_pipeline()->set_stages(interleaved ? 4 : 2);
        second.mutable_pipeline()->set_virtual_stages(1);
        if (interleaved) second.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_1F1B);
        std::unique_ptr<LocalPipelineTrainer> b = ResumedPipeline(second, step_dir, stop);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(DigestHex(b->WeightsDigest()), want)
            << baton::v1::Schedule_Name(sched) << " " << ModelName(model)
            << (recipe ? " with the recipe" : "") << (bf16 ? " in bf16" : "") << ", stopped after "
            << stop;
        // ... and so does the reference trainer.
        EXPECT_EQ(ReferenceResumedDigest(spec, step_dir), want);
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// A sharded optimizer's checkpoint holds the whole state (replica 0 writes it, the owners
// hand theirs over), so it resumes bit-exact with any number of replicas, sharded or not,
// on another partition, and in the reference trainer: taken at D = 4 on 2 stages, it
// resumes at D = 2 sharded and unsharded, at D = 1 on 3 stages, and in the reference
// trainer, each ending with the digest the reference trainer reaches from its own
// checkpoint of the same first steps.
TEST(PipelineCheckpointTest, AShardedCheckpointResumesOnAnyReplicaCount) {
  const std::string dir = testing::TempDir() + "/pipeline-shard-ckpt";
  const std::string ref_dir = testing::TempDir() + "/pipeline-shard-ckpt-ref";
  // In bf16 the replicas keep the weights they do not own as bf16 bits: the checkpoint
  // still holds the owners' float32 weights, and a resume rounds them again.
  for (const auto& [model, bf16] : {std::pair{Model::kGpt, false}, std::pair{Model::kLlama, false},
                                    std::pair{Model::kGpt, true}, std::pair{Model::kLlama, true}}) {
    SCOPED_TRACE(absl::StrCat(ModelName(model), bf16 ? " bf16" : " fp32"));
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(ref_dir);
    baton::v1::JobSpec spec = JobFor(model);
    if (bf16) UseBf16(&spec);
    AddRecipe(&spec);  // AdamW, clipping, a schedule: the state and the step count matter
    spec.mutable_data()->set_batch_size(16);
    spec.mutable_pipeline()->set_microbatches(2);
    spec.mutable_pipeline()->set_stages(2);
    spec.mutable_pipeline()->set_reduce_bucket_bytes(4096);
    baton::v1::JobSpec first = spec;
    first.mutable_pipeline()->set_data_parallel(4);
    first.mutable_optimizer()->set_shard(true);
    constexpr int kStop = 2;
    auto a = LocalPipelineTrainer::Create(first);
    ASSERT_TRUE(a.ok()) << a.status();
    for (int i = 0; i < kStop; ++i) ASSERT_TRUE((*a)->Step().ok());
    ASSERT_TRUE((*a)->SaveCheckpoint(dir, "j").ok());
    const std::string step_dir = CheckpointStepDir(dir, kStop);
    ASSERT_TRUE(ExportWeights(step_dir).ok()) << ExportWeights(step_dir).status();
    // Every replica wrote a part of its rank's four blocks: one block each, under a
    // manifest of its own, eight in all.
    std::set<std::string> manifests;
    for (const auto& e : std::filesystem::directory_iterator(step_dir)) {
      const std::string name = e.path().filename().string();
      if (absl::StartsWith(name, "manifest.")) manifests.insert(name);
    }
    EXPECT_EQ(manifests, (std::set<std::string>{
                             "manifest.rank-0.json", "manifest.rank-0.part-1.json",
                             "manifest.rank-0.part-2.json", "manifest.rank-0.part-3.json",
                             "manifest.rank-1.json", "manifest.rank-1.part-1.json",
                             "manifest.rank-1.part-2.json", "manifest.rank-1.part-3.json"}));
    absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(step_dir);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->blocks.size(), 8u);
    // What the reference trainer's own checkpoint of the same steps resumes to, at D = 2.
    baton::v1::JobSpec second = spec;
    second.mutable_pipeline()->set_data_parallel(2);
    std::string want;
    {
      auto r = ReferenceTrainer::Create(first);
      ASSERT_TRUE(r.ok());
      for (int i = 0; i < kStop; ++i) ASSERT_TRUE((*r)->Step().ok());
      ASSERT_TRUE((*r)->SaveCheckpoint(ref_dir, "j").ok());
      want = ReferenceResumedDigest(second, CheckpointStepDir(ref_dir, kStop));
      ASSERT_FALSE(want.empty());
    }
    for (bool shard : {true, false}) {
      baton::v1::JobSpec resumed = second;
      resumed.mutable_optimizer()->set_shard(shard);
      std::unique_ptr<LocalPipelineTrainer> b = ResumedPipeline(resumed, step_dir, kStop);
      ASSERT_NE(b, nullptr);
      for (int d = 0; d < 2; ++d) {
        EXPECT_EQ(DigestHex(b->WeightsDigest(d)), want) << "D=2 shard " << shard;
      }
    }
    EXPECT_EQ(ReferenceResumedDigest(second, step_dir), want)
        << "the reference from the sharded one";
    // One replica on three stages: the D = 1 grouping's own continuation.
    baton::v1::JobSpec single = spec;
    single.mutable_pipeline()->set_stages(3);
    std::unique_ptr<LocalPipelineTrainer> c = ResumedPipeline(single, step_dir, kStop);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(DigestHex(c->WeightsDigest()),
              ReferenceResumedDigest(single, CheckpointStepDir(ref_dir, kStop)))
        << "D=1";
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(ref_dir);
}

TEST(BitExactControlTest, DigestSeesSummationOrder) {
  baton::v1::JobSpec spec = GptJob();
  spec.mutable_pipeline()->set_microbatches(2);
  const TrainRun two = Reference(spec);
  spec.mutable_pipeline()->set_microbatches(4);
  const TrainRun four = Reference(spec);
  EXPECT_NE(two.digest, four.digest);
  EXPECT_NEAR(two.losses[0], four.losses[0], 1e-4);  // ... while the maths agrees
}

// The peak in-flight activations each rank records equal the schedules' theory.
TEST(PipelineMemoryTest, PeakInflightMatchesTheory) {
  baton::v1::JobSpec spec = MlpJob();
  spec.set_steps(1);
  auto run = [&](baton::v1::Schedule sched, int S, int V, int M) {
    auto* p = spec.mutable_pipeline();
    p->set_schedule(sched);
    p->set_stages(S);
    p->set_virtual_stages(V);
    p->set_microbatches(M);
    spec.mutable_data()->set_batch_size(M * 2);
    absl::StatusOr<TrainRun> r = Pipeline(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->peak_inflight : std::vector<int>{};
  };
  EXPECT_EQ(run(baton::v1::SCHEDULE_GPIPE, 4, 1, 8), (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(run(baton::v1::SCHEDULE_1F1B, 4, 1, 8), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(run(baton::v1::SCHEDULE_1F1B, 4, 1, 2), (std::vector<int>{2, 2, 2, 1}));
  // (S - rank - 1) * 2 + (V - 1) * S + 1 chunks.
  EXPECT_EQ(run(baton::v1::SCHEDULE_INTERLEAVED_1F1B, 4, 2, 8),
            (std::vector<int>{11, 9, 7, 5}));
  for (int peak : run(baton::v1::SCHEDULE_ZB_H1, 4, 1, 8)) EXPECT_LE(peak, 4 + 1);
}

// A custom clock whose weight gradients run out of micro-batch order still matches the
// reference: the executor defers them so gradients accumulate in order.
TEST(PipelineCustomTest, OutOfOrderWeightGradientsStillMatch) {
  baton::v1::JobSpec spec = MlpJob();
  auto* p = spec.mutable_pipeline();
  p->set_stages(2);
  p->set_microbatches(3);
  // Two ranks, one stage each: all forwards, all input gradients, then W in reverse order.
  absl::StatusOr<Schedule> s = FromCsv(
      "0F0,0F1,0F2,0I0,0I1,0I2,0W2,0W1,0W0\n"
      "1F0,1F1,1F2,1I2,1I1,1I0,1W1,1W2,1W0\n");
  ASSERT_TRUE(s.ok()) << s.status();
  LocalPipelineOptions opts;
  opts.schedule = *s;
  absl::StatusOr<TrainRun> pipe = Pipeline(spec, opts);
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  const TrainRun ref = Reference(spec);
  EXPECT_EQ(pipe->losses, ref.losses);
  EXPECT_EQ(pipe->digest, ref.digest);
}

// A clock that fails validation (a receive nobody sends) is refused before anything runs.
TEST(PipelineFailureTest, InvalidCustomClockIsRefused) {
  baton::v1::JobSpec spec = MlpJob();
  auto* p = spec.mutable_pipeline();
  p->set_stages(2);
  p->set_microbatches(1);
  Schedule s;
  s.kind = ScheduleKind::kCustom;
  s.num_ranks = 2;
  s.num_microbatches = 1;
  s.stage_to_rank = {0, 1};
  s.ranks = {{{ActionKind::kStep, 0, 0}},
             {{ActionKind::kRecvF, 1, 0}, {ActionKind::kStep, 0, 0}}};
  LocalPipelineOptions opts;
  opts.schedule = s;
  auto t = LocalPipelineTrainer::Create(spec, opts);
  EXPECT_FALSE(t.ok()) << "an invalid clock was accepted";
}

// The MLP job as a 2-stage 1F1B pipeline with 2 micro-batches, for driving executors
// directly.
struct TwoStageMlp {
  TwoStageMlp() {
    spec = MlpJob();
    spec.mutable_pipeline()->set_stages(2);
    spec.mutable_pipeline()->set_microbatches(2);
    EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
    absl::StatusOr<Schedule> s = BuildSchedule({ScheduleKind::k1F1B, 2, 1, 2});
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) sched = *s;
    absl::StatusOr<std::vector<BlockRange>> b = PartitionBlocks(DescribeBlocks(spec.model()), 2);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) blocks = *b;
  }
  baton::v1::JobSpec spec;
  Schedule sched;
  std::vector<BlockRange> blocks;
};

// A rank whose peer never sends ends its step at the receive deadline with an error naming
// the peer and the tag, and aborts the transport so nobody else waits either.
TEST(PipelineFailureTest, SilentPeerEndsTheStepAtTheDeadline) {
  TwoStageMlp job;
  ASSERT_EQ(job.blocks.size(), 2u);
  const baton::v1::JobSpec& spec = job.spec;
  const Schedule* sched = &job.sched;
  const std::vector<BlockRange>* blocks = &job.blocks;
  InProcessHub hub(2);
  StageExecutorOptions opts;
  opts.recv_timeout = absl::Milliseconds(100);
  absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
  ASSERT_TRUE(valid.ok()) << valid.status();
  auto rank1 = StageExecutor::Create(*valid, *sched, *blocks, 1, hub.transport(1), opts);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  auto r = (*rank1)->RunStep(0);  // rank 0 never runs
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("from rank 0"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("microbatch 0 stage 0 activation"),
            absl::string_view::npos)
      << r.status();
  // The failing rank aborted the transport: a peer waiting now is told why at once.
  auto echo = hub.transport(0)->Recv(1, TensorTag{0, 0, 0, 1, TensorKind::kGradient},
                                     absl::Now() + absl::Minutes(10));  // never reached
  EXPECT_EQ(echo.status().code(), absl::StatusCode::kAborted);
}

TEST(PipelineFailureTest, AWrongShapedTensorFromAPeerFailsTheStepBeforeAnyBlockSeesIt) {
  TwoStageMlp job;
  InProcessHub hub(2);
  StageExecutorOptions opts;
  opts.recv_timeout = absl::Seconds(60);  // only bounds a hang
  absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(job.spec);
  ASSERT_TRUE(valid.ok()) << valid.status();
  auto rank1 = StageExecutor::Create(*valid, job.sched, job.blocks, 1, hub.transport(1), opts);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  // Rank 0 sends microbatch 0's activation with one row too many.
  const int64_t rows = job.spec.data().batch_size() / job.spec.pipeline().microbatches();
  const Tensor wrong = Tensor::Empty({rows + 1, job.spec.model().mlp().width()});
  ASSERT_TRUE(hub.transport(0)
                  ->Send(1, TensorTag{0, 0, 0, 0, TensorKind::kActivation}, wrong)
                  ->Wait(absl::Now() + absl::Seconds(60))
                  .ok());
  auto r = (*rank1)->RunStep(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find(absl::StrCat("received activation for 1RECV_F0 is [",
                                                   rows + 1)),
            absl::string_view::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("the plan expects"), absl::string_view::npos);
}

// A bf16 job's receiver plans bf16 tensors: a float32 one of the right shape is refused,
// naming both dtypes, before any block sees it.
TEST(PipelineFailureTest, ATensorOfAnotherDtypeThanPlannedFailsTheStep) {
  TwoStageMlp job;
  job.spec.set_precision(baton::v1::PRECISION_BF16);
  InProcessHub hub(2);
  StageExecutorOptions opts;
  opts.recv_timeout = absl::Seconds(60);  // only bounds a hang
  absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(job.spec);
  ASSERT_TRUE(valid.ok()) << valid.status();
  auto rank1 = StageExecutor::Create(*valid, job.sched, job.blocks, 1, hub.transport(1), opts);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  const int64_t rows = job.spec.data().batch_size() / job.spec.pipeline().microbatches();
  const Tensor f32 = Tensor::Zeros({rows, job.spec.model().mlp().width()});
  ASSERT_TRUE(hub.transport(0)
                  ->Send(1, TensorTag{0, 0, 0, 0, TensorKind::kActivation}, f32)
                  ->Wait(absl::Now() + absl::Seconds(60))
                  .ok());
  auto r = (*rank1)->RunStep(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("of f32; the plan expects"), absl::string_view::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("of bf16"), absl::string_view::npos) << r.status();
}

// What the worker's metrics and traces read: per action times and payload bytes, the
// step's end after the send waits, and a live in-flight count through the observer.
class RecordingObserver : public StepObserver {
 public:
  void OnAction(const ActionTiming& t, int inflight) override {
    actions.push_back(t.action.ToString());
    inflight_after.push_back(inflight);
  }
  std::vector<std::string> actions;
  std::vector<int> inflight_after;
};

TEST(PipelineTimelineTest, RecordsBytesEndAndInflightForEveryAction) {
  TwoStageMlp job;
  ASSERT_EQ(job.blocks.size(), 2u);
  const baton::v1::JobSpec& spec = job.spec;
  const Schedule* sched = &job.sched;
  const std::vector<BlockRange>* blocks = &job.blocks;
  InProcessHub hub(2);
  RecordingObserver observers[2];
  std::vector<std::unique_ptr<StageExecutor>> ex;
  for (int r = 0; r < 2; ++r) {
    StageExecutorOptions opts;
    opts.observer = &observers[r];
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    auto e = StageExecutor::Create(*valid, *sched, *blocks, r, hub.transport(r), opts);
    ASSERT_TRUE(e.ok()) << e.status();
    ex.push_back(*std::move(e));
  }
  absl::StatusOr<RankStepResult> results[2];
  const absl::Time before = absl::Now();
  std::thread t1([&] { results[1] = ex[1]->RunStep(0); });
  results[0] = ex[0]->RunStep(0);
  t1.join();
  // Activations between the stages are [micro-batch rows 12, width 12] floats; the gradient
  // sent back has the same shape.
  const int64_t tensor_bytes = 12 * 12 * 4;
  int64_t sent[2] = {0, 0}, received[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    const RankStepResult& res = *results[r];
    EXPECT_GE(res.start, before);
    ASSERT_EQ(res.timeline.size(), sched->ranks[r].size());
    EXPECT_EQ(observers[r].actions.size(), res.timeline.size());
    EXPECT_EQ(observers[r].inflight_after.back(), 0);  // every W ran
    EXPECT_EQ(*std::max_element(observers[r].inflight_after.begin(),
                                observers[r].inflight_after.end()),
              res.peak_inflight);
    int64_t prev_end = 0;
    for (const ActionTiming& t : res.timeline) {
      EXPECT_GE(t.start_ns, prev_end) << t.action.ToString();  // in order, no overlap
      EXPECT_GE(t.end_ns, t.start_ns);
      prev_end = t.end_ns;
      if (IsComm(t.action.kind)) {
        EXPECT_EQ(t.bytes, tensor_bytes) << t.action.ToString();
        const bool send = t.action.kind == ActionKind::kSendF || t.action.kind == ActionKind::kSendB;
        (send ? sent : received)[r] += t.bytes;
      } else {
        EXPECT_EQ(t.bytes, 0) << t.action.ToString();
      }
    }
    EXPECT_GE(res.end_ns, prev_end);
    for (const ActionTiming& w : res.send_waits) {
      EXPECT_TRUE(IsComm(w.action.kind));
      EXPECT_GE(w.start_ns, prev_end);
      EXPECT_LE(w.end_ns, res.end_ns);
    }
  }
  EXPECT_EQ(sent[0], received[1]);
  EXPECT_EQ(sent[1], received[0]);
  EXPECT_EQ(sent[0], 2 * tensor_bytes);  // two micro-batches forward
}

// A device timer that hands out marks in order and reports each interval as 1000 ns per
// mark between its ends, so the test can tell which marks framed which action.
class CountingTimer : public DeviceTimer {
 public:
  void Reset() override {
    ++resets;
    marks = 0;
  }
  int Mark() override { return marks++; }
  absl::StatusOr<int64_t> ElapsedNs(int from, int to) override {
    if (from < 0 || to >= marks) return absl::InvalidArgumentError("unknown mark");
    return int64_t{1000} * (to - from) + from;  // distinct per interval
  }
  int resets = 0;
  int marks = 0;
};

// On a device that computes asynchronously the executor frames every compute action and the
// optimizer step with device marks and reads them at the step's end; communication actions
// stay unmeasured. On the CPU no timer exists and nothing is measured.
TEST(PipelineTimelineTest, DeviceTimeFramesComputeActionsOnly) {
  TwoStageMlp job;
  InProcessHub hub(2);
  CountingTimer timers[2];
  std::vector<std::unique_ptr<StageExecutor>> ex;
  for (int r = 0; r < 2; ++r) {
    StageExecutorOptions opts;
    opts.device_timer = &timers[r];
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(job.spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    auto e = StageExecutor::Create(*valid, job.sched, job.blocks, r, hub.transport(r), opts);
    ASSERT_TRUE(e.ok()) << e.status();
    ex.push_back(*std::move(e));
  }
  for (int64_t step = 0; step < 2; ++step) {
    absl::StatusOr<RankStepResult> results[2];
    std::thread t1([&] { results[1] = ex[1]->RunStep(step); });
    results[0] = ex[0]->RunStep(step);
    t1.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      EXPECT_EQ(timers[r].resets, step + 1) << "one reset per step";
      int next_mark = 0;
      for (const ActionTiming& t : results[r]->timeline) {
        const bool timed = IsCompute(t.action.kind) || t.action.kind == ActionKind::kStep;
        if (timed) {
          EXPECT_EQ(t.device_ns, 1000 + next_mark) << t.action.ToString();
          next_mark += 2;
        } else {
          EXPECT_EQ(t.device_ns, -1) << t.action.ToString();
        }
      }
      EXPECT_EQ(next_mark, timers[r].marks) << "two marks per timed action, no others";
    }
  }
  // Without a timer (the CPU) nothing is measured.
  InProcessHub cpu_hub(2);
  std::vector<std::unique_ptr<StageExecutor>> cpu;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(job.spec);
    ASSERT_TRUE(valid.ok()) << valid.status();
    auto e = StageExecutor::Create(*valid, job.sched, job.blocks, r, cpu_hub.transport(r),
                                   StageExecutorOptions{});
    ASSERT_TRUE(e.ok()) << e.status();
    cpu.push_back(*std::move(e));
  }
  absl::StatusOr<RankStepResult> results[2];
  std::thread t1([&] { results[1] = cpu[1]->RunStep(0); });
  results[0] = cpu[0]->RunStep(0);
  t1.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    for (const ActionTiming& t : results[r]->timeline) EXPECT_EQ(t.device_ns, -1);
  }
}

// Sets element 0 of float32 tensor `w` to NaN, through the host (on a GPU `w` is device
// memory).
absl::Status SetFirstToNan(Tensor& w) {
  std::vector<float> host(static_cast<size_t>(w.numel()));
  BATON_RETURN_IF_ERROR(w.CopyToHost(host.data()));
  host[0] = std::nanf("");
  return w.CopyFromHost(host.data());
}

// A non-finite global gradient norm fails the step as divergence at CLIP_GRAD, naming it,
// before any weight changes; every rank computed the same norm, so none waits for another.
TEST(PipelineFailureTest, ANonFiniteGradientNormFailsTheStepAtClipGrad) {
  baton::v1::JobSpec spec = GptJob();
  AddRecipe(&spec);
  auto* p = spec.mutable_pipeline();
  p->set_stages(3);
  p->set_microbatches(2);
  LocalPipelineOptions opts;
  opts.recv_timeout = absl::Minutes(10);  // a rank that waited for a peer would hang here
  auto t = LocalPipelineTrainer::Create(spec, opts);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->schedule().clips_grads());
  // A NaN in a middle block's weight makes every later activation, and the gradients, NaN.
  const std::vector<Parameter*>& mid = (*t)->executor(1).parameters();
  ASSERT_FALSE(mid.empty());
  ASSERT_TRUE(SetFirstToNan(mid.front()->value).ok());
  auto s = (*t)->Step();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(IsDiverged(s.status())) << s.status();
  EXPECT_NE(s.status().message().find("global gradient norm"), absl::string_view::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("CLIP_GRAD"), absl::string_view::npos) << s.status();
}

// Sharded without clipping: each owner sums its own gradients and every replica sees every
// sum, so every replica fails the step as diverged, naming the same parameter, whichever
// replica owns it; with clipping, CLIP_GRAD's norm catches it first, as unsharded.
TEST(PipelineFailureTest, ANonFiniteGradientFailsEveryShardedReplicaNamingIt) {
  for (bool clip : {false, true}) {
    SCOPED_TRACE(clip ? "clipping" : "no clipping");
    baton::v1::JobSpec spec = GptJob();
    if (clip) AddRecipe(&spec);
    auto* p = spec.mutable_pipeline();
    p->set_stages(2);
    p->set_microbatches(2);
    p->set_data_parallel(2);
    spec.mutable_optimizer()->set_shard(true);
    LocalPipelineOptions opts;
    opts.recv_timeout = absl::Minutes(10);  // a replica that waited would hang here
    auto t = LocalPipelineTrainer::Create(spec, opts);
    ASSERT_TRUE(t.ok()) << t.status();
    // A NaN in replica 1's first weight of rank 1: its activations, and then every
    // gradient of both stages of that replica, are NaN; replica 0's are not.
    ASSERT_TRUE(SetFirstToNan((*t)->executor(3).parameters().front()->value).ok());
    auto s = (*t)->Step();
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(IsDiverged(s.status())) << s.status();
    const std::string want = clip ? "global gradient norm" : "the gradient of";
    EXPECT_NE(s.status().message().find(want), absl::string_view::npos) << s.status();
  }
}

TEST(PipelineFailureTest, PeerAbortStopsEveryRank) {
  baton::v1::JobSpec spec = GptJob();
  auto* p = spec.mutable_pipeline();
  p->set_stages(3);
  p->set_microbatches(4);
  LocalPipelineOptions opts;
  opts.recv_timeout = absl::Minutes(10);
  auto t = LocalPipelineTrainer::Create(spec, opts);
  ASSERT_TRUE(t.ok()) << t.status();
  // An abort before the step (a peer dying) must end the step on every rank with the
  // reason, never at the receive deadline (a rank that waited for it would end the step
  // with DEADLINE_EXCEEDED, not the reason).
  (*t)->hub().transport(1)->Abort(absl::UnavailableError("worker 1 lost its GPU"));
  auto s = (*t)->Step();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("worker 1 lost its GPU"), absl::string_view::npos)
      << s.status();
  // The pipeline refuses further steps instead of running on half-updated weights.
  EXPECT_EQ((*t)->Step().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace baton
