// An in-process collective engine: the members of a group are threads of one process
// (the replicas of `batonctl train-local --pipeline` and the tests). The last member to
// arrive at a collective computes the result from every member's buffer while the others
// wait (the ordered sum; for AllGather each member's shard), then each copies out its part:
// all of it, or its own shard after ReduceScatterSum. Nothing crosses a wire; each member
// copies in and out no more than its buffer.
#ifndef BATON_COMMON_COMM_INPROC_COLLECTIVE_H_
#define BATON_COMMON_COMM_INPROC_COLLECTIVE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/comm/collective.h"
#include "common/core/mutex.h"

namespace baton {

class InProcessGroup {
 public:
  // A group of `size` members (>= 1).
  explicit InProcessGroup(int size);

  // Member `rank`'s handle; the group must outlive it. Each rank is taken once.
  std::unique_ptr<Collective> Member(int rank);

  int size() const { return size_; }

 private:
  class MemberImpl;
  enum class Op { kAllReduceSum, kReduceScatterSum, kAllGather };
  // One collective, by its sequence number: what has arrived and the result.
  struct Round {
    std::vector<const float*> inputs;  // by rank; null until that member arrives
    Op op = Op::kAllReduceSum;
    std::vector<int64_t> counts;  // {n} for AllReduceSum; empty until the first arrives
    int arrived = 0;
    int copied = 0;
    bool summed = false;
    std::vector<float> result;
  };

  // Every collective: `counts` is {n} for kAllReduceSum, the shards' counts otherwise.
  absl::Status Run(int rank, int64_t round, Op op, float* data, std::vector<int64_t> counts,
                   absl::Time deadline);
  void Abort(const absl::Status& why);

  const int size_;
  // baton::Mutex (a std::mutex) rather than absl::Mutex: Debian's prebuilt Abseil is not instrumented for
  // ThreadSanitizer.
  Mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Round> rounds_;  // guarded by mu_
  absl::Status aborted_;             // guarded by mu_; OK until Abort
};

}  // namespace baton

#endif  // BATON_COMMON_COMM_INPROC_COLLECTIVE_H_
