// Out-of-band setup between the ranks of a cluster job, over baton's gRPC: what a peer sent
// through TensorService.Rendezvous (tensor.proto), kept by key until this worker's job
// takes it; and the NcclIdExchange that hands NCCL unique ids to peers that way (Gloo's
// rendezvous uses the same box: common/collective/grpc_gloo_store.h).
//
// Entries belong to a job attempt and its members. Keys name the attempt: they start with
// "baton/<kind>/job/<job key>/" (JobKeyOfRendezvousKey). The box holds values only for the
// attempts its worker runs (OpenJob, from StartJob, to CloseJob, when the attempt ends and
// its leftovers go), and only from the attempt's members: under mutual TLS, the callers
// whose certificate names one of the plan's ranks or replicas. A value for an attempt that
// is not open here is refused with UNAVAILABLE (its sender may be ahead of this worker's
// StartJob: SendRendezvous retries until its deadline), so strangers cannot file anything,
// and a full attempt (max_entries_per_job) refuses only more of its own.
//
// Errors never name the job key (it guards the job's tensor streams): RedactJobKey.
//
// Thread-safe.
#ifndef BATON_COMMON_TRANSPORT_RENDEZVOUS_H_
#define BATON_COMMON_TRANSPORT_RENDEZVOUS_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/transport/nccl_transport.h"
#include "common/core/mutex.h"
#include "grpcpp/grpcpp.h"

namespace baton {

// The job key a rendezvous key names ("baton/<kind>/job/<digits>/..."), or nullopt.
std::optional<uint64_t> JobKeyOfRendezvousKey(absl::string_view key);
// `text` with every "/job/<digits>" written "/job/<key>": for errors and logs.
std::string RedactJobKey(absl::string_view text);

class RendezvousBox {
 public:
  struct Options {
    // Per open attempt. A value is an NCCL id (128 bytes), a verdict, or a Gloo member's
    // addresses (about 136 bytes per member of its group: 16 KiB holds ~120 members).
    size_t max_entries_per_job = 1024;
    size_t max_value_bytes = 16 * 1024;
  };
  RendezvousBox() : RendezvousBox(Options()) {}
  explicit RendezvousBox(Options options) : options_(options) {}

  // Starts accepting values for the attempt `job_key` from `members` (the certificate names
  // of its ranks and replicas; empty: from any caller, as on a plaintext cluster). Opening
  // an open attempt again replaces its members.
  void OpenJob(uint64_t job_key, std::vector<std::string> members);
  // Stops accepting values for the attempt and drops what is held for it.
  void CloseJob(uint64_t job_key);

  // Keeps `value` under `key` from the caller `identity` ("" without a certificate). The
  // same value again is OK (a retried RPC); ALREADY_EXISTS for a different one;
  // INVALID_ARGUMENT for a key that names no attempt or a value over max_value_bytes;
  // UNAVAILABLE when the attempt is not open here; PERMISSION_DENIED when the attempt has
  // members and `identity` is none of them; RESOURCE_EXHAUSTED when the attempt holds
  // max_entries_per_job.
  absl::Status Put(const std::string& key, std::string value, absl::string_view identity = "");
  // Removes and returns the value under `key`, waiting for it until `deadline`
  // (DEADLINE_EXCEEDED naming the key, its job key redacted).
  absl::StatusOr<std::string> Take(const std::string& key, absl::Time deadline);
  // Drops every value whose key starts with `prefix`.
  void DropPrefix(const std::string& prefix);
  size_t size() const;

 private:
  struct Attempt {
    std::set<std::string> members;  // empty: anyone
    size_t entries = 0;
  };
  void EraseLocked(std::map<std::string, std::string>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable Mutex mu_;
  std::condition_variable put_;
  std::map<uint64_t, Attempt> open_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Sends `value` under `key` to the TensorService at the other end of `channel`, retrying
// a refused connection until `deadline` (the peer's worker may still be starting its
// server). Errors name the key.
absl::Status SendRendezvous(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, absl::Time deadline);

// The NcclIdExchange of a cluster job. Publish sends the id to the other rank of the edge
// its key names (nccl_internal::EdgeKey: ".../<src>-><dst>"); Fetch takes it from this
// worker's box, where the peer's Publish put it.
class GrpcNcclIdExchange final : public NcclIdExchange {
 public:
  // `channel_for(rank)`: a channel to that rank's TensorService. `box` is not owned.
  GrpcNcclIdExchange(int rank, RendezvousBox* box,
                     std::function<std::shared_ptr<grpc::Channel>(int)> channel_for,
                     absl::Duration publish_timeout);

  absl::Status Publish(const std::string& key, const NcclUniqueId& id) override;
  absl::StatusOr<NcclUniqueId> Fetch(const std::string& key, absl::Time deadline) override;

 private:
  const int rank_;
  RendezvousBox* const box_;
  const std::function<std::shared_ptr<grpc::Channel>(int)> channel_for_;
  const absl::Duration publish_timeout_;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_RENDEZVOUS_H_
