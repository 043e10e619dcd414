#include "common/optim/optimizer_shards.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

using Wide = __int128;

Wide Square(int64_t x) { return static_cast<Wide>(x) * static_cast<Wide>(x); }

// The cut of one bucket (sizes `s`) into `loads.size()` consecutive runs in member order
// that minimises the sum over members of (load + run)^2. Returns each member's run length,
// in parameters.
std::vector<int> CutBucket(const std::vector<int64_t>& s, const std::vector<int64_t>& loads) {
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
    for (int j = 0; j <= k; ++j) {
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
  // What the cuts balance: the owned totals, member 0's counted with every pinned
  // parameter from the start (it will own them wherever they come).
  std::vector<int64_t> load(out.members, 0);
  {
    size_t at = 0;
    for (const auto& g : groups) {
      for (int64_t n : g) {
        if (shard && !pinned.empty() && pinned[at]) load[0] += n;
        ++at;
      }
    }
  }
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
        // The bucket's pinned parameters lead its layout: member 0's run starts with them
        // (already in its load), and the cut places the rest.
        std::stable_partition(b.params.begin(), b.params.end(),
                              [&](int p) { return !pinned.empty() && pinned[p]; });
        int64_t pinned_floats = 0;
        std::vector<int64_t> s;  // the rest's sizes
        size_t first = 0;        // the first parameter not pinned
        for (int p : b.params) {
          if (!pinned.empty() && pinned[p]) {
            pinned_floats += sizes[p - next];
            ++first;
          } else {
            s.push_back(sizes[p - next]);
          }
        }
        const std::vector<int> runs = CutBucket(s, load);
        b.counts.assign(members, 0);
        b.counts[0] = pinned_floats;
        size_t k = first;
        for (int r = 0; r < members; ++r) {
          for (int n = 0; n < runs[r]; ++n, ++k) {
            out.owner[b.params[k]] = r;
            b.counts[r] += s[k - first];
            load[r] += s[k - first];
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
