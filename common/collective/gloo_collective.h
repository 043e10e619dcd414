// The Gloo engine: a Collective whose members are processes (or threads) connected by
// Gloo's TCP transport, meeting through a rendezvous store (gloo::rendezvous::Store: a
// HashStore in one process, a store served by the coordinator across workers).
//
// AllReduceSum keeps the interface's contract (the ordered sum, the same bits on every
// member) by gathering every member's buffer (gloo::allgather, a ring over TCP) and summing
// the gathered copies locally in member order; it moves (size - 1) / size of the data per
// member per direction more than a reduce-scatter would, the price of a result that does
// not depend on the ring's chunking. In fast mode (GlooOptions::ordered false) it runs
// gloo::allreduce's ring instead (collective.h: same bits on every member, not the ordered
// sum).
//
// The sharded operations first all-gather every member's counts (size * size integers:
// a member whose counts differ fails every member with INVALID_ARGUMENT naming it), then,
// in either mode: ReduceScatterSum is gloo::alltoallv, each member receiving the others'
// copies of its own shard ((size - 1) * counts[rank] floats; (size - 1) / size of the data
// on average, against AllReduceSum's size - 1 times it), summed locally in member order,
// so its shard has AllReduceSum's ordered bits. AllGather is gloo::allgatherv's ring:
// each member receives the shards it lacks, n - counts[rank] floats.
//
// Abort: this Gloo has no way to interrupt an operation in flight; Abort makes every later
// call of this member fail at once, and a call already waiting ends at its deadline (Gloo's
// timeout), so peers of a failed member are stopped by the deadline, never left hanging.
#ifndef BATON_COMMON_COLLECTIVE_GLOO_COLLECTIVE_H_
#define BATON_COMMON_COLLECTIVE_GLOO_COLLECTIVE_H_

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/comm/collective.h"
#include "common/core/mutex.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace baton {

struct GlooOptions {
  std::string hostname = "127.0.0.1";  // the address this member listens on for its peers
  absl::Duration connect_timeout = absl::Seconds(30);
  bool ordered = true;  // false: Gloo's ring all-reduce (REDUCE_MODE_FAST)
};

class GlooCollective final : public Collective {
 public:
  // Joins the group: publishes this member's address in `store` and connects to every
  // other member. DEADLINE_EXCEEDED naming the group when the others do not come within
  // options.connect_timeout.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Connect(
      gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& options = {});
  ~GlooCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool ordered() const override { return ordered_; }
  const char* engine() const override { return "gloo"; }
  absl::Status AllReduceSum(float* data, int64_t n, absl::Time deadline) override;
  absl::Status ReduceScatterSum(float* data, absl::Span<const int64_t> counts,
                                absl::Time deadline) override;
  absl::Status AllGather(float* data, absl::Span<const int64_t> counts,
                         absl::Time deadline) override;
  void Abort(const absl::Status& why) override;

 private:
  GlooCollective(int rank, int size, bool ordered, std::shared_ptr<gloo::Context> context);

  // ABORTED naming `what` once the group was aborted.
  absl::Status Begin(const char* what);
  // Gloo's timeout for a call ending at `deadline`; DEADLINE_EXCEEDED if it has passed.
  static absl::StatusOr<std::chrono::milliseconds> TimeLeft(absl::Time deadline, const char* what);
  // Runs one Gloo operation; its exception becomes a status, and aborts this member (the
  // group is out of step).
  absl::Status Run(const char* what, const std::function<void()>& op);
  // Fails (and aborts) unless every member passes these counts.
  absl::Status AgreeOnCounts(const char* what, absl::Span<const int64_t> counts,
                             std::chrono::milliseconds timeout);

  const int rank_;
  const int size_;
  const bool ordered_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<float> gathered_;  // the ordered paths'; one call at a time
  AgreedCounts agreed_;          // AgreeOnCounts's; one call at a time
  uint32_t tag_ = 0;             // per collective, so a late message cannot match another
  Mutex mu_;
  absl::Status aborted_;  // guarded by mu_
};

}  // namespace baton

#endif  // BATON_COMMON_COLLECTIVE_GLOO_COLLECTIVE_H_
