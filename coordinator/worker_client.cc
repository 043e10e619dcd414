#include "coordinator/worker_client.h"

#include "absl/strings/str_cat.h"
#include "common/core/status.h"
#include "common/rpc/rpc.h"
#include "common/core/mutex.h"

namespace baton {

baton::v1::WorkerService::Stub* GrpcWorkerClient::StubFor(const std::string& address) {
  MutexLock lock(mu_);
  std::unique_ptr<baton::v1::WorkerService::Stub>& stub = stubs_[address];
  if (stub == nullptr) stub = baton::v1::WorkerService::NewStub(MakeChannel(address));
  return stub.get();
}

namespace {

std::unique_ptr<grpc::ClientContext> Context(const WorkerEndpoint& worker,
                                             absl::Duration timeout) {
  std::unique_ptr<grpc::ClientContext> ctx = ContextWithTimeout(timeout);
  ctx->AddMetadata(kSessionMetadata, worker.session);
  return ctx;
}

}  // namespace

absl::Status GrpcWorkerClient::StartJob(const WorkerEndpoint& worker,
                                        const baton::v1::JobPlan& plan, absl::Duration timeout) {
  baton::v1::StartJobRequest request;
  *request.mutable_plan() = plan;
  baton::v1::StartJobResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = Context(worker, timeout);
  return FromGrpcStatus(StubFor(worker.address)->StartJob(ctx.get(), request, &response));
}

absl::StatusOr<AbortAnswer> GrpcWorkerClient::AbortJob(const WorkerEndpoint& worker,
                                                       const std::string& job_id,
                                                       const std::string& reason,
                                                       absl::Duration timeout) {
  baton::v1::AbortJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  baton::v1::AbortJobResponse response;
  std::unique_ptr<grpc::ClientContext> ctx = Context(worker, timeout);
  BATON_RETURN_IF_ERROR(
      FromGrpcStatus(StubFor(worker.address)->AbortJob(ctx.get(), request, &response)));
  return response.stopped() ? AbortAnswer::kStopped : AbortAnswer::kStopping;
}

}  // namespace baton
