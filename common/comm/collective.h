// Collectives across the replicas of a data-parallel group: one interface, engines behind
// it (in-process threads, Gloo for CPU workers, NCCL for GPU workers).
//
// Determinism is the default contract: AllReduceSum leaves on every member the sum of the
// members' buffers taken in member order, ((x_0 + x_1) + x_2) + ..., element by element in
// float. Every member gets the same bits, run after run, and they equal what the reference
// trainer computes when it sums its replicas in order. (A ring all-reduce sums each chunk
// starting at a different member, so it does not meet this.) An engine made in fast mode
// (ordered() false: REDUCE_MODE_FAST) uses its library's own ring or tree instead: every
// member still gets the same bits, but they differ from the ordered sum in the last places.
//
// Members of a group call the same collectives in the same order (the replicas run the
// same clock); a call returns when every member has made it, or fails at `deadline`, or
// when any member aborted the group.
#ifndef BATON_COMMON_COMM_COLLECTIVE_H_
#define BATON_COMMON_COMM_COLLECTIVE_H_

#include <cstdint>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/core/tensor.h"

namespace baton {

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;  // this member's index in the group, 0 .. size()-1
  virtual int size() const = 0;
  // Where the collectives' data must live: host memory (kCpu), or memory of the process's CUDA
  // device (kCuda), written and synchronised with the host before the call, unless
  // follows_compute_stream().
  virtual Device device() const { return Device::kCpu; }
  // True when the collectives' data may still be being written by work queued on the
  // process's CUDA compute stream (cuda_context.h) when the call is made: the engine orders
  // itself after that work, so the caller need not wait for it. It still holds the result
  // when the call returns.
  virtual bool follows_compute_stream() const { return false; }
  // True when AllReduceSum computes the ordered sum (above); false in fast mode.
  virtual bool ordered() const { return true; }
  // "gloo", "nccl", "inproc": for reports and metrics.
  virtual const char* engine() const = 0;

  // Replaces data[0, n) with the ordered sum over the group (above). Every member passes
  // the same n. DEADLINE_EXCEEDED when some member has not joined by `deadline`; ABORTED
  // (with the aborting member's reason) when the group was aborted. Thread-compatible: one
  // call at a time per member.
  virtual absl::Status AllReduceSum(float* data, int64_t n, absl::Time deadline) = 0;

  // Sharded operations (the optimizer sharded across replicas). `data` holds sum(counts)
  // floats, member m's shard at offset counts[0] + ... + counts[m - 1], counts[m] long;
  // counts.size() == size(), a count may be 0, and every member passes the same counts:
  // counts that differ fail the whole group (INVALID_ARGUMENT naming the counts on the
  // members that see the difference, the others end as after Abort with that reason). The
  // engines check this the first time a member passes a set of counts (one small exchange
  // of the counts, a collective round of its own); a later call with a set the group agreed
  // on before skips it. So a call where members pass different sets they had each agreed
  // on before is not caught as such: it fails as mismatched transfers do (an engine error
  // or the deadline). The optimizer's calls cannot do that: every member computes the same
  // layout and runs the same clock (common/optim/optimizer_shards.h).
  // Bad counts (wrong length, negative) are INVALID_ARGUMENT before anything moves.
  // Deadline, abort, call order and device() as AllReduceSum; each counts as one
  // collective in the order. An engine without them answers UNIMPLEMENTED naming itself.
  //
  // ReduceScatterSum: on return this member's shard holds the group's sum of that shard,
  // in ordered mode the very bits AllReduceSum would leave there; the other shards'
  // contents are unspecified. Each member receives no more than AllReduceSum's ordered
  // path does ((size - 1) * n floats), the engine's header says how much.
  virtual absl::Status ReduceScatterSum(float* data, absl::Span<const int64_t> counts,
                                        absl::Time deadline);
  // AllGather: this member's shard of `data` is its input (the rest is overwritten); on
  // return every member's `data` holds every member's shard, bit for bit as sent. Each
  // member receives no more than (size - 1) * max(counts) floats.
  virtual absl::Status AllGather(float* data, absl::Span<const int64_t> counts,
                                 absl::Time deadline);

  // Fails this member's pending and future calls, and every other member's, with `why`.
  // Thread-safe; may be called while another thread is inside AllReduceSum.
  virtual void Abort(const absl::Status& why) = 0;
};

// The sets of shard counts a group has agreed on (the sharded operations above): an engine
// exchanges a set the first time it is passed and remembers it when every member passed
// the same. Holds at most kMaxSets; older ones are forgotten (checked again). One thread
// at a time, like the engine's calls.
class AgreedCounts {
 public:
  static constexpr size_t kMaxSets = 1024;
  bool Contains(absl::Span<const int64_t> counts) const;
  void Add(absl::Span<const int64_t> counts);

 private:
  std::set<std::vector<int64_t>> sets_;
};

// The layout of a sharded buffer (above): offsets[m] is where member m's shard starts,
// offsets[size] the total. INVALID_ARGUMENT naming `op` when counts.size() != size or a
// count is negative. For the engines.
absl::StatusOr<std::vector<int64_t>> ShardOffsets(absl::Span<const int64_t> counts, int size,
                                                  const char* op);

}  // namespace baton

#endif  // BATON_COMMON_COMM_COLLECTIVE_H_
