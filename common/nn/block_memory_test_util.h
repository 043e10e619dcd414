// What a transformer block keeps from its forward until its backward, measured by the CPU
// allocator, against DescribeBlocks' count: shared by the attention kernels' tests, which
// run with the process's kernels set (BATON_FUSED_ATTENTION) and say which they are.
#ifndef BATON_COMMON_NN_BLOCK_MEMORY_TEST_UTIL_H_
#define BATON_COMMON_NN_BLOCK_MEMORY_TEST_UTIL_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "baton/v1/job.pb.h"
#include "common/nn/grad_check_test_util.h"
#include "common/nn/model.h"
#include "gtest/gtest.h"

namespace baton {
namespace testing {

// A GPT (llama false) or LLaMA (grouped heads) of one layer: context T, width 64, 4 heads.
inline baton::v1::ModelSpec OneLayerSpec(bool llama, int T) {
  baton::v1::ModelSpec spec;
  if (llama) {
    auto* l = spec.mutable_llama();
    l->set_vocab_size(16);
    l->set_context(T);
    l->set_d_model(64);
    l->set_heads(4);
    l->set_kv_heads(2);
    l->set_layers(1);
    l->set_intermediate_size(96);
  } else {
    auto* g = spec.mutable_gpt();
    g->set_vocab_size(16);
    g->set_context(T);
    g->set_d_model(64);
    g->set_heads(4);
    g->set_layers(1);
  }
  return spec;
}

// block.0 of `spec`, run forward on 2 sequences in `precision`, holds exactly what
// DescribeBlocks(spec, {attention, bf16}) says it keeps.
inline void ExpectBlockKeepsWhatIsDescribed(const baton::v1::ModelSpec& spec,
                                            AttentionKernel attention, Precision precision) {
  const bool bf16 = precision == Precision::kBf16;
  const BlockInfo info = DescribeBlocks(spec, {attention, bf16})[1];
  absl::StatusOr<std::unique_ptr<Sequential>> block = BuildBlocks(spec, 1, 1, 2);
  ASSERT_TRUE(block.ok()) << block.status();
  const int64_t rows = 2;
  Tensor x = RandomTensor(BlockInputShape(spec, 1, rows), 52, "act");
  const MicroBatch mb{0, nullptr, precision};
  RoundIfBf16(mb, BackendOrDie(Device::kCpu), &x);
  Allocator* alloc = CpuAllocator();
  const int64_t base = alloc->Stats().bytes_in_use - x.numel() * 4;
  Tensor y;
  ASSERT_TRUE((*block)->Forward(mb, x, &y).ok());
  x = Tensor();
  y = Tensor();
  EXPECT_EQ(alloc->Stats().bytes_in_use - base, rows * ActivationBytes(info, bf16))
      << (spec.has_llama() ? "llama" : "gpt") << (bf16 ? " bf16" : " fp32");
  (*block)->Discard(0);
  EXPECT_EQ(alloc->Stats().bytes_in_use, base);
}

// The above for the one-layer GPT and LLaMA, in bf16 and float32, under the kernels the
// process runs with (`attention`, which the caller's test asserts).
inline void ExpectBlocksKeepWhatIsDescribed(AttentionKernel attention) {
  for (bool llama : {false, true}) {
    for (Precision p : {Precision::kBf16, Precision::kFp32}) {
      ExpectBlockKeepsWhatIsDescribed(OneLayerSpec(llama, 40), attention, p);
    }
  }
}

}  // namespace testing
}  // namespace baton

#endif  // BATON_COMMON_NN_BLOCK_MEMORY_TEST_UTIL_H_
