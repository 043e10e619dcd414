#include "common/plan/partition.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/spec/spec.h"

namespace baton {

absl::StatusOr<std::vector<BlockRange>> PartitionBlocks(const std::vector<BlockInfo>& blocks,
                                                        int num_chunks) {
  const int n = static_cast<int>(blocks.size());
  if (num_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split into ", num_chunks, " chunks"));
  }
  if (n < num_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model has ", n, " blocks, fewer than the ", num_chunks,
                     " pipeline chunks (stages * virtual_stages); every chunk needs a block"));
  }
  // prefix[i] = cost of blocks [0, i).
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + blocks[i].forward_flops + 1;
  auto cost = [&](int a, int b) { return prefix[b] - prefix[a]; };

  // best[k][i]: the smallest possible largest-chunk cost splitting blocks [0, i) into k
  // chunks; cut[k][i]: where its last chunk starts (the earliest such start on ties).
  //
  // For the last chunk [j, i): best[k-1][j] does not decrease as j grows (more blocks in
  // k-1 chunks never costs less), and cost(j, i) strictly decreases (every block costs at
  // least 1). So max(best[k-1][j], cost(j, i)) falls until the first j where best[k-1][j]
  // >= cost(j, i), call it j0, and does not fall after it: the earliest minimum is j0 - 1
  // or j0. And j0 never moves left as i grows (cost(j, i) only grows), so one pointer per
  // k finds it: O(chunks * blocks) instead of the O(chunks * blocks^2) of trying every j.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> prev(n + 1, kInf), next(n + 1, kInf);
  std::vector<std::vector<int>> cut(num_chunks + 1, std::vector<int>(n + 1, 0));
  prev[0] = 0;
  for (int k = 1; k <= num_chunks; ++k) {
    std::fill(next.begin(), next.end(), kInf);
    int j0 = k - 1;  // the smallest feasible start of the last chunk
    for (int i = k; i <= n; ++i) {
      while (j0 < i - 1 && prev[j0] < cost(j0, i)) ++j0;
      int j = j0;
      int64_t v = std::max(prev[j0], cost(j0, i));
      if (j0 > k - 1) {
        const int64_t left = std::max(prev[j0 - 1], cost(j0 - 1, i));
        if (left <= v) {  // the earlier start wins ties
          v = left;
          j = j0 - 1;
        }
      }
      next[i] = v;
      cut[k][i] = j;
    }
    std::swap(prev, next);
  }
  std::vector<BlockRange> out(num_chunks);
  int end = n;
  for (int k = num_chunks; k >= 1; --k) {
    const int start = cut[k][end];
    out[k - 1] = BlockRange{start, end};
    end = start;
  }
  return out;
}

absl::StatusOr<std::vector<BlockRange>> StageBlocks(const std::vector<BlockInfo>& blocks,
                                                    int num_chunks,
                                                    const std::vector<int>& sizes) {
  if (sizes.empty()) return PartitionBlocks(blocks, num_chunks);
  const absl::Status ok =
      CheckPartitionSizes(sizes, num_chunks, static_cast<int64_t>(blocks.size()));
  if (!ok.ok()) return ok;
  std::vector<BlockRange> out;
  int first = 0;
  for (int n : sizes) {
    out.push_back(BlockRange{first, first + n});
    first += n;
  }
  return out;
}

std::vector<int> PartitionSizes(const std::vector<BlockRange>& ranges) {
  std::vector<int> out;
  for (const BlockRange& r : ranges) out.push_back(r.size());
  return out;
}

}  // namespace baton
