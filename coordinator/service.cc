#include "coordinator/service.h"

#include <utility>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<Principal> JobServiceImpl::Caller(const grpc::ServerContext& context,
                                                 Role needed, absl::string_view what) const {
  absl::StatusOr<Principal> who = auth_ == nullptr
                                      ? Principal{kAnonymous, Role::kAdmin}
                                      : auth_->Authenticate(MetadataValue(context, "authorization"));
  absl::Status s = who.ok() ? Authorize(*who, needed, what) : who.status();
  if (s.ok()) return who;
  if (core_->options().metrics != nullptr) core_->options().metrics->AddAuthRefusal("jobs", s.code());
  return s;
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const baton::v1::SubmitJobRequest* request,
                                       baton::v1::Job* response) {
  absl::StatusOr<Principal> who = Caller(*context, Role::kSubmitter, "submit jobs");
  if (!who.ok()) return ToGrpcStatus(who.status());
  return Reply(core_->SubmitJob(*request, who->name, who->role == Role::kAdmin), response);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
                                    const baton::v1::GetJobRequest* request,
                                    baton::v1::Job* response) {
  if (auto who = Caller(*context, Role::kViewer, "read jobs"); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Reply(core_->GetJob(request->job_id()), response);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const baton::v1::ListJobsRequest* request,
                                      baton::v1::ListJobsResponse* response) {
  if (auto who = Caller(*context, Role::kViewer, "list jobs"); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Reply(core_->ListJobs(*request), response);
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const baton::v1::CancelJobRequest* request,
                                       baton::v1::Job* response) {
  absl::StatusOr<Principal> who = Caller(*context, Role::kSubmitter, "cancel jobs");
  if (!who.ok()) return ToGrpcStatus(who.status());
  // A submitter cancels only its own jobs (submitted_by never changes once recorded).
  if (absl::Status s = OwnerOrAdmin(*who, request->job_id(), "cancel"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return Reply(core_->CancelJob(*request), response);
}

grpc::Status JobServiceImpl::SetJobPriority(grpc::ServerContext* context,
                                            const baton::v1::SetJobPriorityRequest* request,
                                            baton::v1::Job* response) {
  if (auto who = Caller(*context, Role::kAdmin, "change a job's priority"); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Reply(core_->SetJobPriority(request->job_id(), request->priority()), response);
}

absl::Status JobServiceImpl::OwnerOrAdmin(const Principal& who, const std::string& job_id,
                                          absl::string_view what) const {
  if (who.role == Role::kAdmin) return absl::OkStatus();
  absl::StatusOr<baton::v1::Job> job = core_->GetJob(job_id);
  if (!job.ok()) return job.status();
  if (job->submitted_by() == who.name) return absl::OkStatus();
  absl::Status s = Authorize(
      who, Role::kAdmin, absl::StrCat(what, " ", job->id(), ", submitted by ", job->submitted_by()));
  if (core_->options().metrics != nullptr) {
    core_->options().metrics->AddAuthRefusal("jobs", s.code());
  }
  return s;
}

grpc::Status JobServiceImpl::ExportJob(grpc::ServerContext* context,
                                       const baton::v1::ExportJobRequest* request,
                                       grpc::ServerWriter<baton::v1::ExportChunk>* writer) {
  absl::StatusOr<Principal> who = Caller(*context, Role::kViewer, "export jobs");
  if (!who.ok()) return ToGrpcStatus(who.status());
  if (absl::Status s = OwnerOrAdmin(*who, request->job_id(), "export"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  // Holds a place under the export caps until this returns, however it returns.
  absl::StatusOr<std::unique_ptr<Coordinator::Export>> out =
      core_->ExportJob(*request, CapsKey(*context, *who));
  if (!out.ok()) return ToGrpcStatus(out.status());
  WeightsExport& weights = *(*out)->weights;
  baton::v1::ExportChunk chunk;
  chunk.set_step((*out)->step);
  chunk.set_total_bytes(static_cast<int64_t>(weights.total_bytes()));
  chunk.set_checkpoint_dir((*out)->dir);
  // Pieces of at most 1 MiB (kBlockStreamChunkBytes), well under gRPC's 4 MiB message bound;
  // the chunk's buffer is reused from piece to piece.
  for (;;) {
    if (absl::Status s = weights.Next(chunk.mutable_data()); !s.ok()) return ToGrpcStatus(s);
    if (chunk.data().empty()) return grpc::Status::OK;
    if (!writer->Write(chunk)) return ToGrpcStatus(absl::CancelledError("the client went away"));
    chunk.clear_step();
    chunk.clear_total_bytes();
    chunk.clear_checkpoint_dir();
  }
}

grpc::Status JobServiceImpl::GetJobTrace(grpc::ServerContext* context,
                                         const baton::v1::GetJobTraceRequest* request,
                                         baton::v1::JobTrace* response) {
  if (auto who = Caller(*context, Role::kViewer, "read traces"); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Reply(core_->GetJobTrace(*request), response);
}

grpc::Status JobServiceImpl::GetJobHistory(grpc::ServerContext* context,
                                           const baton::v1::GetJobHistoryRequest* request,
                                           baton::v1::JobHistory* response) {
  if (auto who = Caller(*context, Role::kViewer, "read job histories"); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Reply(core_->GetJobHistory(*request), response);
}

namespace {
// "ipv4:127.0.0.1:5555" -> "ipv4:127.0.0.1"; "ipv6:[::1]:5555" -> "ipv6:[::1]".
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  return colon != std::string::npos && colon != first ? peer.substr(0, colon) : peer;
}
}  // namespace

std::string JobServiceImpl::CapsKey(const grpc::ServerContext& context,
                                    const Principal& who) const {
  if (auth_ != nullptr && auth_->enabled()) return absl::StrCat("caller ", who.name);
  return absl::StrCat("client host ", PeerHost(context.peer()));
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const baton::v1::WatchJobRequest* request,
                                      grpc::ServerWriter<baton::v1::JobEvent>* writer) {
  absl::StatusOr<Principal> who = Caller(*context, Role::kViewer, "watch jobs");
  if (!who.ok()) return ToGrpcStatus(who.status());
  // Held until this returns.
  absl::StatusOr<CallCaps::Slot> slot = watch_caps_.Acquire(CapsKey(*context, *who));
  if (!slot.ok()) return ToGrpcStatus(slot.status());
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

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* context,
                                         const baton::v1::ListWorkersRequest*,
                                         baton::v1::ListWorkersResponse* response) {
  if (auto who = Caller(*context, Role::kViewer, "list workers"); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  *response = core_->ListWorkers();
  return grpc::Status::OK;
}

namespace {

WorkerCaller WorkerCallerOf(const grpc::ServerContext& context) {
  return {PeerIdentity(context), MetadataValue(context, kJoinTokenMetadata),
          MetadataValue(context, kSessionMetadata), PeerUris(context)};
}

}  // namespace

absl::Status ClusterServiceImpl::Counted(absl::Status s) const {
  if (!s.ok() && core_->options().metrics != nullptr) {
    core_->options().metrics->AddAuthRefusal("cluster", s.code());
  }
  return s;
}

absl::Status ClusterServiceImpl::CheckWorker(const grpc::ServerContext& context,
                                             const std::string& worker_id) const {
  return Counted(core_->AuthenticateWorker(worker_id, WorkerCallerOf(context)));
}

grpc::Status ClusterServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                                const baton::v1::RegisterWorkerRequest* request,
                                                baton::v1::RegisterWorkerResponse* response) {
  absl::StatusOr<baton::v1::RegisterWorkerResponse> r =
      core_->RegisterWorker(*request, WorkerCallerOf(*context));
  if (!r.ok()) (void)Counted(r.status());  // counts a refusal; the reply carries it
  return Reply(std::move(r), response);
}

grpc::Status ClusterServiceImpl::Heartbeat(grpc::ServerContext* context,
                                           const baton::v1::HeartbeatRequest* request,
                                           baton::v1::HeartbeatResponse* response) {
  if (absl::Status s = CheckWorker(*context, request->worker_id()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return Reply(core_->Heartbeat(*request), response);
}

grpc::Status ClusterServiceImpl::ReportProgress(grpc::ServerContext* context,
                                                const baton::v1::ReportProgressRequest* request,
                                                baton::v1::ReportProgressResponse* response) {
  if (absl::Status s = CheckWorker(*context, request->worker_id()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return Reply(core_->ReportProgress(*request), response);
}

grpc::Status ClusterServiceImpl::ReportResult(grpc::ServerContext* context,
                                              const baton::v1::ReportResultRequest* request,
                                              baton::v1::ReportResultResponse* response) {
  if (absl::Status s = CheckWorker(*context, request->worker_id()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return Reply(core_->ReportResult(*request), response);
}

}  // namespace baton
