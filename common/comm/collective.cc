#include "common/comm/collective.h"

#include "absl/strings/str_cat.h"

namespace baton {

// An engine that has not implemented the sharded operations says so, naming itself (as
// c10d's backends do), rather than falling back to something that moves more.
absl::Status Collective::ReduceScatterSum(float*, absl::Span<const int64_t>, absl::Time) {
  return absl::UnimplementedError(
      absl::StrCat("the ", engine(), " collective engine has no reduce-scatter"));
}

absl::Status Collective::AllGather(float*, absl::Span<const int64_t>, absl::Time) {
  return absl::UnimplementedError(
      absl::StrCat("the ", engine(), " collective engine has no all-gather"));
}

bool AgreedCounts::Contains(absl::Span<const int64_t> counts) const {
  return sets_.contains(std::vector<int64_t>(counts.begin(), counts.end()));
}

void AgreedCounts::Add(absl::Span<const int64_t> counts) {
  if (sets_.size() >= kMaxSets) sets_.clear();
  sets_.emplace(counts.begin(), counts.end());
}

absl::StatusOr<std::vector<int64_t>> ShardOffsets(absl::Span<const int64_t> counts, int size,
                                                  const char* op) {
  if (static_cast<int64_t>(counts.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", counts.size(), " shard counts for a group of ", size));
  }
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t m = 0; m < counts.size(); ++m) {
    if (counts[m] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": member ", m, "'s shard has a negative count, ", counts[m]));
    }
    offsets[m + 1] = offsets[m] + counts[m];
  }
  return offsets;
}

}  // namespace baton
