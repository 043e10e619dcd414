// Splitting a model's blocks into pipeline chunks.
#ifndef BATON_COMMON_PIPELINE_PARTITION_H_
#define BATON_COMMON_PIPELINE_PARTITION_H_

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

}  // namespace baton

#endif  // BATON_COMMON_PIPELINE_PARTITION_H_
