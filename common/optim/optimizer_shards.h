// How a data-parallel rank's gradients are summed over its replica group, bucket by bucket,
// and, with a sharded optimizer (OptimizerSpec.shard), which member of the group owns each
// parameter: reduces its gradient, keeps its optimizer state, updates it, and hands the new
// weights to the others.
//
// A pure function of the parameters' sizes, the bucket size, the group size and the pinned
// parameters: every member of a group computes the same layout from the same model, so
// their collectives line up (a member that computed another would fail the group: the
// engines refuse counts that differ).
//
// Buckets: within a group of parameters (a pipeline stage), in the order given (the reduce
// order: the stage's last block first), consecutive parameters fill a bucket while it holds
// at most bucket_bytes of floats; a parameter larger than that is a bucket of its own.
// Buckets never span groups.
//
// Ownership (sharded): whole parameters, never a piece of one, so a parameter's update,
// its gradient norm and its checkpointed state need no other member's. Within each bucket
// the members own consecutive runs in member order (member r's run is the bucket's r-th
// shard, as ReduceScatterSum and AllGather lay shards out; a run may be empty). The runs
// are chosen bucket by bucket, in order, to keep the members' owned totals even: each
// bucket's cut minimises the sum of the squared totals after it (exact, in integers; a tie
// gives the earlier members more). A pinned parameter is member 0's (the tied embedding's
// two ends must have the same owner, whatever else their stages hold): its bucket lays the
// pinned parameters out first, so member 0's run starts with them, and the cuts count them
// against member 0 from the first bucket on.
#ifndef BATON_COMMON_OPTIM_OPTIMIZER_SHARDS_H_
#define BATON_COMMON_OPTIM_OPTIMIZER_SHARDS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

struct GradBucket {
  int group = 0;            // the group (stage) its parameters belong to
  // Indices into the flattened parameter list: a consecutive range of it, laid out in the
  // bucket in this order (sharded, the pinned ones first, then the rest in order).
  std::vector<int> params;
  int64_t floats = 0;       // the parameters' sizes summed
  // Sharded: floats per member, in member order (member r owns the parameters of the
  // bucket's r-th run); sums to `floats`. Empty when not sharded.
  std::vector<int64_t> counts;
};

struct ReduceLayout {
  bool sharded = false;
  int members = 1;
  std::vector<GradBucket> buckets;    // groups in the order given, each in reduce order
  std::vector<int> owner;             // per parameter: its owning member (0 when not sharded)
  std::vector<int64_t> owned_floats;  // per member: the sizes of the parameters it owns
};

// `groups[g]` lists group g's parameter sizes (elements, each >= 1) in reduce order; the
// flattened list is the groups' lists one after the other. `pinned` has one entry per
// flattened parameter (or is empty: none pinned). `bucket_bytes` >= 1; `members` >= 1.
// Without `shard` every parameter is member 0's and buckets have no counts.
// INVALID_ARGUMENT for a size below 1, a `pinned` of the wrong length, or bad counts.
absl::StatusOr<ReduceLayout> PlanReduceLayout(const std::vector<std::vector<int64_t>>& groups,
                                              int64_t bucket_bytes, int members, bool shard,
                                              const std::vector<bool>& pinned);

}  // namespace baton

#endif  // BATON_COMMON_OPTIM_OPTIMIZER_SHARDS_H_
