// Modules: layers and blocks with explicit forward and backward, no autograd tape.
//
// Forward stashes what backward needs under the micro-batch index; backward is split into
//   BackwardInput  (dL/dx from dL/dy: what the previous stage waits for), and
//   BackwardWeight (dL/dW accumulated into each Parameter's grad),
// which zero-bubble schedules run at different times. A plain backward is the two in
// sequence (Backward below). After BackwardWeight the module holds nothing for that
// micro-batch.
//
// Call order per micro-batch: Forward, BackwardInput, BackwardWeight; any number of
// micro-batches may be in flight at once and interleave freely. Gradients accumulate in
// the order BackwardWeight is called; the reference trainer calls it in micro-batch order,
// and so must any schedule whose weights are to match it bit for bit.
//
// Thread safety: a module is used by one thread at a time (its pipeline stage).
#ifndef BATON_COMMON_NN_MODULE_H_
#define BATON_COMMON_NN_MODULE_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/step_loss.h"
#include "common/core/tensor.h"

namespace baton {

// A trainable tensor and its gradient accumulator (same shape and device).
struct Parameter {
  std::string name;  // fully qualified, e.g. "block.3.attn.qkv.weight"; seeds its init
  Tensor value;
  Tensor grad;
  // Why value or grad is undefined (their device was out of memory); OK otherwise.
  absl::Status init_status;
  // In a bf16 job `value` is read only as a product operand, rounded to bf16 (a Linear's
  // weight): a holder that does not update it (a sharded optimizer's other replicas) may
  // keep `value` as those bf16 bits alone (DType::kBFloat16), half the bytes, and the
  // module computes the same.
  bool bf16_operand = false;
};

// The arithmetic of a job (JobSpec.precision; docs/precision.md).
//  kFp32: every tensor float32.
//  kBf16: mixed precision. Tensors stay float32 in memory, but these hold bf16 values
//    (rounded to nearest even, common/core/bf16.h): the operands of every Linear's matrix
//    products (its input, its weight, its output gradient), every Linear's output but the
//    logits, and what crosses a block boundary (block outputs and input gradients: the
//    tensors between stages, sent as bf16). Products accumulate in float32; parameters,
//    gradients, optimizer state, norms, softmax and the loss stay float32. The rounding
//    points are fixed, so a pipeline and the reference trainer round the same values.
enum class Precision : uint8_t { kFp32 = 0, kBf16 = 1 };

// What a module sees of the micro-batch it is processing.
struct MicroBatch {
  int index = 0;                    // 0 .. M-1 within the step; the stash key
  const Tensor* targets = nullptr;  // for loss modules: int32 [b,T] tokens or f32 [b,out]
  Precision precision = Precision::kFp32;
  bool bf16() const { return precision == Precision::kBf16; }
};

class Module {
 public:
  virtual ~Module() = default;

  // The fully qualified name ("block.3.attn"); prefixes parameter names and errors.
  virtual const std::string& name() const = 0;

  // y = f(x). Stashes what backward needs under mb.index. A loss module writes the mean
  // loss of the micro-batch as a 1-element float32 tensor, which may be on its device:
  // callers read it with LossValue, once the step's work is issued (reading it right away
  // would make the host wait for the device on every micro-batch).
  virtual absl::Status Forward(const MicroBatch& mb, const Tensor& x, Tensor* y) = 0;
  // dx = dL/dx given dy = dL/dy (for a loss module, dy is the 1-element loss scale, 1/M in
  // training). Keeps what BackwardWeight needs. A module whose input is data (token ids)
  // leaves dx undefined.
  virtual absl::Status BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx) = 0;
  // Accumulates dL/dW into every parameter's grad and releases the micro-batch's stash.
  virtual absl::Status BackwardWeight(const MicroBatch& mb) = 0;
  // Appends this module's parameters in their canonical (digest) order.
  virtual void CollectParameters(std::vector<Parameter*>* out) = 0;

  absl::Status Backward(const MicroBatch& mb, const Tensor& dy, Tensor* dx) {
    absl::Status s = BackwardInput(mb, dy, dx);
    if (!s.ok()) return s;
    return BackwardWeight(mb);
  }
  std::vector<Parameter*> Parameters() {
    std::vector<Parameter*> out;
    CollectParameters(&out);
    return out;
  }
  // Micro-batches whose stash this module still holds (forward ran, weight grad not yet).
  virtual int InFlight() const = 0;
  // Drops whatever the module holds for micro-batch `mb` (a no-op if nothing). Used when a
  // step is abandoned. Forward guarantees the same on error: a forward that fails, for any
  // reason, leaves nothing stashed for that micro-batch, so it may be run again.
  virtual void Discard(int mb) = 0;
};

// Per-micro-batch saved state of one module, with errors that name the module when a
// schedule asks for a micro-batch it never ran forward for.
template <typename T>
class Stash {
 public:
  explicit Stash(std::string owner) : owner_(std::move(owner)) {}

  absl::Status Put(int mb, T value) {
    auto [it, inserted] = map_.try_emplace(mb, std::move(value));
    if (!inserted) {
      map_.erase(it);  // the contract: a failed forward leaves nothing for `mb`
      return absl::FailedPreconditionError(
          absl::StrCat(owner_, ": forward ran twice for micro-batch ", mb));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<T*> Get(int mb, const char* phase) {
    auto it = map_.find(mb);
    if (it == map_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          owner_, ": ", phase, " for micro-batch ", mb, " which has no stashed forward"));
    }
    return &it->second;
  }
  void Erase(int mb) { map_.erase(mb); }
  int size() const { return static_cast<int>(map_.size()); }
  const std::string& owner() const { return owner_; }

 private:
  std::string owner_;
  // Not absl::flat_hash_map: Abseil's tables are left inconsistent when growing them runs
  // out of memory (their capacity changes before the allocation), and a worker that fails a
  // job on std::bad_alloc destroys this map on its way out (worker/job_run.cc).
  std::unordered_map<int, T> map_;
};

// Creates a parameter of `shape` on `device` with a zeroed gradient; `init` fills the
// value. Initial values are a pure function of (seed, name) (common/core/rng.h), drawn on
// the host and copied, so every device starts from the same bits. When the device is out
// of memory the value or the gradient is left undefined: BuildBlocks reports it
// (CheckParameters), so building a model never aborts. `init_name`, when not empty, is the
// name whose draw fills the value instead of the parameter's own: a tied output projection
// starts as the same bits as the embedding it copies.
enum class Init { kZeros, kOnes, kNormal };
Parameter MakeParameter(std::string name, const Shape& shape, Init init, float stddev,
                        uint64_t seed, Device device = Device::kCpu,
                        const std::string& init_name = "");

// RESOURCE_EXHAUSTED naming the first parameter whose value or gradient could not be
// allocated, with its bytes and device; OK when all were.
absl::Status CheckParameters(const std::vector<Parameter*>& params);

// The backend modules on `device` compute with. Callers check BackendFor(device) first
// (BuildBlocks does); a device without a backend here is a programming error and aborts.
Backend* BackendOrDie(Device device);

// In bf16 (mb.bf16()), rounds the values of `t` to bf16 in place; nothing in fp32. `t` must
// be the caller's own tensor (not an input it shares with others).
void RoundIfBf16(const MicroBatch& mb, Backend* be, Tensor* t);
// C[m,n] = op(A)[m,k] op(B)[k,n] + beta C, row-major and packed (leading dimensions the
// stored widths): the backend's Gemm when A and B are float32, its GemmBf16 when both are
// bf16 bits (PackIfBf16). A and B must be of one dtype (a programming error otherwise).
void Product(Backend* be, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             const Tensor& a, const Tensor& b, float beta, float* c);
// Product with the leading dimensions given (rows lda, ldb and ldc elements apart).
void ProductLd(Backend* be, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb, float beta, float* c,
               int64_t ldc);
// What a module keeps of a tensor until its backward, when that tensor holds bf16 values in
// bf16 jobs (a product operand, a rounded activation or gradient): in bf16 its bf16 bits,
// half the memory and exact; in fp32 `t` itself. A tensor that were not bf16-valued would
// be rounded: callers keep only tensors rounded where they were made (RoundIfBf16, or
// received in bf16), which the bf16 digests of the model tests guard. A product's operands
// are packed to be multiplied (Product): there the rounding is the point.
absl::StatusOr<Tensor> PackIfBf16(const std::string& who, const MicroBatch& mb, Backend* be,
                                  const Tensor& t);
// A kept tensor as float32 for a kernel: a packed one unpacked into a new tensor, an fp32
// one as it is.
absl::StatusOr<Tensor> Unpacked(const std::string& who, Backend* be, const Tensor& t);

// The value of a loss module's output (Module::Forward), on any device: a device's is copied
// over, which waits for the work that made it. INVALID_ARGUMENT when `loss` is not a
// 1-element float32 tensor.
absl::StatusOr<float> LossValue(const Tensor& loss);
// Adds loss modules' outputs to `into` in order (LossValue: on a device, the first waits
// for the work issued, so callers keep a step's losses and add them once, at its end).
absl::Status AddLosses(const std::vector<Tensor>& losses, StepLoss* into);

// An uninitialised tensor for module `who` on `device`. RESOURCE_EXHAUSTED names the
// module, the bytes and the device when the device is out of memory.
absl::StatusOr<Tensor> NewTensor(const std::string& who, const Shape& shape, Device device,
                                 DType dtype = DType::kFloat32);

}  // namespace baton

#endif  // BATON_COMMON_NN_MODULE_H_
