// The worker's gRPC service: a thin adapter over WorkerAgent. Every call must come from the
// coordinator this worker registered with (its session secret in "x-baton-session"
// metadata, WorkerAgent::CheckCoordinatorSession).
#ifndef BATON_WORKER_SERVICE_H_
#define BATON_WORKER_SERVICE_H_

#include "baton/v1/worker.grpc.pb.h"
#include "worker/worker_agent.h"

namespace baton {

class WorkerServiceImpl final : public baton::v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(WorkerAgent* agent) : agent_(agent) {}

  grpc::Status StartJob(grpc::ServerContext* ctx, const baton::v1::StartJobRequest* req,
                        baton::v1::StartJobResponse* resp) override;
  grpc::Status AbortJob(grpc::ServerContext* ctx, const baton::v1::AbortJobRequest* req,
                        baton::v1::AbortJobResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const baton::v1::GetWorkerStatusRequest* req,
                         baton::v1::WorkerStatus* resp) override;

 private:
  absl::Status FromCoordinator(const grpc::ServerContext& ctx) const;

  WorkerAgent* const agent_;  // not owned
};

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_H_
