#include "common/optim/optimizer_shards.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

using Wide = __int128;

Wide Square(int64_t x) { return static_cast<Wide>(x) * static_cast<Wide>(x); }

// The cut of one bucket (sizes `s`, the first `pinned_prefix` of them member 0's) into
// `loads.size()` consecutive runs in member order that minimises the sum over members of
// (load + run)^2. Returns each member's run length, in parameters.
std::vector<int> CutBucket(const std::vector<int64_t>& s, const std::vector<int64_t>& loads,
                           int pinned_prefix) {
  const int k = static_cast<int>(s.size());
  const int d = static_cast<int>(loads.size());
  std::vector<int64_t> prefix(k + 1, 0);
  for (int j = 0; j < k; ++j) prefix[j + 1] = prefix[j] + s[j];
  const Wide kInf = std::numeric_limits<Wide>::max();
  // cost[r][j]: members 0..r-1 take the first j parameters; from[r][j]: where r-1's run starts.
  std::vector<std::vector<Wide>> cost(d + 1, std::vector<Wide>(k + 1, kInf));
  std::vector<std::vector<int>> from(d + 1, std::vector<int>(k + 1, 0));
  cost[0][0] = 0;
  for (int r = 1; r <= d; ++r) {
    for (int j = (r == 1 ? pinned_prefix : 0); j <= k; ++j) {
      for (int i = 0; i <= j; ++i) {
        if (cost[r - 1][i] == kInf) continue;
        const Wide c = cost[r - 1][i] + Square(loads[r - 1] + prefix[j] - prefix[i]);
        if (c <= cost[r][j]) {  // a tie gives the earlier members more
          cost[r][j] = c;
          from[r][j] = i;
        }
      }
    }
  }
  std::vector<int> runs(d, 0);
  int j = k;
  for (int r = d; r >= 1; --r) {
    const int i = from[r][j];
    runs[r - 1] = j - i;
    j = i;
  }
  return runs;
}

}  // namespace

absl::StatusOr<ReduceLayout> PlanReduceLayout(const std::vector<std::vector<int64_t>>& groups,
                                              int64_t bucket_bytes, int members, bool shard,
                                              const std::vector<bool>& pinned) {
  if (members < 1) return absl::InvalidArgumentError("a replica group has at least one member");
  if (bucket_bytes < 1) return absl::InvalidArgumentError("buckets hold at least one byte");
  size_t total = 0;
  for (const auto& g : groups) total += g.size();
  if (!pinned.empty() && pinned.size() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat(pinned.size(), " pinned flags for ", total, " parameters"));
  }
  ReduceLayout out;
  out.sharded = shard;
  out.members = shard ? members : 1;
  out.owner.assign(total, 0);
  out.owned_floats.assign(out.members, 0);
  int next = 0;  // the flattened index of the group's first parameter
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int64_t>& sizes = groups[g];
    size_t i = 0;
    while (i < sizes.size()) {
      GradBucket b;
      b.group = static_cast<int>(g);
      while (i < sizes.size()) {
        if (sizes[i] < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter ", next + i, " has ", sizes[i], " elements"));
        }
        const bool fits =
            (b.floats + sizes[i]) * static_cast<int64_t>(sizeof(float)) <= bucket_bytes;
        if (!b.params.empty() && !fits) break;
        b.params.push_back(next + static_cast<int>(i));
        b.floats += sizes[i];
        ++i;
      }
      if (shard) {
        std::vector<int64_t> s;
        int pinned_prefix = 0;
        for (size_t k = 0; k < b.params.size(); ++k) {
          s.push_back(sizes[b.params[k] - next]);
          if (!pinned.empty() && pinned[b.params[k]]) pinned_prefix = static_cast<int>(k) + 1;
        }
        const std::vector<int> runs = CutBucket(s, out.owned_floats, pinned_prefix);
        b.counts.assign(members, 0);
        size_t k = 0;
        for (int r = 0; r < members; ++r) {
          for (int n = 0; n < runs[r]; ++n, ++k) {
            out.owner[b.params[k]] = r;
            b.counts[r] += s[k];
          }
          out.owned_floats[r] += b.counts[r];
        }
      } else {
        out.owned_floats[0] += b.floats;
      }
      out.buckets.push_back(std::move(b));
    }
    next += static_cast<int>(sizes.size());
  }
  return out;
}

}  // namespace baton
