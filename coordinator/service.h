// The coordinator's gRPC services: thin adapters over the Coordinator core. Each handler
// establishes who calls (JobService: the bearer token, auth.h; ClusterService: the
// certificate, join token and session metadata), calls the core, and converts its status
// with ToGrpcStatus. Refusals for credentials are counted in the coordinator's metrics.
#ifndef BATON_COORDINATOR_SERVICE_H_
#define BATON_COORDINATOR_SERVICE_H_

#include <string>

#include "baton/v1/cluster.grpc.pb.h"
#include "baton/v1/jobs.grpc.pb.h"
#include "coordinator/auth.h"
#include "coordinator/call_caps.h"
#include "coordinator/coordinator.h"

namespace baton {

// Each open WatchJob stream holds a server thread: they are capped in all and per caller
// (the token's name; the client host when the coordinator has no tokens and everyone is
// anonymous), and a stream past a cap is refused with RESOURCE_EXHAUSTED naming it
// (CallCaps). A viewer's streams then cannot lock out a submitter on the same host.
// ExportJob streams are capped the same way, by the core (CoordinatorOptions::max_exports).
struct WatchLimits {
  int total = 512;
  int per_caller = 64;
};

// baton.v1.JobService (clients). `core` and `auth` are not owned and must outlive the
// service; `auth` null: every caller is anonymous with the admin role. Roles needed
// (auth.h): viewer to read, submitter to submit, and to cancel a job of one's own, admin to
// cancel anyone's.
class JobServiceImpl final : public baton::v1::JobService::Service {
 public:
  explicit JobServiceImpl(Coordinator* core, WatchLimits limits = WatchLimits(),
                          const Authenticator* auth = nullptr)
      : core_(core), auth_(auth), watch_caps_("watch streams", limits.total, limits.per_caller) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const baton::v1::SubmitJobRequest* request,
                         baton::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const baton::v1::GetJobRequest* request,
                      baton::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const baton::v1::ListJobsRequest* request,
                        baton::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const baton::v1::CancelJobRequest* request,
                         baton::v1::Job* response) override;
  // Admins only.
  grpc::Status SetJobPriority(grpc::ServerContext* context,
                              const baton::v1::SetJobPriorityRequest* request,
                              baton::v1::Job* response) override;
  // Streams until the job's terminal state has been sent, the client goes away, or the
  // coordinator stops (UNAVAILABLE).
  grpc::Status WatchJob(grpc::ServerContext* context, const baton::v1::WatchJobRequest* request,
                        grpc::ServerWriter<baton::v1::JobEvent>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const baton::v1::ListWorkersRequest* request,
                           baton::v1::ListWorkersResponse* response) override;
  grpc::Status GetJobTrace(grpc::ServerContext* context,
                           const baton::v1::GetJobTraceRequest* request,
                           baton::v1::JobTrace* response) override;
  grpc::Status GetJobHistory(grpc::ServerContext* context,
                             const baton::v1::GetJobHistoryRequest* request,
                             baton::v1::JobHistory* response) override;
  // The job's submitter or an admin only (its weights are theirs). Sends the export as it
  // is read, one piece (ExportChunk) at a time: the memory it holds does not grow with the
  // model. The first piece carries step, total_bytes and checkpoint_dir.
  grpc::Status ExportJob(grpc::ServerContext* context, const baton::v1::ExportJobRequest* request,
                         grpc::ServerWriter<baton::v1::ExportChunk>* writer) override;

 private:
  // The caller, if it may do `what`, which needs `needed`; the refusal otherwise (counted).
  absl::StatusOr<Principal> Caller(const grpc::ServerContext& context, Role needed,
                                   absl::string_view what) const;
  // OK when `who` submitted `job_id` or is an admin; PERMISSION_DENIED naming the job and its
  // submitter otherwise (counted), NOT_FOUND for an unknown job.
  absl::Status OwnerOrAdmin(const Principal& who, const std::string& job_id,
                            absl::string_view what) const;
  // Who `who` is for the caps on streams: "caller NAME" (its token's name), or with no
  // tokens, where everyone is anonymous, "client host HOST".
  std::string CapsKey(const grpc::ServerContext& context, const Principal& who) const;

  Coordinator* const core_;
  const Authenticator* const auth_;
  CallCaps watch_caps_;
};

// baton.v1.ClusterService (workers). `core` is not owned and must outlive the service.
// RegisterWorker passes the caller's certificate identity and join token to the core;
// every other call is first checked to come from the process that registered the worker
// it names (Coordinator::AuthenticateWorker).
class ClusterServiceImpl final : public baton::v1::ClusterService::Service {
 public:
  explicit ClusterServiceImpl(Coordinator* core) : core_(core) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const baton::v1::RegisterWorkerRequest* request,
                              baton::v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const baton::v1::HeartbeatRequest* request,
                         baton::v1::HeartbeatResponse* response) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const baton::v1::ReportProgressRequest* request,
                              baton::v1::ReportProgressResponse* response) override;
  grpc::Status ReportResult(grpc::ServerContext* context,
                            const baton::v1::ReportResultRequest* request,
                            baton::v1::ReportResultResponse* response) override;

 private:
  // Counts `s` if it is a refusal for credentials; returns it.
  absl::Status Counted(absl::Status s) const;
  // Coordinator::AuthenticateWorker for the caller of `context`, counted.
  absl::Status CheckWorker(const grpc::ServerContext& context, const std::string& worker_id) const;

  Coordinator* const core_;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_SERVICE_H_
