// libFuzzer target: arbitrary bytes as a SubmitJobRequest, handled by the coordinator core
// as the JobService hands it over (Coordinator::SubmitJob: validation, data-path
// confinement, the pipeline layout, inline data), then one round of the loop, which
// queues or places the job on two registered workers that accept every call. Nothing
// may crash, hang or allocate without bound; any returned status is fine.
#include <cstdint>
#include <memory>
#include <string>

#include "baton/v1/jobs.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/worker_client.h"
#include "google/protobuf/stubs/logging.h"

namespace {

class AcceptingWorkers final : public baton::WorkerClient {
 public:
  absl::Status StartJob(const baton::WorkerEndpoint&, const baton::v1::JobPlan&,
                        absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<baton::AbortAnswer> AbortJob(const baton::WorkerEndpoint&, const std::string&,
                                              const std::string&, absl::Duration) override {
    return baton::AbortAnswer::kStopped;
  }
};

// A coordinator with two idle workers. Time stands still (leases never run out, retries
// do not wait); a fresh one every 256 inputs, so the in-memory job store stays small.
std::unique_ptr<baton::Coordinator> NewCore() {
  baton::CoordinatorOptions o;
  o.db_path = ":memory:";
  o.log = false;
  o.background = false;
  o.clock = [] { return absl::FromUnixSeconds(1700000000); };
  o.sleep = [](absl::Duration) {};
  o.worker_client = std::make_shared<AcceptingWorkers>();
  o.data_roots = {"/usr/share/common-licenses"};
  auto c = baton::Coordinator::Create(std::move(o));
  if (!c.ok()) std::abort();
  for (int i = 0; i < 2; ++i) {
    baton::v1::RegisterWorkerRequest r;
    r.set_address("127.0.0.1:" + std::to_string(5000 + i));
    if (!(*c)->RegisterWorker(r).ok()) std::abort();
  }
  return *std::move(c);
}

baton::Coordinator* Core() {
  static std::unique_ptr<baton::Coordinator> core;
  static int uses = 0;
  if (core == nullptr || ++uses % 256 == 0) {
    if (core != nullptr) core->Stop();
    core = NewCore();
  }
  return core.get();
}

}  // namespace

// Protobuf logs every string field with invalid UTF-8 it meets; quiet, as the services
// would be under the same input if they logged it, which they do not.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::v1::SubmitJobRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  baton::Coordinator* core = Core();
  absl::StatusOr<baton::v1::Job> job = core->SubmitJob(request, "fuzz");
  core->Tick();
  if (job.ok()) {
    // Leave the workers free for the next input.
    baton::v1::CancelJobRequest cancel;
    cancel.set_job_id(job->id());
    (void)core->CancelJob(cancel);
    core->Tick();
  }
  return 0;
}
