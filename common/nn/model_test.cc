// Independent checks of whole models built by BuildBlocks (model.h): gradients through every
// block to the loss against central finite differences (method: grad_check_test_util.h), the Module
// contract over whole models, per-block initialisation, DescribeBlocks, and allocation
// reuse.
#include "common/nn/model.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/nn/grad_check_test_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::testing::BitEqual;
using ::baton::testing::CheckModuleGradients;
using ::baton::testing::ExpectError;
using ::baton::testing::ModuleCase;
using ::baton::testing::PerturbParameters;
using ::baton::testing::RandomIds;
using ::baton::testing::RandomTensor;
using ::baton::testing::ScalarTensor;
using ::baton::testing::Tolerance;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kFailedPrecondition = absl::StatusCode::kFailedPrecondition;

baton::v1::ModelSpec MlpSpec() {
  baton::v1::ModelSpec spec;
  auto* m = spec.mutable_mlp();
  m->set_input_dim(3);
  m->set_width(5);
  m->set_depth(2);
  m->set_output_dim(2);
  return spec;
}

baton::v1::ModelSpec GptSpec(int vocab = 7, int context = 5, int d_model = 8, int heads = 2,
                             int layers = 2) {
  baton::v1::ModelSpec spec;
  auto* g = spec.mutable_gpt();
  g->set_vocab_size(vocab);
  g->set_context(context);
  g->set_d_model(d_model);
  g->set_heads(heads);
  g->set_layers(layers);
  return spec;
}

std::unique_ptr<Sequential> Build(const baton::v1::ModelSpec& spec, uint64_t seed, int first = 0,
                                  int last = -1) {
  absl::StatusOr<std::unique_ptr<Sequential>> m = BuildBlocks(spec, seed, first, last);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

// One micro-batch of data for each model: features [4, 3] with targets [4, 2], or token
// ids [2, 5] with next-token targets [2, 5].
struct Data {
  Tensor x, targets;
};
Data MlpData(int mb) {
  return {RandomTensor({4, 3}, 50, absl::StrCat("x", mb)),
          RandomTensor({4, 2}, 50, absl::StrCat("y", mb))};
}
Data GptData(int mb) {
  return {RandomIds({2, 5}, 7, 51, absl::StrCat("x", mb)),
          RandomIds({2, 5}, 7, 51, absl::StrCat("y", mb))};
}

// ------------------------------------------------------------------ gradient checks

// Whole-model tolerance. L is the model's float32 mean loss (|L| ~ 1-2), computed through
// every block in float32. Two error sources pull h in opposite directions:
//  - truncation h^2/6 |f'''|: through LayerNorms of rows with small variance (the
//    embedding output), f''' is large; at h = 1e-2 it reaches 2.4e-4 on embed.token;
//  - rounding: L moves by ~1e-7 per evaluation, i.e. ~1e-7/h in the quotient (1.2e-4
//    observed at h = 1e-3).
// h = 3e-3 balances them: observed worst |error| 4e-5 (mlp and gpt), at most 11% of the
// bound atol = 3e-4, rtol = 1e-2 (a 9x margin). Gradients are O(0.01-1), so a wrong term
// anywhere in the chain still fails (every mutation of backward math tried failed it).
constexpr double kH = 3e-3;
constexpr Tolerance kModelTol{3e-4, 1e-2};

TEST(ModelGradTest, MlpMatchesFiniteDifferencesThroughAllBlocks) {
  std::unique_ptr<Sequential> model = Build(MlpSpec(), 7);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->size(), 3);
  PerturbParameters(*model, 60, 0.2f);  // non-zero biases
  const Data d = MlpData(0);
  // The first block's input is data: no dx. Every parameter element is checked.
  CheckModuleGradients(*model, d.x, &d.targets, 61, kH, kModelTol, /*check_dx=*/false);
}

TEST(ModelGradTest, GptMatchesFiniteDifferencesThroughAllBlocks) {
  std::unique_ptr<Sequential> model = Build(GptSpec(), 7);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->size(), 4);
  // GPT-2 init (std 0.02) makes most gradients ~1e-4: perturb so that every path carries an
  // O(0.01-1) gradient the check can see.
  PerturbParameters(*model, 62, 0.2f);
  const Data d = GptData(0);
  // Every parameter tensor has at most 256 elements: all ~1,900 elements are checked.
  CheckModuleGradients(*model, d.x, &d.targets, 63, kH, kModelTol, /*check_dx=*/false);
}

// ------------------------------------------------------------------ module contract

ModuleCase ModelCase(const std::string& label, const baton::v1::ModelSpec& spec,
                     Data (*data)(int), const std::string& error_names) {
  ModuleCase c;
  c.label = label;
  c.make = [spec] {
    std::unique_ptr<Module> m = Build(spec, 9);
    PerturbParameters(*m, 9, 0.2f);
    return m;
  };
  for (int mb = 0; mb < 2; ++mb) {
    Data d = data(mb);
    c.inputs.push_back(d.x);
    c.targets.push_back(d.targets);
  }
  c.is_loss = true;
  c.error_names = error_names;
  return c;
}

TEST(ModelContractTest, SplitAndInterleavedBackwardAreBitIdentical) {
  testing::CheckScheduleInvariance(ModelCase("mlp", MlpSpec(), MlpData, "out"));
  testing::CheckScheduleInvariance(ModelCase("gpt", GptSpec(), GptData, "head"));
}

TEST(ModelContractTest, StashMisuseIsFailedPreconditionNamingTheBlock) {
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const baton::v1::ModelSpec spec = gpt ? GptSpec() : MlpSpec();
    const Data d = gpt ? GptData(0) : MlpData(0);
    // The last block sees a backward first; the first block sees a forward first.
    const std::string last = gpt ? "head" : "out";
    const std::string first = gpt ? "embed" : "hidden.0";
    std::unique_ptr<Sequential> m = Build(spec, 1);
    Tensor y, dx;
    ExpectError(m->BackwardInput({0, &d.targets}, ScalarTensor(1.0f), &dx), kFailedPrecondition,
                last, "backward without forward");
    ExpectError(m->BackwardWeight({0, &d.targets}), kFailedPrecondition, last,
                "weight gradient without forward");
    ASSERT_TRUE(m->Forward({0, &d.targets}, d.x, &y).ok());
    ExpectError(m->BackwardWeight({0, &d.targets}), kFailedPrecondition, last,
                "weight gradient before input gradient");
    ExpectError(m->Forward({0, &d.targets}, d.x, &y), kFailedPrecondition, first,
                "forward twice");
    // A refused forward leaves nothing for the micro-batch (module.h), so run it afresh.
    EXPECT_EQ(m->InFlight(), 0);
    ASSERT_TRUE(m->Forward({0, &d.targets}, d.x, &y).ok());
    ASSERT_TRUE(m->BackwardInput({0, &d.targets}, ScalarTensor(1.0f), &dx).ok());
    ASSERT_TRUE(m->BackwardWeight({0, &d.targets}).ok());
    EXPECT_EQ(m->InFlight(), 0);
  }
}

TEST(ModelTest, RefusesBadDataNamingTheBlock) {
  std::unique_ptr<Sequential> gpt = Build(GptSpec(), 1);
  Data d = GptData(0);
  Tensor y;
  d.x.i32()[3] = 7;  // vocabulary is [0, 7)
  ExpectError(gpt->Forward({0, &d.targets}, d.x, &y), kInvalid, "embed", "token id 7");
  d = GptData(0);
  d.targets.i32()[9] = -2;
  ExpectError(gpt->Forward({0, &d.targets}, d.x, &y), kInvalid, "head", "target id -2");
  std::unique_ptr<Sequential> mlp = Build(MlpSpec(), 1);
  const Data m = MlpData(0);
  ExpectError(mlp->Forward({0, &m.targets}, RandomTensor({4, 4}, 1, "x"), &y), kInvalid,
              "hidden.0", "4 features instead of 3");
  const Tensor wrong_targets = RandomTensor({4, 3}, 1, "t");
  ExpectError(mlp->Forward({1, &wrong_targets}, m.x, &y), kInvalid, "out.mse",
              "targets of the wrong width");
}

// A forward refused part-way (here by the last block) leaves nothing stashed in the blocks
// that already ran, so the micro-batch can be run again once the data is fixed.
TEST(ModelTest, RefusedForwardLeavesNoStash) {
  std::unique_ptr<Sequential> gpt = Build(GptSpec(), 1);
  Data d = GptData(0);
  d.targets.i32()[9] = -2;
  Tensor y;
  ExpectError(gpt->Forward({0, &d.targets}, d.x, &y), kInvalid, "head", "target id -2");
  EXPECT_EQ(gpt->InFlight(), 0);
  d = GptData(0);
  ASSERT_TRUE(gpt->Forward({0, &d.targets}, d.x, &y).ok());
  EXPECT_EQ(gpt->InFlight(), 1);
  // Discard drops a micro-batch that ran forward.
  gpt->Discard(0);
  EXPECT_EQ(gpt->InFlight(), 0);
  // A repeated forward is refused and also leaves nothing behind.
  ASSERT_TRUE(gpt->Forward({1, &d.targets}, d.x, &y).ok());
  EXPECT_FALSE(gpt->Forward({1, &d.targets}, d.x, &y).ok());
  EXPECT_EQ(gpt->InFlight(), 0);
}

// A two-stage pipeline (blocks [0, k) and [k, n) built separately, activations and
// gradients handed across) computes the same loss and gradients as the whole model, bit
// for bit.
TEST(ModelTest, TwoStageSplitEqualsWholeModel) {
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const baton::v1::ModelSpec spec = gpt ? GptSpec() : MlpSpec();
    const Data d = gpt ? GptData(0) : MlpData(0);
    const int cut = 2;
    std::unique_ptr<Sequential> whole = Build(spec, 3);
    std::unique_ptr<Sequential> s0 = Build(spec, 3, 0, cut);
    std::unique_ptr<Sequential> s1 = Build(spec, 3, cut);
    const MicroBatch mb{0, &d.targets};
    Tensor loss, dx;
    ASSERT_TRUE(whole->Forward(mb, d.x, &loss).ok());
    ASSERT_TRUE(whole->Backward(mb, ScalarTensor(1.0f), &dx).ok());
    Tensor act, loss2, dact, dx2;
    ASSERT_TRUE(s0->Forward(mb, d.x, &act).ok());
    ASSERT_TRUE(s1->Forward(mb, act, &loss2).ok());
    ASSERT_TRUE(s1->Backward(mb, ScalarTensor(1.0f), &dact).ok());
    ASSERT_TRUE(s0->Backward(mb, dact, &dx2).ok());
    EXPECT_TRUE(BitEqual(loss, loss2));
    std::vector<Parameter*> pw = whole->Parameters();
    std::vector<Parameter*> ps = s0->Parameters();
    for (Parameter* p : s1->Parameters()) ps.push_back(p);
    ASSERT_EQ(pw.size(), ps.size());
    for (size_t i = 0; i < pw.size(); ++i) {
      EXPECT_EQ(pw[i]->name, ps[i]->name);
      EXPECT_TRUE(BitEqual(pw[i]->grad, ps[i]->grad)) << pw[i]->name;
    }
  }
}

// DescribeBlocks' activations are what a block really keeps between forward and backward,
// in fp32 and in bf16 (ActivationBytes): run one micro-batch forward through each block
// alone, drop everything but the block's stash, and the allocator's bytes in use grew by
// exactly that. (The auto-planner's memory model rests on it.) Shapes are multiples of 32
// elements, the allocator's 64-byte rounding for bf16 bits.
TEST(ModelTest, ActivationBytesAreWhatEachBlockKeeps) {
  for (bool bf16 : {false, true}) {
    for (bool gpt : {false, true}) {
      SCOPED_TRACE(absl::StrCat(gpt ? "gpt" : "mlp", bf16 ? " bf16" : " fp32"));
      baton::v1::ModelSpec spec;
      Data d;
      if (gpt) {
        spec = GptSpec(16, 16, 32, 2, 2);
        d = {RandomIds({2, 16}, 16, 53, "x"), RandomIds({2, 16}, 16, 53, "y")};
      } else {
        auto* m = spec.mutable_mlp();
        m->set_input_dim(16);
        m->set_width(32);
        m->set_depth(2);
        m->set_output_dim(16);
        d = {RandomTensor({4, 16}, 53, "x"), RandomTensor({4, 16}, 53, "y")};
      }
      const std::vector<BlockInfo> info = DescribeBlocks(spec);
      MicroBatch mb{0, &d.targets};
      mb.precision = bf16 ? Precision::kBf16 : Precision::kFp32;
      for (int b = 0; b < static_cast<int>(info.size()); ++b) {
        SCOPED_TRACE(info[b].name);
        std::unique_ptr<Sequential> block = Build(spec, 1, b, b + 1);
        ASSERT_NE(block, nullptr);
        const int64_t rows = d.x.dim(0);
        Allocator* alloc = CpuAllocator();
        // The block's input counts as its own (the first block's is the data); the targets
        // are the batch's, not the block's. In bf16 an activation holds bf16 values.
        Tensor x = b == 0 ? d.x : RandomTensor(BlockInputShape(spec, b, rows), 52, "act");
        if (b > 0) RoundIfBf16(mb, BackendOrDie(Device::kCpu), &x);
        const int64_t base = alloc->Stats().bytes_in_use - x.numel() * 4;
        Tensor y;
        ASSERT_TRUE(block->Forward(mb, x, &y).ok());
        x = Tensor();
        y = Tensor();
        // In bf16 the MLP's first block keeps a bf16 copy of its float input, the data,
        // which stays the batch's (in fp32 the block keeps the data tensor itself).
        const int64_t data = b == 0 && bf16 && !gpt ? d.x.numel() * 4 : 0;
        const int64_t held = alloc->Stats().bytes_in_use - base - data;
        EXPECT_EQ(held, rows * ActivationBytes(info[b], bf16));
        if (!bf16) {
          EXPECT_EQ(held, 4 * rows * info[b].activation_floats);
        }
        block->Discard(0);
        // Nothing else stays behind (d still holds the data).
        EXPECT_EQ(alloc->Stats().bytes_in_use, base + (b == 0 ? d.x.numel() * 4 : 0));
      }
    }
  }
}

// bf16 keeps less: the embedding keeps only token ids either way; a GPT block keeps 40
// bytes per element of its [T, C] input where fp32 keeps 64 (the pre-activation, the
// attention probabilities and the statistics stay float32); the head keeps fewer too.
TEST(ModelTest, Bf16KeepsFewerActivationBytes) {
  const std::vector<BlockInfo> info = DescribeBlocks(GptSpec(64, 64, 64, 4, 1));
  ASSERT_EQ(info.size(), 3u);
  EXPECT_EQ(ActivationBytes(info[0], true), ActivationBytes(info[0], false));  // token ids
  const int64_t T = 64, C = 64, H = 4;
  EXPECT_EQ(ActivationBytes(info[1], false), 64 * T * C + 4 * H * T * T + 16 * T);
  EXPECT_EQ(ActivationBytes(info[1], true), 40 * T * C + 4 * H * T * T + 16 * T);
  EXPECT_LT(ActivationBytes(info[2], true), ActivationBytes(info[2], false));
}

// ------------------------------------------------------------------ initialisation

TEST(ModelInitTest, DigestsArePerBlockPureFunctionsOfTheSeed) {
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const baton::v1::ModelSpec spec = gpt ? GptSpec() : MlpSpec();
    std::unique_ptr<Sequential> a = Build(spec, 1234);
    std::unique_ptr<Sequential> b = Build(spec, 1234);
    const std::vector<Digest> da = BlockDigests(*a);
    ASSERT_EQ(da.size(), gpt ? 4u : 3u);
    EXPECT_EQ(da, BlockDigests(*b)) << "building twice gives the same weights";

    // Blocks 1..2 alone equal blocks 1..2 of the full model (and keep their names).
    std::unique_ptr<Sequential> mid = Build(spec, 1234, 1, 3);
    ASSERT_EQ(mid->size(), 2);
    const std::vector<Digest> dm = BlockDigests(*mid);
    EXPECT_EQ(dm[0], da[1]);
    EXPECT_EQ(dm[1], da[2]);
    EXPECT_EQ(mid->at(0).name(), a->at(1).name());
    EXPECT_EQ(mid->at(1).name(), a->at(2).name());
    // Any single block, including the last.
    for (int i = 0; i < a->size(); ++i) {
      EXPECT_EQ(BlockDigests(*Build(spec, 1234, i, i + 1))[0], da[i]) << "block " << i;
    }

    // Another seed changes every block (each has randomly initialised weights).
    const std::vector<Digest> dc = BlockDigests(*Build(spec, 1235));
    for (size_t i = 0; i < da.size(); ++i) EXPECT_NE(dc[i], da[i]) << "block " << i;
    // Distinct blocks of one model differ (names seed the streams).
    if (gpt) {
      EXPECT_NE(da[1], da[2]);
    }
  }
}

TEST(ModelInitTest, RefusesBadBlockRanges) {
  const baton::v1::ModelSpec spec = GptSpec();  // 4 blocks
  for (auto [first, last] : std::vector<std::pair<int, int>>{{-1, 2}, {2, 2}, {3, 1}, {0, 5},
                                                             {4, -1}}) {
    const absl::StatusOr<std::unique_ptr<Sequential>> m = BuildBlocks(spec, 1, first, last);
    EXPECT_EQ(m.status().code(), kInvalid) << first << ", " << last;
  }
  EXPECT_EQ(BuildBlocks(baton::v1::ModelSpec(), 1).status().code(), kInvalid);
}

TEST(ModelInitTest, AModelTooLargeForItsDeviceIsResourceExhaustedNamingTheParameter) {
  // hidden.0.weight alone is [2^15, 2^31 - 1] floats: 256 TiB, which no machine can map.
  // Its bias (2^15 floats) is small, and only that block is built.
  baton::v1::ModelSpec spec = MlpSpec();
  spec.mutable_mlp()->set_input_dim(std::numeric_limits<int32_t>::max());
  spec.mutable_mlp()->set_width(1 << 15);
  const absl::StatusOr<std::unique_ptr<Sequential>> m = BuildBlocks(spec, 1, 0, 1);
  ASSERT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
  EXPECT_NE(m.status().message().find("parameter hidden.0.weight"), std::string::npos)
      << m.status();
  const int64_t bytes = int64_t{std::numeric_limits<int32_t>::max()} * (1 << 15) * 4;
  EXPECT_NE(m.status().message().find(absl::StrCat(bytes, " bytes")), std::string::npos)
      << m.status();
  EXPECT_NE(m.status().message().find("cpu"), std::string::npos) << m.status();
}

TEST(ModelInitTest, ADeviceWithoutABackendIsRefusedNamingIt) {
  if (BackendFor(Device::kCuda).ok()) GTEST_SKIP() << "a CUDA device is present";
  const absl::StatusOr<std::unique_ptr<Sequential>> m =
      BuildBlocks(GptSpec(), 1, 0, -1, Device::kCuda);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_NE(m.status().message().find("model on cuda"), std::string::npos) << m.status();
}

TEST(ModelInitTest, DescribeBlocksMatchesBuiltBlocks) {
  for (bool gpt : {false, true}) {
    SCOPED_TRACE(gpt ? "gpt" : "mlp");
    const baton::v1::ModelSpec spec = gpt ? GptSpec() : MlpSpec();
    const std::vector<BlockInfo> info = DescribeBlocks(spec);
    std::unique_ptr<Sequential> m = Build(spec, 1);
    ASSERT_EQ(static_cast<int>(info.size()), m->size());
    const std::vector<std::string> want_names =
        gpt ? std::vector<std::string>{"embed", "block.0", "block.1", "head"}
            : std::vector<std::string>{"hidden.0", "hidden.1", "out"};
    for (int i = 0; i < m->size(); ++i) {
      EXPECT_EQ(info[i].name, want_names[i]);
      EXPECT_EQ(info[i].name, m->at(i).name());
      int64_t params = 0, operands = 0, largest = 0;
      for (Parameter* p : m->at(i).Parameters()) {
        params += p->value.numel();
        largest = std::max(largest, p->value.numel());
        if (p->bf16_operand) operands += p->value.numel();
        EXPECT_EQ(p->value.shape(), p->grad.shape()) << p->name;
        EXPECT_EQ(p->name.rfind(info[i].name + ".", 0), 0u)
            << p->name << " is not prefixed by its block's name";
      }
      EXPECT_EQ(info[i].parameters, params) << info[i].name;
      EXPECT_EQ(info[i].operand_parameters, operands) << info[i].name;
      EXPECT_EQ(info[i].largest_parameter, largest) << info[i].name;
      if (info[i].name != "embed") EXPECT_GT(operands, 0) << info[i].name;  // its Linears
      EXPECT_GE(info[i].forward_flops, 0);
    }
  }
}

// ------------------------------------------------------------------ allocation

TEST(ModelAllocTest, SecondIdenticalPassMakesNoSystemAllocations) {
  std::unique_ptr<Sequential> m = Build(GptSpec(), 5);
  const Data d = GptData(0);
  const std::vector<Parameter*> params = m->Parameters();
  auto pass = [&] {
    ZeroGrad(params);
    Tensor loss, dx;
    ASSERT_TRUE(m->Forward({0, &d.targets}, d.x, &loss).ok());
    const Tensor scale = ScalarTensor(0.5f);
    ASSERT_TRUE(m->BackwardInput({0, &d.targets}, scale, &dx).ok());
    ASSERT_TRUE(m->BackwardWeight({0, &d.targets}).ok());
  };
  pass();  // warm-up fills the allocator's cache
  const AllocatorStats before = CpuAllocator()->Stats();
  pass();
  const AllocatorStats after = CpuAllocator()->Stats();
  EXPECT_EQ(after.system_allocations, before.system_allocations);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use) << "the pass leaks tensors";
}

}  // namespace
}  // namespace baton
