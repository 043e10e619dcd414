#include "worker/worker_agent.h"

#include <chrono>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/core/cuda_context.h"
#include "common/core/status.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "common/transport/grpc_transport.h"
#include "common/core/mutex.h"
#include "worker/job_reports.h"
#include "worker/worker_log.h"

namespace baton {

namespace {

std::unique_ptr<CoordinatorClient> GrpcCoordinator(const WorkerOptions& options,
                                                   const std::string& session) {
  GrpcCoordinatorClient::Options o;
  o.session = session;
  o.join_token = options.join_token;
  o.rpc_timeout = options.rpc_timeout;
  return std::make_unique<GrpcCoordinatorClient>(MakeChannel(options.coordinator_address), o);
}

LeaseOptions LeaseOptionsOf(const WorkerOptions& options) {
  LeaseOptions o;
  o.coordinator_address = options.coordinator_address;
  o.advertise_address = options.advertise_address;
  o.worker_id = options.worker_id;
  o.device = options.device;
  o.offer_nccl = options.device.kind() == "cuda" && options.rendezvous != nullptr;
  o.rpc_timeout = options.rpc_timeout;
  o.register_retry = options.register_retry;
  o.metrics = options.metrics;
  return o;
}

}  // namespace

WorkerAgent::WorkerAgent(WorkerOptions options, TensorInbox* inbox)
    : WorkerAgent(std::move(options), inbox, NewSecret()) {}

WorkerAgent::WorkerAgent(WorkerOptions options, TensorInbox* inbox, const std::string& session)
    : WorkerAgent(options, inbox, GrpcCoordinator(options, session), session) {}

WorkerAgent::WorkerAgent(WorkerOptions options, TensorInbox* inbox,
                         std::unique_ptr<CoordinatorClient> coordinator, std::string session)
    : options_(std::move(options)),
      inbox_(inbox),
      coordinator_(std::move(coordinator)),
      channels_(options_.tensor_channels ? options_.tensor_channels : MakeTensorChannel),
      lease_(LeaseOptionsOf(options_), coordinator_.get(), std::move(session),
             LeaseKeeper::Hooks{[this] { return RunningJob(); },
                                [this](const std::string& id, const std::string& reason) {
                                  // On the heartbeat thread: never wait for the job.
                                  AbortJob(id, reason, absl::ZeroDuration());
                                }}) {}

WorkerAgent::~WorkerAgent() { Stop(); }

void WorkerAgent::SetAdvertiseAddress(const std::string& address) {
  lease_.SetAdvertiseAddress(address);
}

void WorkerAgent::Start() { lease_.Start(); }

void WorkerAgent::Stop() {
  lease_.RequestStop();
  std::shared_ptr<JobRun> job;
  std::thread job_thread;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    job = job_;
    job_thread = std::move(job_thread_);
    wake_.notify_all();
  }
  if (job != nullptr) {
    job->Abort(absl::UnavailableError(absl::StrCat("worker ", worker_id(), " is shutting down")));
  }
  if (job_thread.joinable()) job_thread.join();
  lease_.Stop();  // joins the heartbeat thread and says goodbye
}

absl::Status WorkerAgent::CheckCoordinatorSession(absl::string_view session) const {
  return lease_.CheckCoordinatorSession(session);
}

std::string WorkerAgent::worker_id() const { return lease_.worker_id(); }

std::string WorkerAgent::RunningJob() const {
  MutexLock lock(mu_);
  return job_ != nullptr ? job_->plan().job_id() : "";
}

JobRunOptions WorkerAgent::RunOptions() {
  JobRunOptions o;
  o.worker_id = worker_id();
  o.inbox = inbox_;
  o.rendezvous = options_.rendezvous;
  o.channels = channels_.Factory();
  o.inbox_bytes = options_.inbox_bytes;
  o.nccl_init_timeout = options_.nccl_init_timeout;
  o.checkpoint_root = options_.checkpoint_root;
  o.data = options_.data;
  o.metrics = options_.metrics;
  o.memory_bytes = options_.device.memory_bytes();
  o.peak_flops = options_.device.peak_flops();
  o.peak_flops_bf16 = options_.device.peak_flops_bf16();
  return o;
}

absl::Status WorkerAgent::StartJob(const baton::v1::JobPlan& plan) {
  try {
    return StartJobOrThrow(plan);
  } catch (const std::bad_alloc&) {
    return OutOfMemoryError(worker_id(), options_.device.memory_bytes(), "taking the plan", plan);
  }
}

absl::Status WorkerAgent::StartJobOrThrow(const baton::v1::JobPlan& plan) {
  // Everything the plan's size decides is allocated before any state changes, so running
  // out of memory here leaves the worker as it was.
  BATON_ASSIGN_OR_RETURN(std::shared_ptr<JobRun> run, JobRun::Create(plan, RunOptions()));
  std::thread previous;
  {
    MutexLock lock(mu_);
    if (stopping_) return absl::UnavailableError("the worker is shutting down");
    if (job_ != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", worker_id(), " already runs job ", job_->plan().job_id()));
    }
    previous = std::move(job_thread_);
  }
  if (previous.joinable()) previous.join();  // a finished job's thread
  MutexLock lock(mu_);
  if (job_ != nullptr || stopping_) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id(), " is busy"));
  }
  job_ = run;
  if (options_.metrics != nullptr) options_.metrics->SetBusy(true);
  run->Open();
  WorkerLog(absl::StrCat("starting job ", plan.job_id(), " as rank ", plan.rank(), " of ",
                         plan.num_ranks()));
  job_thread_ = std::thread([this, run] { RunJob(run); });
  return absl::OkStatus();
}

bool WorkerAgent::AbortJob(const std::string& job_id, const std::string& reason,
                           absl::Duration wait) {
  std::shared_ptr<JobRun> job;
  {
    MutexLock lock(mu_);
    job = job_;
  }
  if (job == nullptr || job->plan().job_id() != job_id) return true;  // idempotent
  job->Abort(absl::AbortedError(reason));
  MutexLock lock(mu_);
  return wake_.wait_for(lock.native(), std::chrono::nanoseconds(absl::ToInt64Nanoseconds(wait)),
                        [this, &job]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return job_ != job; });
}

baton::v1::WorkerStatus WorkerAgent::Status() const {
  baton::v1::WorkerStatus s;
  s.set_worker_id(worker_id());
  MutexLock lock(mu_);
  if (job_ != nullptr) {
    s.set_state(baton::v1::WORKER_STATE_BUSY);
    s.set_job_id(job_->plan().job_id());
    s.set_rank(job_->plan().rank());
    s.set_steps_done(job_->steps_done());
  } else {
    s.set_state(baton::v1::WORKER_STATE_IDLE);
  }
  return s;
}

void WorkerAgent::RunJob(std::shared_ptr<JobRun> run) {
  CoordinatorProgressSink sink(
      coordinator_.get(), [this] { return worker_id(); }, run.get());
  const JobRun::Outcome outcome = run->Run(&sink);
  if (absl::Status fault = CudaDeviceFault(); !fault.ok()) {
    WorkerLog(
        absl::StrCat("leaving: ", fault.message(),
                     "; a new process gets a new context (the supervisor restarts this one)"));
    if (options_.on_device_fault) options_.on_device_fault(fault);
  }
  // The run is over: the worker is free before the coordinator hears of it, so a job it
  // places here on the result finds it idle (StartJob joins this thread).
  {
    MutexLock lock(mu_);
    job_.reset();
    if (options_.metrics != nullptr) options_.metrics->SetBusy(false);
    wake_.notify_all();  // AbortJob waits for this
  }
  ReportResult(*run, outcome);
}

void WorkerAgent::ReportResult(const JobRun& run, const JobRun::Outcome& outcome) {
  baton::v1::ReportResultRequest req = outcome.report;
  req.set_worker_id(worker_id());
  WorkerLog(absl::StrCat("job ", run.plan().job_id(), " rank ", run.plan().rank(), " ended: ",
                         outcome.status.ok() ? std::string("ok") : outcome.status.ToString()));
  // The coordinator may be restarting: retry for a while, then give up (the lease logic
  // settles the job).
  for (int attempt = 0; attempt < 10; ++attempt) {
    const absl::Status s = coordinator_->ReportResult(req).status();
    if (s.ok() || s.code() != absl::StatusCode::kUnavailable) {
      if (!s.ok()) WorkerLog(absl::StrCat("result report refused: ", s.ToString()));
      return;
    }
    MutexLock lock(mu_);
    if (wake_.wait_for(lock.native(), std::chrono::milliseconds(500),
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; })) {
      return;
    }
  }
  WorkerLog("could not report the result: coordinator unreachable");
}

}  // namespace baton
