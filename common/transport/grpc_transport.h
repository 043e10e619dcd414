// GrpcTransport: the Transport (common/comm/transport.h) between worker processes.
//
// Sending: one sender thread and one long-lived client stream (TensorService.Push) per
// peer, on a channel created once per peer. Send() hands the tensor handle to the peer's
// queue without copying (the sender promises not to modify the tensor until the SendWork
// completes) and returns at once; the sender thread writes a header frame and chunk frames
// whose payload slices point into the tensor's memory (frames.h), so the bytes go from the
// tensor to the socket without a user-space copy. The SendWork completes when gRPC has
// written the last frame and released every reference to the tensor's memory.
//
// Receiving: Recv() takes from the worker's TensorInbox, which the worker's
// TensorServiceImpl fills (tensor_service.h); the inbox is the worker's, shared by the
// jobs it runs one after the other, and must be Open for this job.
//
// Deadlines everywhere: a send fails when it has not left within send_timeout of the Send
// call (also when the peer is unreachable: the sender waits up to that long for the
// connection, so peers may start in any order), a receive at its deadline, and shutdown
// is bounded by shutdown_timeout. A watchdog thread cancels a stream whose write is stuck
// past its deadline (e.g. a peer that stopped reading).
//
// Failures name the peer: "rank R: sending <tag> to rank P at ADDRESS: <reason>". A failed
// stream fails its tensor and every later send to that peer (the job is over anyway: the
// executor aborts the transport on the first error). A stream that ends badly while idle
// (the receiver refused a tensor that had already left, or the peer went away) aborts the
// transport with that reason, since tensors already counted as sent may be lost. A failed
// send completes at once; gRPC may still hold a reference to the tensor's memory for a
// moment (keeping it alive), so a sender that reuses the tensor after a failure may race
// only with bytes that no receiver will accept.
//
// Abort(reason) fails every pending and later Send, SendWork wait and Recv with ABORTED
// "rank R aborted: <reason>", aborts the inbox, and sends an abort frame to every peer it is
// connected to, so that their pending receives fail too instead of timing out; streams are
// then closed (cancelled if they do not close within a second).
//
// Thread-safe.
#ifndef BATON_COMMON_TRANSPORT_GRPC_TRANSPORT_H_
#define BATON_COMMON_TRANSPORT_GRPC_TRANSPORT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/v1/tensor.pb.h"
#include "common/comm/transport.h"
#include "common/transport/tensor_inbox.h"
#include "common/core/mutex.h"
#include "grpcpp/grpcpp.h"

namespace baton {

// Per-peer traffic of one GrpcTransport (for metrics).
struct PeerCounters {
  int64_t tensors_sent = 0;  // sends completed successfully
  int64_t bytes_sent = 0;
  int64_t tensors_received = 0;  // received through Recv
  int64_t bytes_received = 0;
};

// The channel the transport uses to reach `address`: MakeChannel's (common/rpc) with the
// settings bulk tensor streams want (see docs/benchmarks.md, "Tensor transport").
std::shared_ptr<grpc::Channel> MakeTensorChannel(const std::string& address);

class GrpcTransport final : public Transport {
 public:
  struct Options {
    int rank = 0;
    uint64_t job_key = 0;  // every tag sent must carry it (tag.job)
    // host:port of each rank's TensorService, by rank; this rank's own entry is ignored.
    std::vector<std::string> peer_addresses;
    // Payload bytes per chunk frame.
    int64_t chunk_bytes = int64_t{1} << 20;
    // A send fails when it has not left this long after the Send call.
    absl::Duration send_timeout = absl::Seconds(60);
    // Bounds Shutdown: queued sends that have not left by then fail, streams are cancelled.
    absl::Duration shutdown_timeout = absl::Seconds(10);
    // Creates the channel to a peer; MakeTensorChannel when empty. A worker may pass one
    // that caches channels across jobs.
    std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> make_channel;
  };

  // `inbox` (not owned) must outlive the transport.
  GrpcTransport(Options options, TensorInbox* inbox);
  ~GrpcTransport() override;  // Shutdown()
  GrpcTransport(const GrpcTransport&) = delete;
  GrpcTransport& operator=(const GrpcTransport&) = delete;

  const char* backend() const override { return "grpc"; }
  int rank() const override { return options_.rank; }

  std::unique_ptr<SendWork> Send(int peer, const TensorTag& tag, const Tensor& t) override;
  absl::StatusOr<Tensor> Recv(int peer, const TensorTag& tag, absl::Time deadline) override;
  void Abort(const absl::Status& reason) override;

  // Lets queued sends leave (until shutdown_timeout), closes the streams, joins the
  // threads. Later sends fail. Idempotent.
  void Shutdown();

  PeerCounters Counters(int peer) const;

 private:
  class Work;
  struct Item;
  struct Stream;
  struct Peer;

  void SenderLoop(Peer* peer);
  absl::Status SendItem(Peer* peer, Item& item);
  void SendAbortNotice(Peer* peer, const absl::Status& aborted);
  // Streams: created, their end watched by a finisher thread, closed, torn down.
  absl::Status OpenStream(Peer* peer, absl::Time deadline);
  void NewStream(Peer* peer);
  void StartFinisher(Peer* peer);
  void CloseStream(Peer* peer, absl::Time deadline, const baton::v1::TensorFrame* last);
  grpc::Status EndStream(Peer* peer);
  absl::Status StreamError(Peer* peer, const std::string& what);
  void WatchdogLoop();
  void SetWriteDeadline(Peer* peer, absl::Time deadline);
  // Fails every unfinished send to `peer` with "<its what>: reason"; the first failure
  // becomes the peer's sticky error.
  void FailPeerLocked(Peer* peer, absl::StatusCode code, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Where(const Peer& peer, const TensorTag& tag) const;

  const Options options_;
  TensorInbox* const inbox_;

  // baton::Mutex (a std::mutex) rather than absl::Mutex: Debian's prebuilt Abseil is not instrumented for
  // ThreadSanitizer.
  mutable Mutex mu_;
  std::condition_variable watchdog_cv_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);  // OK until Abort
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool watchdog_stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time shutdown_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // When the sleeping watchdog wakes up next (InfinitePast while it is awake).
  absl::Time watchdog_wakes_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for this rank. Fixed.
  std::thread watchdog_;
  std::once_flag shutdown_once_;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_GRPC_TRANSPORT_H_
