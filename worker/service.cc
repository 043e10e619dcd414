#include "worker/service.h"

#include "common/rpc/rpc.h"

namespace baton {

grpc::Status WorkerServiceImpl::StartJob(grpc::ServerContext*,
                                         const baton::v1::StartJobRequest* req,
                                         baton::v1::StartJobResponse*) {
  return ToGrpcStatus(agent_->StartJob(req->plan()));
}

grpc::Status WorkerServiceImpl::AbortJob(grpc::ServerContext*,
                                         const baton::v1::AbortJobRequest* req,
                                         baton::v1::AbortJobResponse*) {
  return ToGrpcStatus(agent_->AbortJob(req->job_id(), req->reason()));
}

grpc::Status WorkerServiceImpl::GetStatus(grpc::ServerContext*,
                                          const baton::v1::GetWorkerStatusRequest*,
                                          baton::v1::WorkerStatus* resp) {
  *resp = agent_->Status();
  return grpc::Status::OK;
}

}  // namespace baton
