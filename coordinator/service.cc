#include "coordinator/service.h"

#include <utility>

#include "common/rpc/rpc.h"

namespace baton {
namespace {

// Copies a StatusOr's value into *out and converts its status.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* out) {
  if (result.ok()) *out = *std::move(result);
  return ToGrpcStatus(result.status());
}

// How long one wait for watch events lasts before the handler checks for cancellation.
constexpr absl::Duration kWatchPoll = absl::Milliseconds(200);

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*,
                                       const baton::v1::SubmitJobRequest* request,
                                       baton::v1::Job* response) {
  return Reply(core_->SubmitJob(*request), response);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const baton::v1::GetJobRequest* request,
                                    baton::v1::Job* response) {
  return Reply(core_->GetJob(request->job_id()), response);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*,
                                      const baton::v1::ListJobsRequest* request,
                                      baton::v1::ListJobsResponse* response) {
  return Reply(core_->ListJobs(*request), response);
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*,
                                       const baton::v1::CancelJobRequest* request,
                                       baton::v1::Job* response) {
  return Reply(core_->CancelJob(*request), response);
}

grpc::Status JobServiceImpl::GetJobTrace(grpc::ServerContext*,
                                         const baton::v1::GetJobTraceRequest* request,
                                         baton::v1::JobTrace* response) {
  return Reply(core_->GetJobTrace(*request), response);
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const baton::v1::WatchJobRequest* request,
                                      grpc::ServerWriter<baton::v1::JobEvent>* writer) {
  absl::StatusOr<std::unique_ptr<JobWatch>> watch = core_->WatchJob(request->job_id());
  if (!watch.ok()) return ToGrpcStatus(watch.status());
  bool done = false;
  while (!done) {
    if (context->IsCancelled()) return ToGrpcStatus(absl::CancelledError("watch cancelled"));
    absl::StatusOr<std::vector<baton::v1::JobEvent>> events = (*watch)->Next(kWatchPoll, &done);
    if (!events.ok()) return ToGrpcStatus(events.status());
    for (const baton::v1::JobEvent& e : *events) {
      if (!writer->Write(e)) return ToGrpcStatus(absl::CancelledError("the client went away"));
    }
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext*, const baton::v1::ListWorkersRequest*,
                                         baton::v1::ListWorkersResponse* response) {
  *response = core_->ListWorkers();
  return grpc::Status::OK;
}

grpc::Status ClusterServiceImpl::RegisterWorker(grpc::ServerContext*,
                                                const baton::v1::RegisterWorkerRequest* request,
                                                baton::v1::RegisterWorkerResponse* response) {
  return Reply(core_->RegisterWorker(*request), response);
}

grpc::Status ClusterServiceImpl::Heartbeat(grpc::ServerContext*,
                                           const baton::v1::HeartbeatRequest* request,
                                           baton::v1::HeartbeatResponse* response) {
  return Reply(core_->Heartbeat(*request), response);
}

grpc::Status ClusterServiceImpl::ReportProgress(grpc::ServerContext*,
                                                const baton::v1::ReportProgressRequest* request,
                                                baton::v1::ReportProgressResponse* response) {
  return Reply(core_->ReportProgress(*request), response);
}

grpc::Status ClusterServiceImpl::ReportResult(grpc::ServerContext*,
                                              const baton::v1::ReportResultRequest* request,
                                              baton::v1::ReportResultResponse* response) {
  return Reply(core_->ReportResult(*request), response);
}

}  // namespace baton
