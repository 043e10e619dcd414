#include "common/pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

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
  // chunks; cut[k][i]: where its last chunk starts. O(chunks * blocks^2), and models have
  // at most a few hundred blocks.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(num_chunks + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> cut(num_chunks + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= num_chunks; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {  // last chunk is [j, i)
        if (best[k - 1][j] == kInf) continue;
        const int64_t v = std::max(best[k - 1][j], cost(j, i));
        if (v < best[k][i]) {  // strict: the earliest cut wins ties
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
    }
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

}  // namespace baton
