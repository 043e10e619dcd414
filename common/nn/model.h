// Models as flat lists of partitionable blocks.
//
// A model is an ordered list of blocks; a pipeline stage owns a contiguous range of them.
// The canonical block order (the digest order) is:
//   mlp: hidden.0 .. hidden.{depth-1}, out        (Linear+GELU blocks; Linear + MSE)
//   gpt: embed, block.0 .. block.{layers-1}, head (embedding; transformer blocks; LN +
//        LM head + softmax cross-entropy)
// Every parameter is initialised from (seed, its fully qualified name), so building a
// block on any worker gives the same bits as building the whole model in one process.
//
// The first block takes the data input (token ids or features); the last block takes the
// micro-batch's targets and returns the 1-element mean loss.
#ifndef BATON_COMMON_NN_MODEL_H_
#define BATON_COMMON_NN_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "baton/v1/job.pb.h"
#include "common/core/digest.h"
#include "common/nn/module.h"

namespace baton {

// What a block costs, for partitioning and reporting.
struct BlockInfo {
  std::string name;
  int64_t parameters = 0;        // number of float32 parameters
  int64_t forward_flops = 0;     // per sample (per sequence for gpt), multiply-add = 2
  // Per sample: the elements the block keeps from its forward until its backward (its
  // input included, its output not: the next block keeps that), the activation memory one
  // micro-batch in flight holds: all float32 in fp32 jobs. Exact for this implementation's
  // layers; model_test measures both precisions against the allocator.
  int64_t activation_floats = 0;
  // Of those, the ones a bf16 job keeps as bf16 bits, 2 bytes each (the rounded
  // activations and product operands); the rest (pre-activations, attention probabilities,
  // normalisation statistics, token ids) stay 4 bytes.
  int64_t activation_bf16 = 0;
  // Of `parameters`, the ones read only as bf16 product operands in bf16 jobs (the Linear
  // weights: Parameter::bf16_operand), which a sharded optimizer's non-owners keep as bf16.
  int64_t operand_parameters = 0;
  // The largest single parameter (floats): a data-parallel reduction bucket of its own when
  // it is larger than the job's bucket size (GradReducer).
  int64_t largest_parameter = 0;
};

// The bytes one sample of `block` keeps from its forward until its backward, in a bf16 job
// or an fp32 one.
int64_t ActivationBytes(const BlockInfo& block, bool bf16);

// The model FLOPs of training blocks [first, last) on `samples` samples: forward,
// backward-input and backward-weight, counted as 3 x their forward_flops x samples (the
// numerator of MFU). Recomputation is not counted: MFU counts the model's work, not the
// work done.
double TrainingFlops(const std::vector<BlockInfo>& blocks, int first, int last, double samples);

// What a job changes of its blocks' activation memory beyond the architecture: with the
// fused or tiled attention kernels a transformer block keeps one logsumexp per query row and
// head (H T floats per sequence) instead of the H T^2 probabilities, and in bf16 also the
// core's float32 output (T C floats) beside the output projection's bf16 copy of it (in
// fp32 the projection keeps that tensor itself). kTiled in an fp32 job is materialised.
struct BlockCostOptions {
  AttentionKernel attention = AttentionKernel::kMaterialised;
  bool bf16 = false;
};

// The blocks of a (validated) model spec, in canonical order.
std::vector<BlockInfo> DescribeBlocks(const baton::v1::ModelSpec& spec,
                                      const BlockCostOptions& options = {});

// The shape of the float32 activation entering block `block` (1 <= block < blocks; block 0
// takes the data) for a micro-batch of `rows` samples, which is also the shape of the
// gradient block `block` - 1 receives back: mlp [rows, width]; gpt [rows, context,
// d_model]. What a pipeline receives between stages is checked against it.
Shape BlockInputShape(const baton::v1::ModelSpec& spec, int block, int64_t rows);

// Modules run one after another: forward in order, backward in reverse.
class Sequential final : public Module {
 public:
  Sequential(std::string name, std::vector<std::unique_ptr<Module>> modules);
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) override;
  absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) override;
  absl::Status BackwardWeight(const MicroBatch& mb) override;
  void CollectParameters(std::vector<Parameter*>* out) override;
  int InFlight() const override;
  void Discard(int mb) override;

  int size() const { return static_cast<int>(modules_.size()); }
  Module& at(int i) { return *modules_[i]; }

 private:
  absl::Status ForwardSteps(const MicroBatch& mb, const Tensor& x, Tensor* y);
  const std::string name_;
  std::vector<std::unique_ptr<Module>> modules_;
};

// Builds blocks [first, last) of the model (all of them by default) on `device`. The spec
// must have been validated (common/spec); an out-of-range block range is INVALID_ARGUMENT,
// a device without a backend here UNAVAILABLE, a device too small for the parameters
// RESOURCE_EXHAUSTED naming the parameter and its bytes.
absl::StatusOr<std::unique_ptr<Sequential>> BuildBlocks(const baton::v1::ModelSpec& spec,
                                                        uint64_t seed, int first = 0, int last = -1,
                                                        Device device = Device::kCpu);

// SHA-256 over the block's parameters (see common/core/digest.h for the scheme), read
// back to the host when they live on a device.
Digest BlockDigest(Module& block);
// Per-block digests of a model built by BuildBlocks, in block order.
std::vector<Digest> BlockDigests(Sequential& blocks);

// Tied embeddings (TokenModel::tie_embeddings): block 0's token embedding and the last
// block's output projection hold the same tensor, each its own copy. Every step the two
// gradients are summed, embedding's + projection's (addition of two floats is exact in
// either order, so both ends get the same bits), and both copies take the same update; the
// reference trainer does it before its optimizer step, a pipeline in the clock's TIE_GRAD.
inline constexpr char kTiedEmbeddingName[] = "embed.token";
inline constexpr char kTiedOutputName[] = "head.logits.weight";
// The parameter of `block` named `name`, or null.
Parameter* FindParameter(Module& block, const std::string& name);
// embedding.grad = output.grad = embedding.grad + output.grad, with `backend` (both on its
// device, same shape).
void SumTiedGradients(Parameter& embedding, Parameter& output, Backend& backend);

// The arithmetic a job's blocks compute in (JobSpec.precision; unspecified is fp32).
Precision PrecisionOf(const baton::v1::JobSpec& spec);
// Whether a job's products on a GPU use TF32 tensor cores (Backend::SetAllowTf32): when the
// spec allows it for fp32, and always in bf16, whose product operands TF32 holds exactly.
bool UsesTf32(const baton::v1::JobSpec& spec);
// The attention kernels a job's blocks take (JobSpec.attention, Backend::SetAttentionKernel;
// unspecified: the process's BATON_FUSED_ATTENTION, DefaultAttentionKernel).
AttentionKernel AttentionKernelOf(const baton::v1::JobSpec& spec);

// Zeroes every parameter's gradient.
void ZeroGrad(const std::vector<Parameter*>& params);

}  // namespace baton

#endif  // BATON_COMMON_NN_MODEL_H_
