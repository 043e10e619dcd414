// For tests: checkpoints of blocks of any tensors, dtypes and sizes, written by
// SnapshotBlocks and WriteSnapshot as a job's ranks write them (block files with AdamW
// state, one manifest per rank).
#ifndef BATON_COMMON_CHECKPOINT_CHECKPOINT_TESTING_H_
#define BATON_COMMON_CHECKPOINT_CHECKPOINT_TESTING_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/checkpoint/checkpoint.h"
#include "common/nn/module.h"
#include "common/optim/optimizer.h"

namespace baton::testing_checkpoint {

struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
};

struct BlockSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
  int rank = 0;  // whose manifest names it
};

// A block holding fixed tensors as its parameters; it only goes into checkpoints.
class FixedBlock final : public Module {
 public:
  FixedBlock(std::string name, std::vector<Parameter> params)
      : name_(std::move(name)), params_(std::move(params)) {}
  const std::string& name() const override { return name_; }
  absl::Status Forward(const MicroBatch&, const Tensor&, Tensor*) override {
    return absl::UnimplementedError("a FixedBlock is not run");
  }
  absl::Status BackwardInput(const MicroBatch&, const Tensor&, Tensor*) override {
    return absl::UnimplementedError("a FixedBlock is not run");
  }
  absl::Status BackwardWeight(const MicroBatch&) override {
    return absl::UnimplementedError("a FixedBlock is not run");
  }
  void CollectParameters(std::vector<Parameter*>* out) override {
    for (Parameter& p : params_) out->push_back(&p);
  }
  int InFlight() const override { return 0; }
  void Discard(int) override {}

 private:
  std::string name_;
  std::vector<Parameter> params_;
};

// Fills t's bytes with a pattern that differs from tensor to tensor (by `salt`).
inline void FillPattern(Tensor* t, uint32_t salt) {
  auto* bytes = static_cast<unsigned char*>(t->raw());
  uint32_t x = salt * 2654435761u + 1;
  for (size_t i = 0; i < t->nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    bytes[i] = static_cast<unsigned char>(x >> 24);
  }
  if (t->dtype() == DType::kFloat32) {  // finite values, so that copies compare equal
    for (int64_t i = 0; i < t->numel(); ++i) {
      t->f32()[i] = static_cast<float>(static_cast<int32_t>(salt * 7919u + i) % 2003) / 1024;
    }
  }
}

// Writes step `step` of `job_dir` (CheckpointStepDir), the blocks in the order given being
// the model's canonical order, and returns the step directory.
inline absl::StatusOr<std::string> WriteCheckpoint(const std::string& job_dir,
                                                   const std::string& job, int64_t step,
                                                   const std::vector<BlockSpec>& blocks) {
  std::vector<std::unique_ptr<FixedBlock>> modules;
  uint32_t salt = 0;
  for (const BlockSpec& b : blocks) {
    std::vector<Parameter> params;
    for (const TensorSpec& t : b.tensors) {
      Parameter p;
      p.name = t.name;
      p.value = Tensor::Empty(t.shape, t.dtype);
      FillPattern(&p.value, ++salt);
      p.grad = Tensor::Zeros(t.shape, t.dtype);
      params.push_back(std::move(p));
    }
    modules.push_back(std::make_unique<FixedBlock>(b.name, std::move(params)));
  }
  const std::string step_dir = CheckpointStepDir(job_dir, step);
  std::map<int, std::vector<int>> by_rank;
  for (size_t i = 0; i < blocks.size(); ++i) by_rank[blocks[i].rank].push_back(static_cast<int>(i));
  for (const auto& [rank, indices] : by_rank) {
    std::vector<Module*> mine;
    std::vector<Parameter*> optimized;  // AdamW state for the float32 parameters
    for (int i : indices) {
      mine.push_back(modules[static_cast<size_t>(i)].get());
      for (Parameter* p : mine.back()->Parameters()) {
        if (p->value.dtype() == DType::kFloat32) optimized.push_back(p);
      }
    }
    baton::v1::OptimizerSpec spec;
    spec.mutable_adamw()->set_learning_rate(0.001f);
    absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        MakeOptimizer(spec, optimized, /*tied_embeddings=*/false);
    if (!optimizer.ok()) return optimizer.status();
    for (const Optimizer::Slot& s : (*optimizer)->Slots()) FillPattern(s.state, ++salt);
    CheckpointWriteInfo info;
    info.job = job;
    info.rank = rank;
    info.step = step;
    info.num_blocks = static_cast<int>(blocks.size());
    info.block_indices = indices;
    absl::StatusOr<CheckpointSnapshot> snap = SnapshotBlocks(step_dir, info, mine, **optimizer);
    if (!snap.ok()) return snap.status();
    if (absl::Status st = WriteSnapshot(*snap); !st.ok()) return st;
  }
  return step_dir;
}

// Inverts one byte of the file at `path` in place: same size, other contents.
inline void FlipByte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace baton::testing_checkpoint

#endif  // BATON_COMMON_CHECKPOINT_CHECKPOINT_TESTING_H_
