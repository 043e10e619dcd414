// The in-process transport: ranks are threads of one process.
//
// An InProcessHub owns the mailboxes of `num_ranks` ranks; Transport(r) is rank r's end.
// Send copies the tensor into the receiver's mailbox (so, as over a network, sender and
// receiver never share storage) and completes at once. Abort on any rank aborts the hub,
// waking every waiting rank with the reason.
#ifndef BATON_COMMON_COMM_INPROC_TRANSPORT_H_
#define BATON_COMMON_COMM_INPROC_TRANSPORT_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "common/comm/transport.h"
#include "common/core/mutex.h"

namespace baton {

struct TransportCounters {
  int64_t tensors_sent = 0;
  int64_t bytes_sent = 0;
};

class InProcessHub {
 public:
  explicit InProcessHub(int num_ranks);
  ~InProcessHub();
  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;

  int num_ranks() const { return static_cast<int>(ends_.size()); }
  // Rank r's end of the hub; owned by the hub.
  Transport* transport(int rank) { return ends_[rank].get(); }
  // Tensors still sitting in mailboxes (sent, not received). Zero after a clean step.
  int Pending() const;
  TransportCounters Counters() const;
  // Clears an abort and every mailbox, so that the hub can be used for a new step.
  void Reset();

 private:
  class End;
  struct Key {
    int src = 0;
    int dst = 0;
    TensorTag tag;
    friend bool operator==(const Key& a, const Key& b) {
      return a.src == b.src && a.dst == b.dst && a.tag == b.tag;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.src, k.dst, k.tag);
    }
  };

  std::unique_ptr<SendWork> Send(int src, int dst, const TensorTag& tag, const Tensor& t);
  absl::StatusOr<Tensor> Recv(int src, int dst, const TensorTag& tag, absl::Time deadline);
  void Abort(int rank, const absl::Status& reason);

  // baton::Mutex (a std::mutex) rather than absl::Mutex: Debian's prebuilt Abseil is not instrumented for
  // ThreadSanitizer, which would then report false races in everything it guards.
  mutable Mutex mu_;
  std::condition_variable arrived_;  // signalled on every delivery and on abort
  absl::flat_hash_map<Key, Tensor> mailbox_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);  // OK until an abort
  TransportCounters counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Transport>> ends_;  // fixed at construction
};

}  // namespace baton

#endif  // BATON_COMMON_COMM_INPROC_TRANSPORT_H_
