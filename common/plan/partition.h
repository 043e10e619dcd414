// Splitting a model's blocks into pipeline chunks.
#ifndef BATON_COMMON_PLAN_PARTITION_H_
#define BATON_COMMON_PLAN_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/nn/model.h"

namespace baton {

// Blocks [first, last) of the model, in canonical order.
struct BlockRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
};

// Splits blocks into `num_chunks` contiguous, non-empty ranges that minimise the largest
// chunk cost (the pipeline's slowest stage), where a block's cost is its forward FLOPs per
// sample from DescribeBlocks, plus one so that blocks without FLOPs still count. Among
// equally good splits the one with the earliest cuts is chosen, so the result depends only
// on the costs. Errors when there are fewer blocks than chunks.
absl::StatusOr<std::vector<BlockRange>> PartitionBlocks(const std::vector<BlockInfo>& blocks,
                                                        int num_chunks);

// The split a job runs: `sizes` (pipeline.partition: blocks per chunk, in chunk order) when
// given, else PartitionBlocks. INVALID_ARGUMENT (CheckPartitionSizes, spec.h) when `sizes`
// has not `num_chunks` entries, one is below 1, or they do not add up to the model's blocks.
absl::StatusOr<std::vector<BlockRange>> StageBlocks(const std::vector<BlockInfo>& blocks,
                                                    int num_chunks,
                                                    const std::vector<int>& sizes);

// Blocks per chunk, the form pipeline.partition takes: {3, 2, 2, 1}.
std::vector<int> PartitionSizes(const std::vector<BlockRange>& ranges);

}  // namespace baton

#endif  // BATON_COMMON_PLAN_PARTITION_H_
