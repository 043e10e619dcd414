#include "worker/service.h"

#include "common/rpc/rpc.h"

namespace baton {

absl::Status WorkerServiceImpl::FromCoordinator(const grpc::ServerContext& ctx) const {
  return agent_->CheckCoordinatorSession(MetadataValue(ctx, kSessionMetadata));
}

grpc::Status WorkerServiceImpl::StartJob(grpc::ServerContext* ctx,
                                         const baton::v1::StartJobRequest* req,
                                         baton::v1::StartJobResponse*) {
  if (absl::Status s = FromCoordinator(*ctx); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(agent_->StartJob(req->plan()));
}

grpc::Status WorkerServiceImpl::AbortJob(grpc::ServerContext* ctx,
                                         const baton::v1::AbortJobRequest* req,
                                         baton::v1::AbortJobResponse* resp) {
  if (absl::Status s = FromCoordinator(*ctx); !s.ok()) return ToGrpcStatus(s);
  resp->set_stopped(agent_->AbortJob(req->job_id(), req->reason(), agent_->abort_wait()));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::GetStatus(grpc::ServerContext* ctx,
                                          const baton::v1::GetWorkerStatusRequest*,
                                          baton::v1::WorkerStatus* resp) {
  if (absl::Status s = FromCoordinator(*ctx); !s.ok()) return ToGrpcStatus(s);
  *resp = agent_->Status();
  return grpc::Status::OK;
}

}  // namespace baton
