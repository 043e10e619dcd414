// Job specs: loading from JSON, filling defaults, and validation.
//
// A job spec (proto/baton/v1/job.proto) is written as JSON through the standard protobuf
// JSON mapping. Loading refuses unknown fields and malformed JSON; validation then fills the
// documented defaults and refuses specs that cannot be trained, with an INVALID_ARGUMENT
// error whose message starts with the offending field's path in dotted proto form, e.g.
//   model.gpt.heads: must divide d_model (d_model=64, heads=5)
//   data.batch_size: 10 is not divisible by pipeline.microbatches=4
// so a user can find the field in their JSON file.
//
// Typical use:
//   BATON_ASSIGN_OR_RETURN(baton::v1::JobSpec spec, LoadJobSpecFile(path));
//   BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(&spec));
//
// Validation never reads files: checks that need the training text (its length, its
// distinct characters against model.gpt.vocab_size) or the token shards (headers, sizes,
// ids) happen when the dataset is built or read (common/data/dataset.h, docs/data.md).
#ifndef BATON_COMMON_SPEC_SPEC_H_
#define BATON_COMMON_SPEC_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/v1/job.pb.h"
#include "common/core/tensor.h"

namespace baton {

// Longest accepted JobSpec.name, in characters (UTF-8 code points).
inline constexpr int kMaxJobNameChars = 128;

// Bounds on what a spec may make a process allocate or compute, checked by
// ValidateAndDefaultJobSpec before anything is built:
//   * inline training text (data.text.inline_text): larger texts go in a file under the
//     data roots;
inline constexpr int64_t kMaxInlineTextBytes = int64_t{16} << 20;
//   * model blocks (mlp depth + 1, gpt layers + 2);
inline constexpr int64_t kMaxModelBlocks = int64_t{1} << 20;
//   * pipeline chunks times model blocks (the partition's table; about 4 bytes each);
inline constexpr int64_t kMaxChunkBlocks = int64_t{1} << 24;
//   * pipeline stages and virtual stages;
inline constexpr int kMaxStages = 1024;
inline constexpr int kMaxVirtualStages = 64;
//   * schedule actions (about 4 per microbatch, chunk and rank), in all and per rank: the
//     coordinator builds every rank's clock when it places a job (batonctl plan, which also
//     simulates, takes about 0.5 s and 250 MiB at these bounds), and a worker holds its own;
inline constexpr int64_t kMaxScheduleActions = int64_t{1} << 21;
inline constexpr int64_t kMaxActionsPerRank = int64_t{1} << 18;
//   * memory per pipeline stage, estimated by EstimateJobBytes (a worker holds one stage).
inline constexpr int64_t kMaxStageBytes = int64_t{256} << 30;
//   * data-parallel replicas of the pipeline.
inline constexpr int32_t kMaxDataParallel = 1024;
//   * validation batches per evaluation (eval.batches): an evaluation runs them forward
//     between two training steps, so one evaluation may cost at most about as much as this
//     many training steps' forwards (nanoGPT evaluates 200, llm.c 20).
inline constexpr int32_t kMaxEvalBatches = 10000;

// A rough upper estimate of the memory a job needs: parameters with their gradients and
// optimizer state (16 bytes per parameter), and the activations of one batch kept for the
// backward pass (4 bytes per float). Computed in floating point, so no field can overflow
// it. The spec's model must be set; other fields may be anything.
struct JobBytes {
  double parameters = 0;   // number of parameters
  double state_bytes = 0;  // parameters * 16
  double activation_bytes = 0;
  double per_stage_bytes = 0;  // (state + activations) / pipeline.stages
};
JobBytes EstimateJobBytes(const baton::v1::JobSpec& spec);

// Parses a JobSpec from JSON (protobuf JSON mapping: lowerCamelCase or proto field names,
// enums by name). Unknown fields and malformed JSON give INVALID_ARGUMENT carrying
// protobuf's parser message, which names the field or position. Does not validate or fill
// defaults.
absl::StatusOr<baton::v1::JobSpec> ParseJobSpecJson(const std::string& json);

// Reads the file at `path` and parses it as ParseJobSpecJson does. A missing file gives
// NOT_FOUND, other read failures the matching errno code; every error names the path.
absl::StatusOr<baton::v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Fills defaults in place, then validates. Defaults (applied only where the field is
// zero/unset):
//   pipeline.stages 1, pipeline.virtual_stages 1, pipeline.microbatches 1,
//   pipeline.schedule SCHEDULE_1F1B, pipeline.recompute RECOMPUTE_NONE,
//   pipeline.data_parallel 1, pipeline.reduce_bucket_bytes 25 MiB,
//   pipeline.reduce_mode REDUCE_MODE_ORDERED, pipeline.collective_engine AUTO,
//   data.synthetic.teacher_width 32,
//   optimizer.adamw beta1 0.9, beta2 0.999, epsilon 1e-8, weight_decay 0.01.
// Refuses (INVALID_ARGUMENT, message "<field path>: <reason>") among others: a missing
// model, data source or optimizer; sizes below 1; heads not dividing d_model; a gpt or llama
// without text or token data, token data without a token model (or without a train entry,
// or with an unknown format or sampling), eval without data.tokens.val or with every < 1,
// an mlp without synthetic data; batch_size not divisible by microbatches;
// steps below 1; a learning rate not > 0; momentum/betas outside [0, 1); epsilon not > 0;
// negative weight decay or noise; non-finite floats; a name over kMaxJobNameChars; more
// pipeline chunks (stages * virtual_stages) than the model has blocks; anything past the
// bounds above (the message gives the estimate and the bound). Idempotent: a spec
// that passed once passes again unchanged. On error `spec` may have been partly defaulted.
absl::Status ValidateAndDefaultJobSpec(baton::v1::JobSpec* spec);

// A command line's word for JobSpec.attention: "materialised", "fused", "tiled" or "auto"
// (unspecified). Anything else: INVALID_ARGUMENT naming the words.
absl::StatusOr<baton::v1::AttentionKernel> ParseAttentionKernel(absl::string_view word);

// A job spec that passed ValidateAndDefaultJobSpec, checked and defaulted. Only Validate
// makes one, so what takes one (MakeDataset, StageExecutor::Create) does not check again:
// a process validates a spec once on its way in and passes this along.
class ValidatedJobSpec {
 public:
  static absl::StatusOr<ValidatedJobSpec> Validate(baton::v1::JobSpec spec);

  const baton::v1::JobSpec& proto() const { return spec_; }
  const baton::v1::JobSpec& operator*() const { return spec_; }
  const baton::v1::JobSpec* operator->() const { return &spec_; }

 private:
  explicit ValidatedJobSpec(baton::v1::JobSpec spec) : spec_(std::move(spec)) {}
  baton::v1::JobSpec spec_;
};

// FAILED_PRECONDITION when pipeline.schedule is still SCHEDULE_AUTO: what trains a spec
// needs the auto-planner's choice written into it first (ResolveAutoPipeline, planner.h;
// the coordinator and `batonctl train-local` do that).
absl::Status RequireChosenSchedule(const baton::v1::JobSpec& spec);

// The device a process computes a job on when it decides alone (the reference trainer,
// an in-process pipeline): JobSpec.device, with "auto" meaning CUDA when this process sees
// a CUDA device and the CPU otherwise. FAILED_PRECONDITION when the spec asks for CUDA and
// this build or machine has none.
absl::StatusOr<Device> LocalDeviceFor(const baton::v1::JobSpec& spec);

// Parses a device name as the command lines take it: "cpu", "cuda" (device 0) or
// "cuda:N". INVALID_ARGUMENT naming the text otherwise. `index` is 0 for the CPU.
absl::Status ParseDeviceName(absl::string_view text, Device* device, int* index);

// "cpu", or "cuda:N (name)" for the current CUDA device (cuda_context.h).
std::string DescribeDevice(Device device);

// What the token models (gpt and llama) share, with their defaults applied. Both are
// blocks embed, block.0 .. block.{layers-1}, head, and train on token sequences.
struct TokenModel {
  const char* prefix = "";  // their spec fields: "model.gpt" or "model.llama"
  int64_t vocab_size = 0;
  int64_t context = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t layers = 0;
  // The output projection is the token embedding (gpt: unless tie_embeddings is false;
  // llama: when tie_embeddings is true).
  bool tie_embeddings = false;
};
// The token model of `model`; nullopt for an mlp or no architecture.
std::optional<TokenModel> TokenModelOf(const baton::v1::ModelSpec& model);

// One line naming the model and its shape: "gpt (vocab 65, context 64, d_model 64, heads 4,
// layers 4, tied)", "llama (...)", "mlp (input 8, width 32, depth 4, output 1)".
std::string DescribeModel(const baton::v1::ModelSpec& model);

// The defaults of a LlamaSpec's optional fields.
int64_t LlamaKvHeads(const baton::v1::LlamaSpec& s);  // kv_heads, or heads when 0
float LlamaRopeTheta(const baton::v1::LlamaSpec& s);  // rope_theta, or 10000 when 0
float LlamaRmsNormEps(const baton::v1::LlamaSpec& s);  // rms_norm_eps, or 1e-5 when 0

// Number of pipeline-partitionable blocks of the spec's model (see job.proto): mlp depth + 1
// (hidden.0 .. hidden.{depth-1}, out); gpt and llama layers + 2 (embed, block.*, head); 0
// when no architecture is set.
int64_t ModelBlockCount(const baton::v1::ModelSpec& model);

// Sets pipeline.stages to `stages` (a recovery onto fewer); a pipeline.partition written for
// another stage count is dropped, so the new count runs the balanced split.
void SetPipelineStages(baton::v1::JobSpec* spec, int stages);

// pipeline.partition's rules for a split of `num_blocks` blocks into `num_chunks` chunks:
// exactly num_chunks entries, each at least 1, adding up to num_blocks. INVALID_ARGUMENT
// naming pipeline.partition (and the entry) otherwise.
absl::Status CheckPartitionSizes(const std::vector<int>& sizes, int num_chunks,
                                 int64_t num_blocks);

// Tokens in one training step, the one rule every report uses: a token model's sequences
// times its context; an mlp row counts as one token (so tokens equal samples).
int64_t TokensPerStep(const baton::v1::JobSpec& spec);

}  // namespace baton

#endif  // BATON_COMMON_SPEC_SPEC_H_
