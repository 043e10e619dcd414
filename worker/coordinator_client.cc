#include "worker/coordinator_client.h"

#include <utility>

#include "common/rpc/rpc.h"

namespace baton {

namespace {

// The answer of a unary call, or its status.
template <typename Response>
absl::StatusOr<Response> Answer(const grpc::Status& status, Response response) {
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

GrpcCoordinatorClient::GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                             Options options)
    : stub_(baton::v1::ClusterService::NewStub(std::move(channel))), options_(std::move(options)) {}

std::unique_ptr<grpc::ClientContext> GrpcCoordinatorClient::Context(absl::Duration timeout) const {
  std::unique_ptr<grpc::ClientContext> ctx = ContextWithTimeout(timeout);
  ctx->AddMetadata(kSessionMetadata, options_.session);
  return ctx;
}

absl::StatusOr<baton::v1::RegisterWorkerResponse> GrpcCoordinatorClient::RegisterWorker(
    const baton::v1::RegisterWorkerRequest& request) {
  std::unique_ptr<grpc::ClientContext> ctx = Context(options_.rpc_timeout);
  if (!options_.join_token.empty()) ctx->AddMetadata(kJoinTokenMetadata, options_.join_token);
  baton::v1::RegisterWorkerResponse resp;
  const grpc::Status s = stub_->RegisterWorker(ctx.get(), request, &resp);
  return Answer(s, std::move(resp));
}

absl::StatusOr<baton::v1::HeartbeatResponse> GrpcCoordinatorClient::Heartbeat(
    const baton::v1::HeartbeatRequest& request, absl::Duration timeout) {
  std::unique_ptr<grpc::ClientContext> ctx = Context(timeout);
  baton::v1::HeartbeatResponse resp;
  const grpc::Status s = stub_->Heartbeat(ctx.get(), request, &resp);
  return Answer(s, std::move(resp));
}

absl::StatusOr<baton::v1::ReportProgressResponse> GrpcCoordinatorClient::ReportProgress(
    const baton::v1::ReportProgressRequest& request) {
  std::unique_ptr<grpc::ClientContext> ctx = Context(options_.rpc_timeout);
  baton::v1::ReportProgressResponse resp;
  const grpc::Status s = stub_->ReportProgress(ctx.get(), request, &resp);
  return Answer(s, std::move(resp));
}

absl::StatusOr<baton::v1::ReportResultResponse> GrpcCoordinatorClient::ReportResult(
    const baton::v1::ReportResultRequest& request) {
  std::unique_ptr<grpc::ClientContext> ctx = Context(options_.rpc_timeout);
  baton::v1::ReportResultResponse resp;
  const grpc::Status s = stub_->ReportResult(ctx.get(), request, &resp);
  return Answer(s, std::move(resp));
}

}  // namespace baton
