#include "common/spec/spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/core/cuda_device.h"
#include "common/schedule/vocabulary.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::v1::JobSpec;
using ::testing::HasSubstr;

#ifndef BATON_SOURCE_DIR
#error "spec_test needs BATON_SOURCE_DIR (the repository root)"
#endif

std::string ExamplePath(const std::string& name) {
  return std::string(BATON_SOURCE_DIR) + "/client/examples/" + name;
}

JobSpec ValidMlp() {
  JobSpec spec;
  spec.set_name("mlp");
  spec.set_steps(10);
  spec.set_seed(1);
  auto* mlp = spec.mutable_model()->mutable_mlp();
  mlp->set_input_dim(8);
  mlp->set_width(16);
  mlp->set_depth(3);
  mlp->set_output_dim(2);
  spec.mutable_data()->mutable_synthetic()->set_teacher_width(8);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_microbatches(4);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.9f);
  return spec;
}

JobSpec ValidGpt() {
  JobSpec spec;
  spec.set_name("gpt");
  spec.set_steps(10);
  spec.set_seed(2);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_vocab_size(64);
  gpt->set_context(16);
  gpt->set_d_model(64);
  gpt->set_heads(4);
  gpt->set_layers(2);
  spec.mutable_data()->mutable_text()->set_inline_text("hello world, hello pipelines");
  spec.mutable_data()->set_batch_size(4);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_optimizer()->mutable_adamw()->set_learning_rate(1e-3f);
  return spec;
}

TEST(LocalDeviceTest, CpuAlwaysAutoByWhatIsVisibleCudaOnlyWithADevice) {
  JobSpec spec = ValidGpt();
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  EXPECT_EQ(*LocalDeviceFor(spec), Device::kCpu);
  spec.set_device(baton::v1::DEVICE_KIND_UNSPECIFIED);
  EXPECT_EQ(*LocalDeviceFor(spec), CudaDeviceCount() > 0 ? Device::kCuda : Device::kCpu);
  spec.set_device(baton::v1::DEVICE_KIND_CUDA);
  const absl::StatusOr<Device> cuda = LocalDeviceFor(spec);
  if (CudaDeviceCount() > 0) {
    EXPECT_EQ(*cuda, Device::kCuda);
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("DEVICE_KIND_CUDA"), std::string::npos) << cuda.status();
  }
}

TEST(ValidateTest, NcclTransportOnTheCpuIsRefused) {
  JobSpec spec = ValidMlp();
  spec.set_transport(baton::v1::TRANSPORT_KIND_NCCL);
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  absl::Status st = ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("transport:", 0), 0u) << st;
  spec.set_device(baton::v1::DEVICE_KIND_UNSPECIFIED);  // auto: placement makes it cuda
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  spec.set_transport(static_cast<baton::v1::TransportKind>(9));
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).code(), absl::StatusCode::kInvalidArgument);
}

// JobSpec.attention: fused for heads up to 128, tiled for bf16 jobs with heads a multiple of
// 16 up to 128, neither for a model without attention; each refusal names the field and why.
TEST(ValidateTest, TheAttentionKernelFitsTheModelAndPrecision) {
  const auto refusal = [](JobSpec spec) {
    const absl::Status s = ValidateAndDefaultJobSpec(&spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  JobSpec gpt = ValidGpt();  // head size 16
  for (auto a : {baton::v1::ATTENTION_KERNEL_MATERIALISED, baton::v1::ATTENTION_KERNEL_FUSED}) {
    gpt.set_attention(a);
    EXPECT_TRUE(ValidateAndDefaultJobSpec(&gpt).ok()) << baton::v1::AttentionKernel_Name(a);
  }
  gpt.set_attention(baton::v1::ATTENTION_KERNEL_TILED);
  EXPECT_THAT(
      refusal(gpt),
      ::testing::AllOf(::testing::HasSubstr("attention"),
                       ::testing::HasSubstr(
                           "needs precision PRECISION_BF16, got PRECISION_FP32 (the default)")));
  gpt.set_precision(baton::v1::PRECISION_BF16);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&gpt).ok());
  gpt.mutable_model()->mutable_gpt()->set_heads(8);  // head size 8
  EXPECT_THAT(refusal(gpt), ::testing::HasSubstr("d_model / heads = 8 is not a multiple of 16"));
  gpt.mutable_model()->mutable_gpt()->set_heads(4);
  gpt.mutable_model()->mutable_gpt()->set_d_model(1024);  // head size 256
  gpt.set_attention(baton::v1::ATTENTION_KERNEL_FUSED);
  EXPECT_THAT(refusal(gpt), ::testing::HasSubstr("d_model / heads = 256 is over 128"));
  JobSpec mlp = ValidMlp();
  mlp.set_attention(baton::v1::ATTENTION_KERNEL_FUSED);
  EXPECT_THAT(refusal(mlp), ::testing::HasSubstr("the model has no attention"));
  mlp.set_attention(static_cast<baton::v1::AttentionKernel>(9));
  EXPECT_THAT(refusal(mlp), ::testing::HasSubstr("unknown attention kernel 9"));
}

TEST(ValidateTest, AttentionWordsOnTheCommandLine) {
  EXPECT_EQ(*ParseAttentionKernel("tiled"), baton::v1::ATTENTION_KERNEL_TILED);
  EXPECT_EQ(*ParseAttentionKernel("fused"), baton::v1::ATTENTION_KERNEL_FUSED);
  EXPECT_EQ(*ParseAttentionKernel("materialised"), baton::v1::ATTENTION_KERNEL_MATERIALISED);
  EXPECT_EQ(*ParseAttentionKernel("auto"), baton::v1::ATTENTION_KERNEL_UNSPECIFIED);
  EXPECT_THAT(ParseAttentionKernel("flash").status().message(),
              HasSubstr("materialised, fused, tiled or auto, got 'flash'"));
}

TEST(ValidateTest, AShardedOptimizerNeedsReplicas) {
  JobSpec spec = ValidMlp();
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_pipeline()->set_data_parallel(2);
  spec.mutable_optimizer()->set_shard(true);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");  // checkpoints hold the state whole
  spec.mutable_checkpoint()->set_every_steps(1);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  spec.mutable_pipeline()->set_data_parallel(1);
  spec.mutable_pipeline()->set_microbatches(4);
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateTest, CheckpointFieldsAreCheckedAndKeepDefaults) {
  JobSpec spec = ValidMlp();
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  absl::Status st = ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("checkpoint.every_steps: must be at least 1, got 0", 0), 0u) << st;
  spec.mutable_checkpoint()->set_every_steps(-3);
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("checkpoint.every_steps:", 0), 0u);
  spec.mutable_checkpoint()->set_every_steps(5);
  spec.mutable_checkpoint()->set_dir("");
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("checkpoint.dir: required", 0), 0u);
  spec.mutable_checkpoint()->set_dir("/tmp/ckpt");
  spec.mutable_checkpoint()->set_keep(-1);
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("checkpoint.keep:", 0), 0u);
  spec.mutable_checkpoint()->set_keep(0);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  EXPECT_EQ(spec.checkpoint().keep(), 2);
  JobSpec none = ValidMlp();
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&none).ok());
  EXPECT_FALSE(none.has_checkpoint()) << "no checkpoint unless asked for";
}

TEST(ValidateTest, ResumeFromNamesTheJobAndAStepBeforeTheLast) {
  JobSpec spec = ValidMlp();
  spec.set_steps(10);
  spec.mutable_resume_from();
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("resume_from.job_id: required", 0),
            0u);
  spec.mutable_resume_from()->set_job_id("job-000001");
  spec.mutable_resume_from()->set_step(-1);
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("resume_from.step: must be", 0), 0u);
  spec.mutable_resume_from()->set_step(10);
  absl::Status st = ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(st.message().rfind("resume_from.step: checkpoint step 10 leaves nothing", 0), 0u) << st;
  spec.mutable_resume_from()->set_step(0);  // the newest complete one
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  spec.mutable_resume_from()->set_step(9);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
}

TEST(ValidateTest, InitFromHfIsAPathForAGptOrLlama) {
  JobSpec spec = ValidGpt();
  spec.mutable_init();  // no source
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("init.from_hf: required", 0), 0u);
  spec.mutable_init()->set_from_hf("models/gpt2");
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  spec.mutable_init()->set_from_hf("/abs/models/gpt2");
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  JobSpec mlp = ValidMlp();
  mlp.mutable_init()->set_from_hf("models/gpt2");
  EXPECT_EQ(ValidateAndDefaultJobSpec(&mlp).message().rfind("init.from_hf: only a model.gpt", 0),
            0u);
}

TEST(ValidateTest, RestartNeedsARestartAndMinStagesWithinTheStages) {
  JobSpec spec = ValidMlp();
  spec.mutable_restart();
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("restart.max_restarts:", 0), 0u);
  spec.mutable_restart()->set_max_restarts(2);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  EXPECT_EQ(spec.restart().min_stages(), spec.pipeline().stages()) << "0 means never fewer";
  spec.mutable_restart()->set_min_stages(spec.pipeline().stages() + 1);
  absl::Status st = ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(st.message().rfind("restart.min_stages: must be between 1 and", 0), 0u) << st;
  spec.mutable_restart()->set_min_stages(-1);
  EXPECT_EQ(ValidateAndDefaultJobSpec(&spec).message().rfind("restart.min_stages:", 0), 0u);
}

TEST(ValidateTest, UnknownDeviceKindIsRefused) {
  JobSpec spec = ValidMlp();
  spec.set_device(static_cast<baton::v1::DeviceKind>(7));
  const absl::Status st = ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("device:", 0), 0u) << st;
}

TEST(ValidateTest, TokenModelsTrainOnTokenShardsWithEval) {
  JobSpec gpt = ValidGpt();
  v1::TokenData* t = gpt.mutable_data()->mutable_tokens();
  t->add_train("shards/train_*.bin");
  t->add_val("shards/val.bin");
  t->set_format(v1::TOKEN_FORMAT_LLMC);
  t->set_sampling(v1::TOKEN_SAMPLING_SEQUENTIAL);
  gpt.mutable_eval()->set_every(5);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&gpt).ok());
  JobSpec again = gpt;
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&again).ok());
  EXPECT_EQ(again.SerializeAsString(), gpt.SerializeAsString());

  v1::LlamaSpec* l = gpt.mutable_model()->mutable_llama();  // a llama on the same shards
  l->set_vocab_size(64);
  l->set_context(16);
  l->set_d_model(32);
  l->set_heads(4);
  l->set_layers(2);
  l->set_intermediate_size(48);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&gpt).ok());

  JobSpec no_eval = ValidGpt();  // val may be empty when the job does not evaluate
  no_eval.mutable_data()->mutable_tokens()->add_train("a.bin");
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&no_eval).ok());
}

TEST(ValidateTest, ValidSpecsPass) {
  JobSpec mlp = ValidMlp();
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&mlp).ok());
  JobSpec gpt = ValidGpt();
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&gpt).ok());
}

// One refusal: a mutation of a valid spec and the field path its message must start with.
struct Refusal {
  std::string test_name;
  bool gpt;  // start from ValidGpt() instead of ValidMlp()
  std::function<void(JobSpec*)> mutate;
  std::string field;
  std::string also;  // another substring the message must contain ("" for none)
};
// Keeps test listings (and ctest names) readable instead of a byte dump of the struct.
void PrintTo(const Refusal& r, std::ostream* os) { *os << r.test_name; }

class RefusalTest : public testing::TestWithParam<Refusal> {};

TEST_P(RefusalTest, NamesTheField) {
  const Refusal& r = GetParam();
  JobSpec spec = r.gpt ? ValidGpt() : ValidMlp();
  r.mutate(&spec);
  const absl::Status status = ValidateAndDefaultJobSpec(&spec);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), r.field + ": ")) << status;
  if (!r.also.empty()) {
    EXPECT_TRUE(absl::StrContains(status.message(), r.also)) << status;
  }
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Replaces the model with a valid llama (on the gpt base spec's text data), then lets
// `change` break it.
std::function<void(JobSpec*)> Llama(std::function<void(v1::LlamaSpec*)> change) {
  return [change](JobSpec* s) {
    v1::LlamaSpec* l = s->mutable_model()->mutable_llama();
    l->set_vocab_size(64);
    l->set_context(16);
    l->set_d_model(32);
    l->set_heads(4);
    l->set_kv_heads(2);
    l->set_layers(2);
    l->set_intermediate_size(48);
    change(l);
  };
}

const std::vector<Refusal>& Refusals() {
  static const auto* refusals = new std::vector<Refusal>{
      {"NameTooLong", false, [](JobSpec* s) { s->set_name(std::string(129, 'x')); }, "name", "128"},
      {"StepsZero", false, [](JobSpec* s) { s->set_steps(0); }, "steps",
       "must be at least 1, got 0"},
      {"StepsNegative", false, [](JobSpec* s) { s->set_steps(-3); }, "steps", "-3"},
      {"NoModel", false, [](JobSpec* s) { s->clear_model(); }, "model",
       "no architecture set (want mlp, gpt or llama)"},
      {"MlpInputDim", false,
       [](JobSpec* s) { s->mutable_model()->mutable_mlp()->set_input_dim(0); },
       "model.mlp.input_dim", ""},
      {"MlpWidth", false, [](JobSpec* s) { s->mutable_model()->mutable_mlp()->set_width(-1); },
       "model.mlp.width", ""},
      {"MlpDepth", false, [](JobSpec* s) { s->mutable_model()->mutable_mlp()->set_depth(0); },
       "model.mlp.depth", ""},
      {"MlpOutputDim", false,
       [](JobSpec* s) { s->mutable_model()->mutable_mlp()->set_output_dim(0); },
       "model.mlp.output_dim", ""},
      {"GptVocab", true, [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_vocab_size(0); },
       "model.gpt.vocab_size", ""},
      {"GptContext", true, [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_context(-5); },
       "model.gpt.context", ""},
      {"GptDModel", true, [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_d_model(0); },
       "model.gpt.d_model", ""},
      {"GptHeadsZero", true, [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_heads(0); },
       "model.gpt.heads", ""},
      {"GptHeadsDivide", true, [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_heads(5); },
       "model.gpt.heads", "must divide d_model (d_model=64, heads=5)"},
      {"GptLayers", true, [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_layers(0); },
       "model.gpt.layers", ""},
      {"LlamaKvHeadsDivide", true, Llama([](v1::LlamaSpec* l) { l->set_kv_heads(3); }),
       "model.llama.kv_heads", "must divide heads (heads=4, kv_heads=3)"},
      {"LlamaKvHeadsNegative", true, Llama([](v1::LlamaSpec* l) { l->set_kv_heads(-1); }),
       "model.llama.kv_heads", ">= 0"},
      {"LlamaOddHeadSize", true,
       Llama([](v1::LlamaSpec* l) {
         l->set_d_model(12);
         l->set_kv_heads(4);
       }),
       "model.llama.heads", "head size d_model / heads = 3 must be even"},
      {"LlamaIntermediate", true, Llama([](v1::LlamaSpec* l) { l->set_intermediate_size(0); }),
       "model.llama.intermediate_size", ""},
      {"LlamaRopeTheta", true, Llama([](v1::LlamaSpec* l) { l->set_rope_theta(0.5f); }),
       "model.llama.rope_theta", "must be > 1"},
      {"LlamaRmsEps", true, Llama([](v1::LlamaSpec* l) { l->set_rms_norm_eps(-1e-6f); }),
       "model.llama.rms_norm_eps", ">= 0"},
      {"LlamaLayers", true, Llama([](v1::LlamaSpec* l) { l->set_layers(0); }),
       "model.llama.layers", ""},
      {"LlamaNeedsText", false, Llama([](v1::LlamaSpec*) {}), "model.llama", "needs data.text"},
      {"NoDataSource", false, [](JobSpec* s) { s->mutable_data()->clear_source(); }, "data",
       "no source set"},
      {"BatchSizeZero", false, [](JobSpec* s) { s->mutable_data()->set_batch_size(0); },
       "data.batch_size", ""},
      {"BatchNotDivisible", false,
       [](JobSpec* s) {
         s->mutable_data()->set_batch_size(10);
         s->mutable_pipeline()->set_microbatches(4);
       },
       "data.batch_size", "10 is not divisible by pipeline.microbatches=4"},
      {"MicrobatchesAboveBatch", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_microbatches(16); }, "data.batch_size", ""},
      {"EmptyInlineText", true,
       [](JobSpec* s) { s->mutable_data()->mutable_text()->set_inline_text(""); },
       "data.text.inline_text", "empty text"},
      {"EmptyPath", true, [](JobSpec* s) { s->mutable_data()->mutable_text()->set_path(""); },
       "data.text.path", ""},
      {"TextWithoutContent", true,
       [](JobSpec* s) { s->mutable_data()->mutable_text()->clear_content(); }, "data.text", ""},
      {"TeacherWidthNegative", false,
       [](JobSpec* s) { s->mutable_data()->mutable_synthetic()->set_teacher_width(-2); },
       "data.synthetic.teacher_width", ""},
      {"NoiseNegative", false,
       [](JobSpec* s) { s->mutable_data()->mutable_synthetic()->set_noise(-0.1f); },
       "data.synthetic.noise", ""},
      {"NoiseNan", false,
       [](JobSpec* s) { s->mutable_data()->mutable_synthetic()->set_noise(kNan); },
       "data.synthetic.noise", "finite"},
      {"NoiseInf", false,
       [](JobSpec* s) { s->mutable_data()->mutable_synthetic()->set_noise(kInf); },
       "data.synthetic.noise", "finite"},
      {"GptWithSynthetic", true,
       [](JobSpec* s) { s->mutable_data()->mutable_synthetic()->set_teacher_width(4); },
       "model.gpt", "needs data.text"},
      {"MlpWithText", false,
       [](JobSpec* s) { s->mutable_data()->mutable_text()->set_inline_text("abc"); }, "model.mlp",
       "needs data.synthetic"},
      {"StagesNegative", false, [](JobSpec* s) { s->mutable_pipeline()->set_stages(-1); },
       "pipeline.stages", ""},
      {"VirtualStagesNegative", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_virtual_stages(-1); }, "pipeline.virtual_stages",
       ""},
      {"MicrobatchesNegative", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_microbatches(-4); }, "pipeline.microbatches",
       ""},
      {"UnknownSchedule", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_schedule(static_cast<v1::Schedule>(17)); },
       "pipeline.schedule", "17"},
      {"DataParallelNegative", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_data_parallel(-2); },
       "pipeline.data_parallel", ""},
      {"DataParallelTooMany", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_data_parallel(kMaxDataParallel + 1); },
       "pipeline.data_parallel", "allowed"},
      {"BatchDoesNotSplitIntoReplicas", false,
       [](JobSpec* s) {
         s->mutable_data()->set_batch_size(12);
         s->mutable_pipeline()->set_microbatches(4);
         s->mutable_pipeline()->set_data_parallel(2);
       },
       "data.batch_size", "does not split into pipeline.data_parallel=2"},
      {"ShardWithOneReplica", false,
       [](JobSpec* s) { s->mutable_optimizer()->set_shard(true); }, "optimizer.shard",
       "needs pipeline.data_parallel of 2 or more, got 1"},
      {"BucketBytesNegative", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_reduce_bucket_bytes(-1); },
       "pipeline.reduce_bucket_bytes", ">= 0"},
      {"UnknownReduceMode", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_reduce_mode(static_cast<v1::ReduceMode>(7)); },
       "pipeline.reduce_mode", "unknown reduce mode 7"},
      {"UnknownCollectiveEngine", false,
       [](JobSpec* s) {
         s->mutable_pipeline()->set_collective_engine(static_cast<v1::CollectiveEngine>(8));
       },
       "pipeline.collective_engine", "unknown collective engine 8"},
      {"NcclEngineOnCpu", false,
       [](JobSpec* s) {
         s->set_device(v1::DEVICE_KIND_CPU);
         s->mutable_pipeline()->set_collective_engine(v1::COLLECTIVE_ENGINE_NCCL);
       },
       "pipeline.collective_engine", "needs GPUs"},
      {"RecomputeStagesWithoutRecompute", false,
       [](JobSpec* s) { s->mutable_pipeline()->add_recompute_stages(0); },
       "pipeline.recompute_stages", "not RECOMPUTE_FULL"},
      {"RecomputeStageOutOfRange", false,
       [](JobSpec* s) {
         s->mutable_pipeline()->set_stages(2);
         s->mutable_pipeline()->set_recompute(v1::RECOMPUTE_FULL);
         s->mutable_pipeline()->add_recompute_stages(2);
       },
       "pipeline.recompute_stages", "stage 2 is not one of the pipeline's 2 stages"},
      {"RecomputeStageTwice", false,
       [](JobSpec* s) {
         s->mutable_pipeline()->set_stages(2);
         s->mutable_pipeline()->set_recompute(v1::RECOMPUTE_FULL);
         s->mutable_pipeline()->add_recompute_stages(1);
         s->mutable_pipeline()->add_recompute_stages(1);
       },
       "pipeline.recompute_stages", "listed twice"},
      {"UnknownRecompute", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_recompute(static_cast<v1::Recompute>(9)); },
       "pipeline.recompute", "unknown recompute mode 9"},
      {"MlpTooManyStages", false,
       [](JobSpec* s) { s->mutable_pipeline()->set_stages(5); },  // depth 3: 4 blocks
       "pipeline.stages", "4 blocks"},
      {"GptTooManyChunks", true,
       [](JobSpec* s) {  // layers 2: 4 blocks
         s->mutable_pipeline()->set_stages(3);
         s->mutable_pipeline()->set_virtual_stages(2);
       },
       "pipeline.stages", "= 6 model chunks"},
      {"NoOptimizer", false, [](JobSpec* s) { s->clear_optimizer(); }, "optimizer",
       "no algorithm set"},
      {"SgdLearningRateZero", false,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_sgd()->set_learning_rate(0); },
       "optimizer.sgd.learning_rate", "must be > 0"},
      {"SgdLearningRateNan", false,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_sgd()->set_learning_rate(kNan); },
       "optimizer.sgd.learning_rate", ""},
      {"SgdMomentumOne", false,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_sgd()->set_momentum(1.0f); },
       "optimizer.sgd.momentum", "[0, 1)"},
      {"SgdMomentumNegative", false,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_sgd()->set_momentum(-0.5f); },
       "optimizer.sgd.momentum", ""},
      {"SgdWeightDecayNegative", false,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_sgd()->set_weight_decay(-1e-4f); },
       "optimizer.sgd.weight_decay", ""},
      {"AdamLearningRateNegative", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_learning_rate(-1); },
       "optimizer.adamw.learning_rate", "must be > 0"},
      {"AdamLearningRateUnset", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->clear_learning_rate(); },
       "optimizer.adamw.learning_rate", "must be > 0"},
      {"AdamBeta1", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_beta1(1.0f); },
       "optimizer.adamw.beta1", ""},
      {"AdamBeta2", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_beta2(-0.1f); },
       "optimizer.adamw.beta2", ""},
      {"AdamEpsilonZero", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_epsilon(0); },
       "optimizer.adamw.epsilon", ""},
      {"AdamWeightDecayNegative", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_weight_decay(-0.01f); },
       "optimizer.adamw.weight_decay", ""},
      {"WarmupNegative", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_lr_schedule()->set_warmup_steps(-1); },
       "optimizer.lr_schedule.warmup_steps", "must be >= 0"},
      {"UnknownDecay", true,
       [](JobSpec* s) {
         s->mutable_optimizer()->mutable_lr_schedule()->set_decay(static_cast<v1::LrDecay>(9));
       },
       "optimizer.lr_schedule.decay", "unknown decay 9"},
      {"MinLrNegative", false,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_lr_schedule()->set_min_lr(-1e-5f); },
       "optimizer.lr_schedule.min_lr", "must be >= 0"},
      {"MinLrNan", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_lr_schedule()->set_min_lr(kNan); },
       "optimizer.lr_schedule.min_lr", "finite"},
      {"MinLrAboveThePeak", true,
       [](JobSpec* s) { s->mutable_optimizer()->mutable_lr_schedule()->set_min_lr(1e3f); },
       "optimizer.lr_schedule.min_lr", "at most the learning rate"},
      {"DecayStepsNegative", true,
       [](JobSpec* s) {
         auto* l = s->mutable_optimizer()->mutable_lr_schedule();
         l->set_decay(v1::LR_DECAY_WSD);
         l->set_decay_steps(-2);
       },
       "optimizer.lr_schedule.decay_steps", "must be >= 0"},
      {"WsdDecayLongerThanTheJob", true,
       [](JobSpec* s) {
         auto* l = s->mutable_optimizer()->mutable_lr_schedule();
         l->set_decay(v1::LR_DECAY_WSD);
         l->set_decay_steps(1000000);
       },
       "optimizer.lr_schedule.decay_steps", "longer than the job's"},
      {"DecayStepsWithoutWsd", true,
       [](JobSpec* s) {
         auto* l = s->mutable_optimizer()->mutable_lr_schedule();
         l->set_decay(v1::LR_DECAY_COSINE);
         l->set_decay_steps(1);
       },
       "optimizer.lr_schedule.decay_steps", "only LR_DECAY_WSD"},
      {"ClipNegative", false,
       [](JobSpec* s) { s->mutable_optimizer()->set_clip_grad_norm(-1.0f); },
       "optimizer.clip_grad_norm", "must be >= 0"},
      {"ClipInfinite", true,
       [](JobSpec* s) { s->mutable_optimizer()->set_clip_grad_norm(kInf); },
       "optimizer.clip_grad_norm", "finite"},
      {"UnknownWeightDecayScope", true,
       [](JobSpec* s) {
         s->mutable_optimizer()->set_weight_decay_scope(static_cast<v1::WeightDecayScope>(5));
       },
       "optimizer.weight_decay_scope", "unknown scope 5"},
      {"TokensNeedATrainShard", true,
       [](JobSpec* s) { s->mutable_data()->mutable_tokens()->add_val("val.bin"); },
       "data.tokens.train", "at least one"},
      {"TokensEmptyPath", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_data()->mutable_tokens()->add_val("");
       },
       "data.tokens.val", "not a usable path"},
      {"TokensUnknownFormat", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_data()->mutable_tokens()->set_format(static_cast<v1::TokenFormat>(9));
       },
       "data.tokens.format", "unknown format 9"},
      {"TokensUnknownSampling", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_data()->mutable_tokens()->set_sampling(static_cast<v1::TokenSampling>(7));
       },
       "data.tokens.sampling", "unknown sampling 7"},
      {"MlpWithTokens", false,
       [](JobSpec* s) { s->mutable_data()->mutable_tokens()->add_train("a.bin"); }, "data.tokens",
       "needs a token model"},
      {"EvalNeedsValShards", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_eval()->set_every(10);
       },
       "eval.every", "data.tokens.val"},
      {"EvalOnTextIsRefused", true, [](JobSpec* s) { s->mutable_eval()->set_every(10); },
       "eval.every", "data.tokens.val"},
      {"EvalEveryZero", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_data()->mutable_tokens()->add_val("v.bin");
         s->mutable_eval()->set_batches(2);
       },
       "eval.every", "at least 1"},
      {"EvalBatchesNegative", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_data()->mutable_tokens()->add_val("v.bin");
         s->mutable_eval()->set_every(5);
         s->mutable_eval()->set_batches(-1);
       },
       "eval.batches", ""},
      // 2^31 - 1 batches would evaluate for days between two steps.
      {"EvalBatchesBeyondTheBound", true,
       [](JobSpec* s) {
         s->mutable_data()->mutable_tokens()->add_train("a.bin");
         s->mutable_data()->mutable_tokens()->add_val("v.bin");
         s->mutable_eval()->set_every(5);
         s->mutable_eval()->set_batches(2147483647);
       },
       "eval.batches", "holding the job's workers"},
  };
  return *refusals;
}

INSTANTIATE_TEST_SUITE_P(All, RefusalTest, testing::ValuesIn(Refusals()),
                         [](const testing::TestParamInfo<Refusal>& info) {
                           return info.param.test_name;
                         });

// The schedule table keeps the job-spec enum as a number: each entry's number has the enum
// name its entry implies ("zb-v" is SCHEDULE_ZB_V), and every enum value has an entry but
// SCHEDULE_AUTO (not a schedule: the planner's choice of one).
TEST(ValidateTest, TheScheduleTableMatchesTheSpecEnum) {
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (e.kind == ScheduleKind::kCustom) continue;
    std::string want = absl::AsciiStrToUpper(e.name);
    std::replace(want.begin(), want.end(), '-', '_');
    EXPECT_EQ(v1::Schedule_Name(static_cast<v1::Schedule>(e.spec_value)), "SCHEDULE_" + want)
        << e.name;
  }
  for (int v = v1::Schedule_MIN; v <= v1::Schedule_MAX; ++v) {
    if (v1::Schedule_IsValid(v) && v != v1::SCHEDULE_AUTO) {
      EXPECT_TRUE(ScheduleEntryForSpecValue(v).ok()) << v;
    }
  }
  EXPECT_FALSE(ScheduleEntryForSpecValue(v1::SCHEDULE_AUTO).ok());
}

// SCHEDULE_AUTO validates with virtual_stages and microbatches left unset (the planner's to
// choose) and keeps them 0; what trains it refuses it until it is resolved.
TEST(ValidateTest, AutoScheduleLeavesUnsetChoicesToThePlanner) {
  JobSpec spec = ValidGpt();
  spec.mutable_pipeline()->set_schedule(v1::SCHEDULE_AUTO);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->clear_microbatches();
  spec.mutable_pipeline()->clear_virtual_stages();
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(spec.pipeline().microbatches(), 0);
  EXPECT_EQ(spec.pipeline().virtual_stages(), 0);
  EXPECT_EQ(RequireChosenSchedule(spec).code(), absl::StatusCode::kFailedPrecondition);
  // What the spec does fix is still checked.
  spec.mutable_pipeline()->set_microbatches(-3);
  EXPECT_FALSE(ValidateAndDefaultJobSpec(&spec).ok());
}

// The V schedules take two chunks per rank: unset (or 1) reads as 2, more is refused.
TEST(ValidateTest, VSchedulesTakeTwoChunksPerRank) {
  JobSpec spec = ValidGpt();
  spec.mutable_pipeline()->set_schedule(v1::SCHEDULE_ZB_V);
  spec.mutable_pipeline()->set_stages(2);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  EXPECT_EQ(spec.pipeline().virtual_stages(), 2);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());  // idempotent
  spec.mutable_pipeline()->set_virtual_stages(3);
  const absl::Status s = ValidateAndDefaultJobSpec(&spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pipeline.virtual_stages: zb-v places exactly two chunks"),
            std::string::npos)
      << s;
}

// pipeline.partition: one block count per chunk, adding up to the model's blocks; none with
// SCHEDULE_AUTO (the planner chooses the split).
TEST(ValidateTest, PartitionIsCheckedAgainstTheChunksAndTheModel) {
  JobSpec spec = ValidGpt();
  const int64_t blocks = ModelBlockCount(spec.model());
  ASSERT_GE(blocks, 3);
  spec.mutable_pipeline()->set_schedule(v1::SCHEDULE_1F1B);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->add_partition(1);
  spec.mutable_pipeline()->add_partition(static_cast<int32_t>(blocks - 1));
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok()) << ValidateAndDefaultJobSpec(&spec);
  auto refused = [&](JobSpec bad, const std::string& expect) {
    const absl::Status s = ValidateAndDefaultJobSpec(&bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << expect;
    EXPECT_NE(s.message().find(expect), std::string::npos) << s;
  };
  JobSpec three = spec;
  three.mutable_pipeline()->set_stages(3);
  refused(three, "pipeline.partition: 2 entries for 3 pipeline chunks");
  JobSpec short_sum = spec;
  short_sum.mutable_pipeline()->set_partition(1, static_cast<int32_t>(blocks - 2));
  refused(short_sum, absl::StrCat("pipeline.partition: the entries add up to ", blocks - 1,
                                  " blocks, but the model has ", blocks));
  JobSpec empty_chunk = spec;
  empty_chunk.mutable_pipeline()->set_partition(0, 0);
  refused(empty_chunk, "pipeline.partition[0]: 0 blocks");
  JobSpec automatic = spec;
  automatic.mutable_pipeline()->set_schedule(v1::SCHEDULE_AUTO);
  refused(automatic, "pipeline.partition: with SCHEDULE_AUTO the auto-planner chooses the split");
}

TEST(ValidateTest, FillsDefaults) {
  JobSpec spec = ValidGpt();
  spec.clear_pipeline();
  spec.mutable_optimizer()->mutable_adamw()->clear_beta1();
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  EXPECT_EQ(spec.pipeline().stages(), 1);
  EXPECT_EQ(spec.pipeline().virtual_stages(), 1);
  EXPECT_EQ(spec.pipeline().microbatches(), 1);
  EXPECT_EQ(spec.pipeline().schedule(), v1::SCHEDULE_1F1B);
  EXPECT_EQ(spec.pipeline().recompute(), v1::RECOMPUTE_NONE);
  EXPECT_EQ(spec.pipeline().data_parallel(), 1);
  EXPECT_EQ(spec.pipeline().reduce_bucket_bytes(), int64_t{25} << 20);
  EXPECT_EQ(spec.pipeline().reduce_mode(), v1::REDUCE_MODE_ORDERED);
  EXPECT_EQ(spec.pipeline().collective_engine(), v1::COLLECTIVE_ENGINE_AUTO);
  const auto& adam = spec.optimizer().adamw();
  ASSERT_TRUE(adam.has_beta1() && adam.has_beta2() && adam.has_epsilon() &&
              adam.has_weight_decay());
  EXPECT_EQ(adam.beta1(), 0.9f);
  EXPECT_EQ(adam.beta2(), 0.999f);
  EXPECT_EQ(adam.epsilon(), 1e-8f);
  EXPECT_EQ(adam.weight_decay(), 0.01f);

  JobSpec mlp = ValidMlp();
  mlp.mutable_data()->mutable_synthetic()->set_teacher_width(0);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&mlp).ok());
  EXPECT_EQ(mlp.data().synthetic().teacher_width(), 32);
}

TEST(ValidateTest, KeepsExplicitValues) {
  JobSpec spec = ValidGpt();
  auto* adam = spec.mutable_optimizer()->mutable_adamw();
  adam->set_beta1(0);  // explicitly zero: not a default
  adam->set_weight_decay(0);
  spec.mutable_pipeline()->set_schedule(v1::SCHEDULE_GPIPE);
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  EXPECT_EQ(spec.optimizer().adamw().beta1(), 0.0f);
  EXPECT_EQ(spec.optimizer().adamw().weight_decay(), 0.0f);
  EXPECT_EQ(spec.optimizer().adamw().beta2(), 0.999f);
  EXPECT_EQ(spec.pipeline().schedule(), v1::SCHEDULE_GPIPE);
}

TEST(ValidateTest, Idempotent) {
  JobSpec spec = ValidGpt();
  spec.clear_pipeline();
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  JobSpec again = spec;
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&again).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, again));
}

// The validated type holds exactly what ValidateAndDefaultJobSpec makes of the spec, and
// carries its refusals unchanged.
TEST(ValidateTest, ValidatedJobSpecIsTheDefaultedSpecOrTheRefusal) {
  JobSpec spec = ValidGpt();
  spec.clear_pipeline();
  absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
  ASSERT_TRUE(valid.ok()) << valid.status();
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(valid->proto(), spec));
  EXPECT_EQ((*valid)->pipeline().stages(), 1);

  JobSpec bad = ValidGpt();
  bad.set_steps(0);
  JobSpec bad_copy = bad;
  const absl::Status direct = ValidateAndDefaultJobSpec(&bad_copy);
  absl::StatusOr<ValidatedJobSpec> refused = ValidatedJobSpec::Validate(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status(), direct);
}

TEST(ValidateTest, ChunkLimitAllowsOneBlockPerChunk) {
  JobSpec mlp = ValidMlp();  // depth 3: hidden.0..2 + out = 4 blocks
  mlp.mutable_pipeline()->set_stages(4);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&mlp).ok());
  JobSpec gpt = ValidGpt();  // layers 2: embed + 2 + head = 4 blocks
  gpt.mutable_pipeline()->set_stages(2);
  gpt.mutable_pipeline()->set_virtual_stages(2);
  gpt.mutable_pipeline()->set_schedule(v1::SCHEDULE_INTERLEAVED_1F1B);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&gpt).ok());
  EXPECT_EQ(ModelBlockCount(mlp.model()), 4);
  EXPECT_EQ(ModelBlockCount(gpt.model()), 4);
  EXPECT_EQ(ModelBlockCount(v1::ModelSpec()), 0);
}

TEST(ValidateTest, NameLimitCountsCharactersNotBytes) {
  JobSpec spec = ValidMlp();
  std::string name;
  for (int i = 0; i < kMaxJobNameChars; ++i) name += "\xc3\xa9";  // U+00E9, 2 bytes
  spec.set_name(name);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
}

TEST(ParseTest, AcceptsCamelCaseAndProtoNames) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecJson(R"({
    "steps": 3, "seed": "18446744073709551615",
    "model": {"gpt": {"vocab_size": 10, "dModel": 32}},
    "data": {"text": {"inlineText": "abc"}, "batchSize": 2},
    "pipeline": {"schedule": "SCHEDULE_ZB_H1"}
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->steps(), 3);
  EXPECT_EQ(spec->seed(), 18446744073709551615ull);
  EXPECT_EQ(spec->model().gpt().vocab_size(), 10);
  EXPECT_EQ(spec->model().gpt().d_model(), 32);
  EXPECT_EQ(spec->data().text().inline_text(), "abc");
  EXPECT_EQ(spec->data().batch_size(), 2);
  EXPECT_EQ(spec->pipeline().schedule(), v1::SCHEDULE_ZB_H1);
}

TEST(ParseTest, RefusesUnknownField) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecJson(R"({"steps": 1, "stepz": 2})");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), "stepz")) << spec.status();

  spec = ParseJobSpecJson(R"({"model": {"mlp": {"widht": 3}}})");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), "widht")) << spec.status();
}

// A client's text comes back in errors bounded and escaped: a megabyte-long unknown field
// with control and non-UTF-8 bytes, a device name with a terminal escape.
TEST(ParseTest, ErrorsQuoteTheInputBoundedAndEscaped) {
  auto expect_clean = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_LT(s.message().size(), 1024u) << s.message().substr(0, 2048);
    for (const char c : s.message()) {
      const unsigned char u = static_cast<unsigned char>(c);
      EXPECT_TRUE(u >= 0x20 && u != 0x7f) << "byte " << int{u};
    }
  };
  const std::string field = std::string(1 << 20, 'f') + "\\u001b[2J";
  absl::Status s = ParseJobSpecJson(absl::StrCat(R"({"steps": 1, ")", field, R"(": 2})")).status();
  expect_clean(s);
  EXPECT_TRUE(absl::StartsWith(s.message(), "invalid job spec JSON: ")) << s;
  JobSpec named;
  named.set_name(std::string(1 << 20, 'n') + "\x1b");
  s = ValidateAndDefaultJobSpec(&named);
  expect_clean(s);
  EXPECT_TRUE(absl::StartsWith(s.message(), "name: ")) << s;
  Device device;
  int index = 0;
  s = ParseDeviceName("cuda\x1b[2J\xff", &device, &index);
  expect_clean(s);
  EXPECT_TRUE(absl::StrContains(s.message(), "device \"cuda\\x1b[2J\\xff\"")) << s;
}

TEST(ParseTest, RefusesMalformedJson) {
  for (const char* json :
       {R"({"steps": })", R"({"steps": 1)", "", "[1, 2]", "not json", R"({"steps": "many"})",
        R"({"pipeline": {"schedule": "FAST"}})", R"({"steps": 1.5})"}) {
    SCOPED_TRACE(json);
    absl::StatusOr<JobSpec> spec = ParseJobSpecJson(json);
    ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    EXPECT_TRUE(absl::StartsWith(spec.status().message(), "invalid job spec JSON: "));
    // One line: the parser's description, not the input and a caret line under it.
    EXPECT_FALSE(absl::StrContains(spec.status().message(), "\\n")) << spec.status();
    EXPECT_FALSE(absl::StrContains(spec.status().message(), "^")) << spec.status();
  }
}

TEST(LoadTest, MissingFileIsNotFound) {
  const std::string path = testing::TempDir() + "/no-such-spec.json";
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kNotFound) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), path)) << spec.status();
}

TEST(LoadTest, ParseErrorNamesThePath) {
  const std::string path = testing::TempDir() + "/bad-spec.json";
  {
    std::ofstream out(path);
    out << R"({"steps": 1, "colour": "blue"})";
  }
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), path)) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), "colour")) << spec.status();
}

// Loads an example, validates it, and checks it survives JSON -> proto -> JSON -> proto.
JobSpec LoadExample(const std::string& name) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(ExamplePath(name));
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return JobSpec();
  const absl::Status valid = ValidateAndDefaultJobSpec(&*spec);
  EXPECT_TRUE(valid.ok()) << name << ": " << valid;

  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(*spec, &json).ok());
  absl::StatusOr<JobSpec> again = ParseJobSpecJson(json);
  EXPECT_TRUE(again.ok()) << again.status();
  if (again.ok()) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << json;
  }
  return *spec;
}

TEST(ValidateTest, SizesThatWouldExhaustAWorkerAreRefusedWithTheEstimate) {
  // A width whose weights alone need terabytes.
  JobSpec wide = ValidMlp();
  wide.mutable_model()->mutable_mlp()->set_width(1 << 20);
  absl::Status s = ValidateAndDefaultJobSpec(&wide);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.mlp.width: the job needs about"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("GiB per pipeline stage"));
  // A huge batch: the activations are what does not fit.
  JobSpec batch = ValidGpt();
  batch.mutable_data()->set_batch_size(1 << 30);
  batch.mutable_pipeline()->set_microbatches(1);
  s = ValidateAndDefaultJobSpec(&batch);
  EXPECT_THAT(std::string(s.message()), HasSubstr("data.batch_size: the job needs about"));
  JobSpec wide_gpt = ValidGpt();
  wide_gpt.mutable_model()->mutable_gpt()->set_d_model(1 << 28);
  wide_gpt.mutable_model()->mutable_gpt()->set_heads(1);
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&wide_gpt).message()),
              HasSubstr("model.gpt.d_model: the job needs about"));
  // Too many blocks, too long a schedule, too much inline text.
  JobSpec deep = ValidMlp();
  deep.mutable_model()->mutable_mlp()->set_depth(kMaxModelBlocks);
  deep.mutable_model()->mutable_mlp()->set_width(1);
  deep.mutable_pipeline()->set_stages(1);
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&deep).message()),
              HasSubstr("model.mlp.depth: 1048577 blocks, more than the 1048576 allowed"));
  // The clock: per rank (2^22 micro-batches once grew the coordinator by 700 MiB while it
  // placed the job), and in all.
  JobSpec many = ValidMlp();
  many.mutable_data()->set_batch_size(1 << 22);
  many.mutable_pipeline()->set_microbatches(1 << 22);
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&many).message()),
              HasSubstr("pipeline.microbatches: virtual_stages * microbatches = 1 * 4194304 makes "
                        "a clock of about 16777216 actions per rank, more than the 262144"));
  JobSpec most = ValidMlp();  // at the bound per rank
  most.mutable_data()->set_batch_size(1 << 16);
  most.mutable_pipeline()->set_microbatches(1 << 16);
  most.mutable_pipeline()->set_stages(1);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&most).ok());
  JobSpec broad = ValidMlp();  // every rank under the bound, too many in all
  broad.mutable_model()->mutable_mlp()->set_depth(127);
  broad.mutable_data()->set_batch_size(1 << 15);
  broad.mutable_pipeline()->set_microbatches(1 << 14);
  broad.mutable_pipeline()->set_stages(64);
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&broad).message()),
              HasSubstr("pipeline.microbatches: stages * virtual_stages * microbatches"));
  JobSpec text = ValidGpt();
  text.mutable_data()->mutable_text()->set_inline_text(std::string(kMaxInlineTextBytes + 1, 'a'));
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&text).message()),
              HasSubstr("data.text.inline_text: 16777217 bytes, more than the 16 MiB"));
  JobSpec stages = ValidMlp();
  stages.mutable_pipeline()->set_stages(kMaxStages + 1);
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&stages).message()),
              HasSubstr("pipeline.stages: 1025 is more than the 1024 allowed"));
  JobSpec chunky = ValidMlp();
  chunky.mutable_model()->mutable_mlp()->set_depth(1 << 19);
  chunky.mutable_model()->mutable_mlp()->set_width(1);
  chunky.mutable_pipeline()->set_stages(64);
  EXPECT_THAT(std::string(ValidateAndDefaultJobSpec(&chunky).message()),
              HasSubstr("pipeline.stages: stages * virtual_stages * model blocks"));
  // The examples are far below every bound.
  JobSpec ok = ValidGpt();
  ASSERT_TRUE(ValidateAndDefaultJobSpec(&ok).ok());
  EXPECT_LT(EstimateJobBytes(ok).per_stage_bytes, 1e9);
}

TEST(ExamplesTest, MlpTiny) {
  const JobSpec spec = LoadExample("mlp-tiny.json");
  ASSERT_TRUE(spec.model().has_mlp());
  EXPECT_EQ(spec.model().mlp().input_dim(), 8);
  EXPECT_EQ(spec.model().mlp().width(), 32);
  EXPECT_EQ(spec.model().mlp().depth(), 4);
  EXPECT_EQ(spec.model().mlp().output_dim(), 4);
  ASSERT_TRUE(spec.data().has_synthetic());
  EXPECT_EQ(spec.data().synthetic().teacher_width(), 16);
  EXPECT_EQ(spec.data().synthetic().noise(), 0.0f);
  EXPECT_EQ(spec.data().batch_size(), 32);
  EXPECT_EQ(spec.pipeline().stages(), 1);
  EXPECT_EQ(spec.pipeline().microbatches(), 4);
  EXPECT_EQ(spec.pipeline().schedule(), v1::SCHEDULE_1F1B);
  ASSERT_TRUE(spec.optimizer().has_sgd());
  EXPECT_EQ(spec.optimizer().sgd().learning_rate(), 0.05f);
  EXPECT_EQ(spec.optimizer().sgd().momentum(), 0.9f);
  EXPECT_EQ(spec.steps(), 200);
  EXPECT_EQ(spec.seed(), 1u);
}

TEST(ExamplesTest, Gpt2SmallIsGpt2sShapeTied) {
  const JobSpec spec = LoadExample("gpt2-124m.json");
  ASSERT_TRUE(spec.model().has_gpt());
  const auto& g = spec.model().gpt();
  EXPECT_EQ(g.vocab_size(), 50257);
  EXPECT_EQ(g.context(), 1024);
  EXPECT_EQ(g.d_model(), 768);
  EXPECT_EQ(g.heads(), 12);
  EXPECT_EQ(g.layers(), 12);
  EXPECT_TRUE(TokenModelOf(spec.model())->tie_embeddings);  // unset: GPT-2's default
  // GPT-2 small's 124,439,808 parameters (transformers counts the tied projection once;
  // the estimate counts the copy the last stage holds).
  const JobBytes bytes = EstimateJobBytes(spec);
  EXPECT_EQ(bytes.parameters - 50257.0 * 768, 124439808.0);
}

TEST(ExamplesTest, LlamaTinyAndTiedGpt2Tiny) {
  const JobSpec llama = LoadExample("llama-tiny.json");
  ASSERT_TRUE(llama.model().has_llama());
  EXPECT_EQ(LlamaKvHeads(llama.model().llama()), 2);
  EXPECT_FALSE(TokenModelOf(llama.model())->tie_embeddings);
  EXPECT_EQ(ModelBlockCount(llama.model()), 6);
  const JobSpec tiny = LoadExample("gpt2-tiny-tied.json");
  EXPECT_TRUE(TokenModelOf(tiny.model())->tie_embeddings);
  EXPECT_EQ(DescribeModel(tiny.model()),
            "gpt (vocab 96, context 32, d_model 64, heads 4, layers 2, tied)");
}

// The demo's BPE job (scripts/demo.sh prepares its shards under the workers' data root).
TEST(ExamplesTest, Gpt2GplBpeTrainsOnTokenShardsAndEvaluates) {
  const JobSpec spec = LoadExample("gpt2-gpl-bpe.json");
  ASSERT_TRUE(spec.model().has_gpt());
  EXPECT_EQ(spec.model().gpt().vocab_size(), 512);
  ASSERT_TRUE(spec.data().has_tokens());
  EXPECT_EQ(spec.data().tokens().train(0), "gpl-bpe/train_*.bin");
  EXPECT_EQ(spec.data().tokens().val(0), "gpl-bpe/val_*.bin");
  EXPECT_EQ(spec.data().tokens().format(), v1::TOKEN_FORMAT_LLMC);
  EXPECT_EQ(spec.eval().every(), 50);
}

TEST(ExamplesTest, Gpt) {
  const JobSpec spec = LoadExample("gpt.json");
  EXPECT_EQ(spec.name(), "gpt-gpl3");
  ASSERT_TRUE(spec.model().has_gpt());
  EXPECT_EQ(spec.model().gpt().vocab_size(), 96);
  EXPECT_EQ(spec.model().gpt().context(), 64);
  EXPECT_EQ(spec.model().gpt().d_model(), 128);
  EXPECT_EQ(spec.model().gpt().heads(), 4);
  EXPECT_EQ(spec.model().gpt().layers(), 2);
  ASSERT_TRUE(spec.data().has_text());
  EXPECT_EQ(spec.data().text().path(), "/usr/share/common-licenses/GPL-3");
  EXPECT_EQ(spec.data().batch_size(), 32);
  EXPECT_EQ(spec.pipeline().stages(), 4);
  EXPECT_EQ(spec.pipeline().microbatches(), 4);
  ASSERT_TRUE(spec.optimizer().has_adamw());
  EXPECT_EQ(spec.optimizer().adamw().learning_rate(), 0.003f);
  EXPECT_EQ(spec.optimizer().adamw().beta2(), 0.999f);  // defaulted
  EXPECT_EQ(spec.steps(), 300);
  EXPECT_EQ(spec.seed(), 42u);
}

}  // namespace
}  // namespace baton
