// How the coordinator talks to workers: the client side of baton.v1.WorkerService, behind
// an interface so the core can be tested with a fake.
#ifndef BATON_COORDINATOR_WORKER_CLIENT_H_
#define BATON_COORDINATOR_WORKER_CLIENT_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/worker.grpc.pb.h"
#include "baton/v1/worker.pb.h"
#include "common/core/mutex.h"

namespace baton {

// The worker a call goes to.
struct WorkerEndpoint {
  std::string address;  // "host:port"
  // Its session secret (WorkerRegistry::SessionOf), sent as "x-baton-session": the worker
  // accepts WorkerService calls only with it.
  std::string session;
};

// A worker's answer to AbortJob (AbortJobResponse.stopped).
enum class AbortAnswer {
  kStopped,   // no thread of the job runs there any more: the worker is free
  kStopping,  // told, but still stopping: it is free once its heartbeat reports no job
};

// Thread-safe: the coordinator calls it from several threads at once.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  // WorkerService.StartJob.
  virtual absl::Status StartJob(const WorkerEndpoint& worker, const baton::v1::JobPlan& plan,
                                absl::Duration timeout) = 0;
  // WorkerService.AbortJob; idempotent on the worker side.
  virtual absl::StatusOr<AbortAnswer> AbortJob(const WorkerEndpoint& worker,
                                               const std::string& job_id,
                                               const std::string& reason,
                                               absl::Duration timeout) = 0;
};

// The gRPC implementation: one channel and stub per address, created on first use and
// kept (gRPC channels reconnect by themselves).
class GrpcWorkerClient final : public WorkerClient {
 public:
  absl::Status StartJob(const WorkerEndpoint& worker, const baton::v1::JobPlan& plan,
                        absl::Duration timeout) override;
  absl::StatusOr<AbortAnswer> AbortJob(const WorkerEndpoint& worker, const std::string& job_id,
                                       const std::string& reason,
                                       absl::Duration timeout) override;

 private:
  baton::v1::WorkerService::Stub* StubFor(const std::string& address);

  Mutex mu_;
  std::map<std::string, std::unique_ptr<baton::v1::WorkerService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_COORDINATOR_WORKER_CLIENT_H_
