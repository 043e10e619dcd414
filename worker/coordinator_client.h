// CoordinatorClient: the calls a worker makes to the coordinator's ClusterService, as plain
// calls. The worker's pieces (the lease keeper, the job thread's reports) talk to the
// coordinator only through it; the product uses GrpcCoordinatorClient, tests a fake
// (worker/fake_coordinator_client.h).
//
// Every call returns the coordinator's answer or its status, code for code as gRPC's
// (UNAVAILABLE when it cannot be reached, DEADLINE_EXCEEDED past the call's deadline,
// PERMISSION_DENIED for a worker id another process holds now).
//
// Thread safety: implementations may be called from any thread, concurrently.
#ifndef BATON_WORKER_COORDINATOR_CLIENT_H_
#define BATON_WORKER_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/cluster.grpc.pb.h"

namespace baton {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  virtual absl::StatusOr<baton::v1::RegisterWorkerResponse> RegisterWorker(
      const baton::v1::RegisterWorkerRequest& request) = 0;
  // `timeout` bounds this call (a leaving worker waits less than the usual deadline).
  virtual absl::StatusOr<baton::v1::HeartbeatResponse> Heartbeat(
      const baton::v1::HeartbeatRequest& request, absl::Duration timeout) = 0;
  virtual absl::StatusOr<baton::v1::ReportProgressResponse> ReportProgress(
      const baton::v1::ReportProgressRequest& request) = 0;
  virtual absl::StatusOr<baton::v1::ReportResultResponse> ReportResult(
      const baton::v1::ReportResultRequest& request) = 0;
};

// The gRPC CoordinatorClient. Every call carries the worker's session secret (metadata
// kSessionMetadata) and a deadline of rpc_timeout unless the call says otherwise;
// RegisterWorker also carries the cluster's join token (kJoinTokenMetadata) when there is one.
class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  struct Options {
    std::string session;     // the secret sent with every call
    std::string join_token;  // empty: none
    absl::Duration rpc_timeout = absl::Seconds(5);
  };
  // `channel` leads to the coordinator (MakeChannel(address)).
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, Options options);

  absl::StatusOr<baton::v1::RegisterWorkerResponse> RegisterWorker(
      const baton::v1::RegisterWorkerRequest& request) override;
  absl::StatusOr<baton::v1::HeartbeatResponse> Heartbeat(const baton::v1::HeartbeatRequest& request,
                                                         absl::Duration timeout) override;
  absl::StatusOr<baton::v1::ReportProgressResponse> ReportProgress(
      const baton::v1::ReportProgressRequest& request) override;
  absl::StatusOr<baton::v1::ReportResultResponse> ReportResult(
      const baton::v1::ReportResultRequest& request) override;

 private:
  // A context with a deadline `timeout` from now and the session metadata.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;

  const std::unique_ptr<baton::v1::ClusterService::Stub> stub_;
  const Options options_;
};

}  // namespace baton

#endif  // BATON_WORKER_COORDINATOR_CLIENT_H_
