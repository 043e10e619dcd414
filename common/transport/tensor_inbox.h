// TensorInbox: where a worker files the tensors its peers send it, until its stage takes them.
//
// The inbox belongs to the worker, not to a job: Open(job_key, capacity) starts accepting
// the tensors of one job, Close() drops them and refuses deliveries until the next Open.
// The TensorService (tensor_service.h) delivers into it; the job's GrpcTransport takes out
// of it (Recv). Tensors are keyed by (source rank, tag) and taken in any order.
//
// Bounded in bytes, with backpressure: a delivery first reserves its bytes, and waits while
// the tensors filed or being received would exceed the capacity. The receiving stream then
// stops reading, HTTP/2 flow control fills up, and the sender blocks: memory stays bounded
// instead of growing with a fast sender. One exception keeps that from deadlocking: a
// tensor is always admitted when nothing from its source rank is filed or pending. Schedules
// send and receive in the same order per pair of ranks, so the tensor a rank waits for from
// a source is the oldest one that source sent: either it is already in, or the source has
// nothing in and it is admitted. Only the plan's sources are admitted at all (InboxPlan:
// the ranks, stages and kinds this rank's clock receives), so memory stays within
// capacity + one tensor per source rank of the plan, whoever sends (and the oversized
// tensor, larger than the capacity on its own, is accepted once its source has nothing
// else in).
//
// Errors name the source rank and the tag, never a job key (the secret that guards the
// job's streams): a tag whose job key is not the open job's is FAILED_PRECONDITION
// "unexpected tag ... from rank N", and one when no job is open UNAVAILABLE (this worker has
// not opened the sender's job yet, or has ended it: a failure a recovery may cure); a
// source rank outside the plan, a
// tensor the plan has that rank send none of, or a sender whose certificate is not the
// rank's, PERMISSION_DENIED; a tag filed twice ALREADY_EXISTS; a receive that times out
// DEADLINE_EXCEEDED; and after Abort(reason) every pending and later delivery and take
// fails with the reason (ABORTED) until the next Open.
//
// Thread-safe.
#ifndef BATON_COMMON_TRANSPORT_TENSOR_INBOX_H_
#define BATON_COMMON_TRANSPORT_TENSOR_INBOX_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/core/tensor.h"
#include "common/comm/transport.h"
#include "common/core/mutex.h"

namespace baton {

// A tensor a rank receives: from `rank`, sent by stage `stage`, of `kind` (any step and
// micro-batch). RECV_F of stage s receives stage s-1's activations from the rank owning
// s-1; RECV_B of stage s, stage s+1's gradients.
struct InboxSource {
  int rank = 0;
  int stage = 0;
  TensorKind kind = TensorKind::kActivation;
  friend bool operator==(const InboxSource& a, const InboxSource& b) {
    return a.rank == b.rank && a.stage == b.stage && a.kind == b.kind;
  }
};

// What an inbox accepts while a job is open.
struct InboxPlan {
  uint64_t job_key = 0;
  int64_t capacity_bytes = 0;
  // The job's number of ranks; 0: any rank >= 0 (tests of the inbox alone).
  int num_ranks = 0;
  // The certificate common name of every rank (by rank; "" where unknown, or none at all on
  // a plaintext cluster): a rank's tensors and the job's abort notices are accepted only
  // from streams presenting it.
  std::vector<std::string> identities;
  // Every tensor this rank receives; empty: any tensor from any rank of the job.
  std::vector<InboxSource> sources;
};

struct TensorInboxStats {
  bool open = false;
  uint64_t job_key = 0;
  int64_t capacity_bytes = 0;
  int64_t bytes_in_use = 0;       // filed + reserved
  int64_t peak_bytes_in_use = 0;  // since Open
  int64_t tensors_filed = 0;      // waiting to be taken
  int64_t tensors_delivered = 0;  // since Open
  int64_t delivery_waits = 0;     // deliveries that had to wait for space (backpressure)
  // Callers blocked right now (kept across Open and Close): deliveries waiting for space,
  // and Takes waiting for their tensor. For tests and diagnostics, to see that a caller is
  // waiting instead of assuming it after a sleep.
  int64_t deliveries_waiting = 0;
  int64_t takes_waiting = 0;
};

class TensorInbox {
 public:
  // Keeps its bytes reserved until Commit (filing the tensor) or destruction (releasing
  // them, e.g. when the stream carrying the tensor broke). Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { Release(); }

    // Files `t` (whose nbytes() must be the reserved byte count) under the reserved key.
    // Fails if the inbox was closed, reopened or aborted since the reservation.
    absl::Status Commit(Tensor t);
    bool active() const { return inbox_ != nullptr; }

   private:
    friend class TensorInbox;
    void Release();
    TensorInbox* inbox_ = nullptr;
    uint64_t generation_ = 0;
    int source_rank_ = 0;
    TensorTag tag_;
    int64_t bytes_ = 0;
  };

  TensorInbox() = default;
  ~TensorInbox() = default;
  TensorInbox(const TensorInbox&) = delete;
  TensorInbox& operator=(const TensorInbox&) = delete;

  // Starts accepting the tensors `plan` lists, tagged with its job key, dropping whatever an
  // earlier job left and clearing an abort. plan.capacity_bytes bounds filed + reserved
  // bytes (see above).
  void Open(InboxPlan plan);
  // Open with any tensor of any rank of `identities.size()` ranks (or any rank at all when
  // empty): for tests.
  void Open(uint64_t job_key, int64_t capacity_bytes, std::vector<std::string> identities = {});
  // Whether a stream whose peer certificate names `identity` ("" without one) may deliver
  // `tag` as `source_rank` of the open job: FAILED_PRECONDITION when the tag's job key is
  // not the open job's; PERMISSION_DENIED when the plan has no such tensor from that rank
  // (a rank outside the plan, another stage or kind) or the rank's identity is known and
  // differs. OK when no job is open (Reserve refuses then).
  absl::Status CheckSender(int source_rank, const TensorTag& tag,
                           absl::string_view identity) const;
  // Drops every filed tensor, fails waiting deliveries and takes, refuses new ones.
  void Close();
  // Fails every pending and later delivery and take of the open job with `reason` (code
  // ABORTED, the reason's message) until the next Open. The first reason wins.
  void Abort(const absl::Status& reason);
  // Abort, only if the inbox is open for `job_key` (a peer's abort notice for an old job
  // must not stop the current one) and, when Open was given identities, `identity` is one
  // of them (a stranger's notice must not either). Returns whether it aborted (or already
  // was).
  bool AbortJob(uint64_t job_key, const absl::Status& reason, absl::string_view identity = "");

  // Reserves `bytes` for the tensor `tag` from `source_rank`, waiting for space until
  // `deadline` (RESOURCE_EXHAUSTED), a Close or Abort, or `cancelled()` turning true
  // (polled every 50 ms; CANCELLED).
  absl::StatusOr<Reservation> Reserve(int source_rank, const TensorTag& tag, int64_t bytes,
                                      absl::Time deadline,
                                      const std::function<bool()>& cancelled = nullptr);
  // Reserve + Commit.
  absl::Status Deliver(int source_rank, const TensorTag& tag, Tensor t,
                       absl::Time deadline = absl::InfiniteFuture());

  // Takes the tensor `tag` from `source_rank`, waiting until `deadline`.
  absl::StatusOr<Tensor> Take(int source_rank, const TensorTag& tag, absl::Time deadline);

  TensorInboxStats Stats() const;

 private:
  struct Key {
    int source_rank = 0;
    TensorTag tag;
    friend bool operator==(const Key& a, const Key& b) {
      return a.source_rank == b.source_rank && a.tag == b.tag;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.source_rank, k.tag);
    }
  };
  struct Entry {
    bool filed = false;  // false: reserved, being received
    Tensor tensor;
    int64_t bytes = 0;
  };

  absl::Status CheckAcceptsLocked(int source_rank, const TensorTag& tag) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan's part of CheckSender: the source and the tensor, not the identity.
  absl::Status CheckSourceLocked(int source_rank, const TensorTag& tag) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(const Key& key, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // baton::Mutex (a std::mutex) rather than absl::Mutex: Debian's prebuilt Abseil is not instrumented for
  // ThreadSanitizer.
  mutable Mutex mu_;
  std::condition_variable changed_;  // a tensor filed or taken, Open, Close, Abort
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t job_key_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Open and Close
  int64_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
  int num_ranks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> identities_ ABSL_GUARDED_BY(mu_);
  std::vector<InboxSource> sources_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);  // OK unless aborted
  absl::flat_hash_map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t> bytes_by_source_ ABSL_GUARDED_BY(mu_);
  TensorInboxStats stats_ ABSL_GUARDED_BY(mu_);
  // Stats().deliveries_waiting and takes_waiting: not in stats_, which Open resets.
  int64_t deliveries_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t takes_waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_TENSOR_INBOX_H_
