#include "worker/worker_agent.h"

#include "worker/checkpoint_writer.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/checkpoint.h"
#include "common/collective/gloo_collective.h"
#include "common/collective/grpc_gloo_store.h"
#include "common/collective/nccl_collective.h"
#include "common/core/cuda_context.h"
#include "common/core/host_info.h"
#include "common/core/log_text.h"
#include "common/core/paths.h"
#include "common/core/status.h"
#include "common/nn/model.h"
#include "common/plan/planner.h"
#include "common/pipeline/stage_executor.h"
#include "common/pipeline/step_trace.h"
#include "common/rpc/rpc.h"
#include "common/schedule/schedule.h"
#include "common/train/reference_trainer.h"
#include "common/spec/spec.h"
#include "common/transport/grpc_transport.h"
#include "common/nccl/nccl_api.h"
#include "common/transport/nccl_transport.h"
#include "common/transport/routed_transport.h"

namespace baton {

struct WorkerAgent::Job {
  explicit Job(baton::v1::JobPlan p) : plan(std::move(p)) {}
  const baton::v1::JobPlan plan;
  std::atomic<bool> aborted{false};
  std::atomic<int64_t> steps_done{0};
  std::mutex mu;  // guards the three below
  // Why the job was aborted: ABORTED when told to by the coordinator or a peer (an echo
  // of a failure elsewhere), UNAVAILABLE when this worker is shutting down (a root cause).
  absl::Status abort_status;
  Transport* transport = nullptr;  // while the job thread has one
  baton::v1::ReportResultRequest result;  // block digests, once every step ran
  // What the job thread is doing ("building blocks 0-7", "step 12"), for an out-of-memory
  // error to name. Written and read by the job thread only.
  std::string phase = "starting";
};

namespace {

void Log(const std::string& line) {
  // Lines carry text from the coordinator and its clients (abort reasons): keep one line.
  std::fprintf(stderr, "worker: %s\n", OneLine(line).c_str());
  std::fflush(stderr);
}

// What the coordinator calls this worker's rank: replica * num_ranks + rank (just the
// rank without data parallelism).
int GlobalRank(const baton::v1::JobPlan& plan) {
  return std::max(0, plan.replica()) * plan.num_ranks() + plan.rank();
}

absl::StatusOr<Schedule> ScheduleFromPlan(const baton::v1::JobPlan& plan) {
  Schedule s;
  absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(plan.schedule());
  s.kind = kind.ok() ? *kind : ScheduleKind::kCustom;
  s.num_ranks = plan.num_ranks();
  s.virtual_stages = plan.virtual_stages();
  s.num_microbatches = plan.microbatches();
  s.stage_to_rank.assign(plan.stage_to_rank().begin(), plan.stage_to_rank().end());
  if (plan.rank() < 0 || plan.rank() >= s.num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: rank ", plan.rank(), " outside ", s.num_ranks, " ranks"));
  }
  for (int r : s.stage_to_rank) {
    if (r < 0 || r >= s.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("plan: stage_to_rank names rank ", r));
    }
  }
  s.ranks.resize(s.num_ranks);  // only this rank's clock travels; the others stay empty
  for (const std::string& text : plan.actions()) {
    BATON_ASSIGN_OR_RETURN(Action a, Action::Parse(text));
    if (a.kind != ActionKind::kStep &&
        (a.stage < 0 || a.stage >= s.num_stages() || s.stage_to_rank[a.stage] != plan.rank())) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: action ", text, " is not for rank ", plan.rank()));
    }
    s.ranks[plan.rank()].push_back(a);
  }
  return s;
}

baton::v1::RankTiming Timing(const RankStepResult& r) {
  int64_t f = 0, b = 0, w = 0, send = 0, recv = 0;
  for (const ActionTiming& t : r.timeline) {
    const int64_t d = t.end_ns - t.start_ns;
    switch (t.action.kind) {
      case ActionKind::kForward: f += d; break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: b += d; break;
      case ActionKind::kBackwardWeight: w += d; break;
      case ActionKind::kSendF:
      case ActionKind::kSendB: send += d; break;
      case ActionKind::kRecvF:
      case ActionKind::kRecvB: recv += d; break;
      case ActionKind::kStep:
      case ActionKind::kReduceGrad: break;  // queues the reduction; its time is its own
    }
  }
  baton::v1::RankTiming out;
  *out.mutable_forward() = ToProtoDuration(absl::Nanoseconds(f));
  *out.mutable_backward() = ToProtoDuration(absl::Nanoseconds(b));
  *out.mutable_weight() = ToProtoDuration(absl::Nanoseconds(w));
  *out.mutable_send() = ToProtoDuration(absl::Nanoseconds(send));
  *out.mutable_recv_wait() = ToProtoDuration(absl::Nanoseconds(recv));
  // The step ends after its final send waits (end_ns), not at its last action.
  *out.mutable_step() = ToProtoDuration(absl::Nanoseconds(r.end_ns));
  out.set_peak_inflight(r.peak_inflight);
  int64_t reduce = 0, reduce_bytes = 0;
  for (const ActionTiming& t : r.reductions) {
    reduce += t.end_ns - t.start_ns;
    reduce_bytes += t.bytes;
  }
  if (!r.reductions.empty()) {
    *out.mutable_reduce() = ToProtoDuration(absl::Nanoseconds(reduce));
    out.set_reduce_bytes(reduce_bytes);
    *out.mutable_reduce_wait() = ToProtoDuration(absl::Nanoseconds(r.reduce_wait_ns));
  }
  return out;
}

// What kind of failure ended a rank, for the coordinator's decision to recover or fail.
baton::v1::FailureCause FailureCauseOf(const absl::Status& s, bool aborted) {
  if (IsDiverged(s)) return baton::v1::FAILURE_CAUSE_DIVERGED;
  if (aborted) {
    // Told to stop (ABORTED), or stopping because this worker shuts down (UNAVAILABLE).
    return s.code() == absl::StatusCode::kUnavailable ? baton::v1::FAILURE_CAUSE_SHUTDOWN
                                                      : baton::v1::FAILURE_CAUSE_ABORTED;
  }
  switch (s.code()) {
    case absl::StatusCode::kAborted:  // a peer's abort reached this rank
      return baton::v1::FAILURE_CAUSE_ABORTED;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return baton::v1::FAILURE_CAUSE_PEER;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kAlreadyExists:
      return baton::v1::FAILURE_CAUSE_CONFIG;
    default:
      return baton::v1::FAILURE_CAUSE_INTERNAL;
  }
}

}  // namespace

WorkerAgent::WorkerAgent(WorkerOptions options, TensorInbox* inbox)
    : options_(std::move(options)),
      inbox_(inbox),
      cluster_(baton::v1::ClusterService::NewStub(MakeChannel(options_.coordinator_address))),
      session_(NewSecret()) {
  worker_id_ = options_.worker_id;
}

std::unique_ptr<grpc::ClientContext> WorkerAgent::ClusterContext() const {
  std::unique_ptr<grpc::ClientContext> ctx = ContextWithTimeout(options_.rpc_timeout);
  ctx->AddMetadata(kSessionMetadata, session_);
  return ctx;
}

absl::Status WorkerAgent::CheckCoordinatorSession(absl::string_view session) const {
  if (session.empty()) {
    return absl::UnauthenticatedError(
        "no x-baton-session metadata: WorkerService takes calls from the coordinator only");
  }
  if (!SecretsEqual(session, session_)) {
    return absl::PermissionDeniedError(
        "the caller is not the coordinator this worker registered with");
  }
  return absl::OkStatus();
}

WorkerAgent::~WorkerAgent() { Stop(); }

void WorkerAgent::SetAdvertiseAddress(const std::string& address) {
  options_.advertise_address = address;
}

void WorkerAgent::Start() {
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
}

void WorkerAgent::Stop() {
  std::shared_ptr<Job> job;
  std::thread job_thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !heartbeat_thread_.joinable() && !job_thread_.joinable()) return;
    stopping_ = true;
    job = job_;
    job_thread = std::move(job_thread_);
    wake_.notify_all();
  }
  if (job != nullptr) {
    Abort(*job, absl::UnavailableError(absl::StrCat("worker ", worker_id(), " is shutting down")));
  }
  if (job_thread.joinable()) job_thread.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  // Say goodbye, so that the coordinator sends this worker no more jobs (best effort: a
  // coordinator that does not answer lets the lease run out).
  bool registered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registered = registered_;
  }
  if (registered) {
    baton::v1::HeartbeatRequest req;
    req.set_worker_id(worker_id());
    req.set_leaving(true);
    baton::v1::HeartbeatResponse resp;
    std::unique_ptr<grpc::ClientContext> ctx = ClusterContext();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + std::min(options_.rpc_timeout,
                                                                  absl::Seconds(2))));
    const absl::Status s = FromGrpcStatus(cluster_->Heartbeat(ctx.get(), req, &resp));
    Log(s.ok() ? "told the coordinator this worker is leaving"
               : absl::StrCat("could not tell the coordinator this worker is leaving: ",
                              s.ToString()));
  }
}

std::string WorkerAgent::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

absl::Status WorkerAgent::Register() {
  baton::v1::RegisterWorkerRequest req;
  req.set_address(options_.advertise_address);
  *req.mutable_device() = options_.device;
  req.add_capabilities("transport/grpc");
  // NCCL needs a GPU and the library: say so only when both are here.
  if (options_.device.kind() == "cuda" && options_.rendezvous != nullptr && LoadNccl().ok()) {
    req.add_capabilities(kNcclCapability);
  }
  req.set_worker_id(worker_id());
  req.set_session_token(session_);
  baton::v1::RegisterWorkerResponse resp;
  auto ctx = ClusterContext();
  if (!options_.join_token.empty()) ctx->AddMetadata(kJoinTokenMetadata, options_.join_token);
  BATON_RETURN_IF_ERROR(FromGrpcStatus(cluster_->RegisterWorker(ctx.get(), req, &resp)));
  std::lock_guard<std::mutex> lock(mu_);
  worker_id_ = resp.worker_id();
  registered_ = true;
  if (options_.metrics != nullptr) options_.metrics->SetDevice(worker_id_, options_.device);
  const absl::Duration interval = FromProtoDuration(resp.heartbeat_interval());
  heartbeat_interval_ = interval > absl::ZeroDuration() ? interval : absl::Seconds(1);
  Log(absl::StrCat("registered as ", worker_id_, " with ", options_.coordinator_address,
                   " (heartbeat every ", absl::FormatDuration(heartbeat_interval_), ")"));
  return absl::OkStatus();
}

void WorkerAgent::HeartbeatLoop() {
  int failures = 0;
  while (true) {
    absl::Duration wait;
    bool registered;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      registered = registered_;
      wait = heartbeat_interval_;
    }
    if (!registered) {
      absl::Status s = Register();
      if (!s.ok()) {
        if (failures++ % 20 == 0) {
          Log(absl::StrCat("cannot register with ", options_.coordinator_address, ": ",
                           s.ToString(), " (retrying)"));
        }
        wait = options_.register_retry;
      } else {
        failures = 0;
        continue;  // heartbeat right away
      }
    } else {
      baton::v1::HeartbeatRequest req;
      baton::v1::HeartbeatResponse resp;
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> lock(mu_);
        req.set_worker_id(worker_id_);
        job = job_;
      }
      if (job != nullptr) req.set_job_id(job->plan.job_id());
      auto ctx = ClusterContext();
      absl::Status s = FromGrpcStatus(cluster_->Heartbeat(ctx.get(), req, &resp));
      // PERMISSION_DENIED: the id is another process's now (this one's lease ran out).
      const bool denied = s.code() == absl::StatusCode::kPermissionDenied;
      if (!s.ok() && !denied) {
        if (failures++ % 20 == 0) Log(absl::StrCat("heartbeat failed: ", s.ToString()));
      } else {
        failures = 0;
        if (denied || !resp.known()) {
          // It restarted or let the lease expire: any job it gave us has been failed.
          Log(denied ? absl::StrCat("heartbeat refused (", s.message(), "); registering again")
                     : "the coordinator does not know this worker; registering again");
          if (job != nullptr) {
            AbortJob(job->plan.job_id(), "the coordinator no longer knows this worker")
                .IgnoreError();
          }
          std::lock_guard<std::mutex> lock(mu_);
          registered_ = false;
          continue;
        }
        for (const std::string& id : resp.abort_job_ids()) {
          AbortJob(id, "the coordinator no longer runs this job").IgnoreError();
        }
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, absl::ToChronoNanoseconds(wait), [this] { return stopping_; });
  }
}

absl::Status WorkerAgent::StartJob(const baton::v1::JobPlan& plan) {
  try {
    return StartJobOrThrow(plan);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("taking the plan", plan);
  }
}

absl::Status WorkerAgent::StartJobOrThrow(const baton::v1::JobPlan& plan) {
  // Refuse a job this worker cannot checkpoint or resume now, not at its first checkpoint.
  // INVALID_ARGUMENT, not FAILED_PRECONDITION: the coordinator retries the latter (busy).
  // Only under this worker's checkpoint root, whatever the coordinator let through.
  if (plan.spec().has_checkpoint()) {
    absl::StatusOr<std::string> root = ConfinedCheckpointDir(plan.spec().checkpoint().dir());
    if (!root.ok()) return root.status();
    const std::string dir = CheckpointJobDir(*root, plan.job_id());
    if (absl::Status w = CheckCheckpointDirWritable(dir); !w.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.dir on worker ", worker_id(), ": ", w.message()));
    }
  }
  if (!plan.resume_job_dir().empty()) {
    if (absl::StatusOr<std::string> in = ConfinedCheckpointDir(plan.resume_job_dir()); !in.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume_from: ", in.status().message()));
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(plan.resume_job_dir(), ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume_from: worker ", worker_id(), " cannot see the checkpoint directory ",
          plan.resume_job_dir(), " (is checkpoint.dir mounted on every worker?)"));
    }
  }
  if (absl::Status fault = CudaDeviceFault(); !fault.ok()) {
    return absl::UnavailableError(
        absl::StrCat("worker ", worker_id(), " is leaving: ", fault.message()));
  }
  // A CPU job this process cannot hold now is refused before anything is built: running
  // out of memory mid-job is the last resort (RunJob), not the plan. (A GPU job's memory is
  // the GPU's, which placement checked.)
  if (plan.spec().device() != baton::v1::DEVICE_KIND_CUDA) {
    const int64_t need = RankNeedBytes(plan.spec());
    const int64_t usable = UsableMemoryBytes();
    if (need > 0 && usable > 0 && need > usable) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker ", worker_id(), " cannot hold rank ", plan.rank(), " of ", plan.job_id(),
          ": it needs about ", HumanBytes(static_cast<double>(need)),
          " (parameters, gradients, optimizer state, activations in flight), and this worker "
          "can allocate ", HumanBytes(static_cast<double>(usable)), " now"));
    }
  }
  // Everything the plan's size decides is allocated before any state changes, so running
  // out of memory here leaves the worker as it was. The inbox will accept the tensors this
  // rank's clock receives, from their ranks.
  absl::StatusOr<Schedule> schedule = ScheduleFromPlan(plan);
  if (!schedule.ok()) return schedule.status();
  InboxPlan inbox_plan = PlanInbox(plan, *schedule, options_.inbox_bytes);
  std::vector<std::string> members = RendezvousMembers(plan);
  auto job = std::make_shared<Job>(plan);
  std::thread previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the worker is shutting down");
    if (job_ != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker_id_, " already runs job ", job_->plan.job_id()));
    }
    previous = std::move(job_thread_);
  }
  if (previous.joinable()) previous.join();  // a finished job's thread
  std::lock_guard<std::mutex> lock(mu_);
  if (job_ != nullptr || stopping_) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id_, " is busy"));
  }
  job_ = std::move(job);
  if (options_.metrics != nullptr) options_.metrics->SetBusy(true);
  // Accept the job's tensors before answering: once every rank has answered StartJob, any
  // peer may send to this one (the coordinator starts rank 0, the first sender, last).
  // Its rendezvous values too (the members' NCCL ids, verdicts and Gloo addresses), until
  // the attempt ends.
  inbox_->Open(std::move(inbox_plan));
  if (options_.rendezvous != nullptr) {
    options_.rendezvous->OpenJob(plan.job_key(), std::move(members));
  }
  Log(absl::StrCat("starting job ", plan.job_id(), " as rank ", plan.rank(), " of ",
                   plan.num_ranks()));
  job_thread_ = std::thread([this, job = job_] { RunJob(job); });
  return absl::OkStatus();
}

absl::Status WorkerAgent::OutOfMemory(const std::string& what,
                                      const baton::v1::JobPlan& plan) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "worker ", worker_id(), " ran out of memory while ", what, " (", plan.job_id(), " rank ",
      plan.rank(), "; it offers ", options_.device.memory_bytes() >> 20,
      " MiB): the job needs more than this worker can allocate"));
}

absl::StatusOr<std::string> WorkerAgent::ConfinedCheckpointDir(const std::string& dir) const {
  if (options_.checkpoint_root.empty()) return dir;
  absl::StatusOr<std::string> in = ConfineCheckpointDir(dir, options_.checkpoint_root);
  if (!in.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker_id(), ": ", in.status().message()));
  }
  return in;
}

absl::Status WorkerAgent::AbortJob(const std::string& job_id, const std::string& reason) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_;
  }
  if (job == nullptr || job->plan.job_id() != job_id) return absl::OkStatus();  // idempotent
  Abort(*job, absl::AbortedError(reason));
  return absl::OkStatus();
}

void WorkerAgent::Abort(Job& job, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(job.mu);
  if (!job.aborted.exchange(true)) {
    job.abort_status = why;
    Log(absl::StrCat("aborting job ", job.plan.job_id(), ": ", why.message()));
  }
  if (job.transport != nullptr) job.transport->Abort(job.abort_status);
}

baton::v1::WorkerStatus WorkerAgent::Status() const {
  baton::v1::WorkerStatus s;
  std::lock_guard<std::mutex> lock(mu_);
  s.set_worker_id(worker_id_);
  if (job_ != nullptr) {
    s.set_state(baton::v1::WORKER_STATE_BUSY);
    s.set_job_id(job_->plan.job_id());
    s.set_rank(job_->plan.rank());
    s.set_steps_done(job_->steps_done.load());
  } else {
    s.set_state(baton::v1::WORKER_STATE_IDLE);
  }
  return s;
}

namespace {
// Transport errors name peers by rank and address; add the worker ids the coordinator and
// users know them by.
absl::Status NamePeers(const absl::Status& s, const baton::v1::JobPlan& plan) {
  if (s.ok()) return s;
  std::string msg(s.message());
  std::string names;
  for (const baton::v1::Peer& p : plan.peers()) {
    if (!p.address().empty() && msg.find(p.address()) != std::string::npos &&
        !p.worker_id().empty()) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", p.address(), " is worker ",
                      p.worker_id());
    }
  }
  // A failed all-reduce names the data-parallel group (Gloo's and NCCL's errors name their
  // own ports, not baton's workers).
  if (plan.replica_peers_size() > 1 && msg.find("all-reduce") != std::string::npos) {
    std::vector<std::string> members;
    for (const baton::v1::Peer& p : plan.replica_peers()) {
      members.push_back(absl::StrCat("replica ", p.rank(), " on ", p.worker_id()));
    }
    absl::StrAppend(&names, names.empty() ? "" : "; ", "data-parallel group of rank ",
                    plan.rank(), ": ", absl::StrJoin(members, ", "));
  }
  if (names.empty()) return s;
  return WithMessage(s, absl::StrCat(msg, " [", names, "]"));
}
}  // namespace

void WorkerAgent::RunJob(std::shared_ptr<Job> job) {
  absl::Status status;
  try {
    status = NamePeers(RunSteps(*job), job->plan);
  } catch (const std::bad_alloc&) {
    // Whatever RunSteps held is released by now; what the allocators cached of it goes
    // back to the system, so the worker keeps serving.
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->transport = nullptr;
    }
    CpuAllocator()->ReleaseCached();
    malloc_trim(0);
    status = OutOfMemory(job->phase, job->plan);
  }
  inbox_->Close();  // also when RunSteps failed before it had a transport
  // The attempt's rendezvous values expire with it; later ones for it are refused.
  if (options_.rendezvous != nullptr) options_.rendezvous->CloseJob(job->plan.job_key());
  if (!status.ok() && job->aborted.load()) {
    std::lock_guard<std::mutex> lock(job->mu);
    status = absl::Status(job->abort_status.code(),
                          absl::StrCat("aborted: ", job->abort_status.message()));
  }
  FinishJob(*job, status);
  if (absl::Status fault = CudaDeviceFault(); !fault.ok()) {
    Log(absl::StrCat("leaving: ", fault.message(),
                     "; a new process gets a new context (the supervisor restarts this one)"));
    if (options_.on_device_fault) options_.on_device_fault(fault);
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_.reset();
  if (options_.metrics != nullptr) options_.metrics->SetBusy(false);
  wake_.notify_all();
}

absl::Status WorkerAgent::RunSteps(Job& job) {
  const baton::v1::JobPlan& plan = job.plan;
  baton::v1::JobSpec spec = plan.spec();
  BATON_RETURN_IF_ERROR(ValidateAndDefaultJobSpec(&spec));
  if (spec.has_checkpoint()) {  // where StartJob checked it lies
    BATON_ASSIGN_OR_RETURN(std::string dir, ConfinedCheckpointDir(spec.checkpoint().dir()));
    spec.mutable_checkpoint()->set_dir(std::move(dir));
  }
  BATON_RETURN_IF_ERROR(RequireChosenSchedule(spec));
  BATON_ASSIGN_OR_RETURN(Schedule schedule, ScheduleFromPlan(plan));
  std::vector<BlockRange> blocks(plan.stages_size());
  for (const baton::v1::StagePlan& sp : plan.stages()) {
    if (sp.stage() < 0 || sp.stage() >= plan.stages_size()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: stage ", sp.stage(), " out of range"));
    }
    blocks[sp.stage()] = BlockRange{sp.first_block(), sp.last_block()};
  }
  GrpcTransport::Options topts;
  topts.rank = plan.rank();
  topts.job_key = plan.job_key();
  topts.peer_addresses.resize(plan.num_ranks());
  for (const baton::v1::Peer& p : plan.peers()) {
    if (p.rank() >= 0 && p.rank() < plan.num_ranks()) topts.peer_addresses[p.rank()] = p.address();
  }
  const absl::Duration recv_timeout =
      plan.has_recv_timeout() ? FromProtoDuration(plan.recv_timeout()) : absl::Seconds(60);
  topts.send_timeout = recv_timeout;
  topts.make_channel = [this](const std::string& address) { return TensorChannel(address); };
  // gRPC serves every link that does not use NCCL; NCCL the links both ends brought up.
  job.phase = "setting up the transport";
  auto grpc = std::make_unique<GrpcTransport>(topts, inbox_);
  std::vector<LinkPlan> links = PlanLinks(plan, Neighbours(schedule, plan.rank()));
  absl::StatusOr<std::unique_ptr<Transport>> nccl = BringUpNccl(plan, &links);
  if (options_.rendezvous != nullptr) {
    options_.rendezvous->DropPrefix(JobRendezvousPrefix(plan.job_key()));
  }
  if (!nccl.ok()) return nccl.status();
  std::vector<Transport*> by_peer(plan.num_ranks(), nullptr);
  for (const LinkPlan& l : links) {
    if (l.peer >= 0 && l.peer < plan.num_ranks()) {
      by_peer[l.peer] = l.nccl ? nccl->get() : static_cast<Transport*>(grpc.get());
    }
  }
  auto transport = std::make_unique<RoutedTransport>(plan.rank(), std::move(by_peer));
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.transport = transport.get();
    if (job.aborted.load()) transport->Abort(job.abort_status);
  }
  auto cleanup = [&] {
    {
      std::lock_guard<std::mutex> lock(job.mu);
      job.transport = nullptr;
    }
    transport.reset();
    nccl->reset();
    grpc.reset();
    inbox_->Close();
  };
  // Data parallelism: join this rank's group (the same rank of every replica).
  std::unique_ptr<Collective> collective;
  baton::v1::GroupReport group;
  if (std::max(1, plan.data_parallel()) > 1) {
    job.phase = "joining the data-parallel group";
    absl::StatusOr<std::unique_ptr<Collective>> c = JoinReplicaGroup(plan, recv_timeout, &group);
    if (!c.ok()) {
      cleanup();
      return c.status();
    }
    collective = *std::move(c);
  }
  StageExecutorOptions eo;
  eo.replica = plan.replica();
  eo.collective = collective.get();
  eo.job_id = plan.job_key();
  eo.data = options_.data;
  eo.recv_timeout = recv_timeout;
  // Placement wrote the device every rank computes on into the plan's spec.
  eo.device = spec.device() == baton::v1::DEVICE_KIND_CUDA ? Device::kCuda : Device::kCpu;
  if (options_.metrics != nullptr) {
    JobMetricsInfo info;
    info.job_id = plan.job_id();
    info.rank = plan.rank();
    for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
      if (schedule.stage_to_rank[s] == plan.rank()) info.stages.push_back(s);
    }
    info.transport = transport->backend();
    for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
      const std::string b = transport->BackendFor(schedule.stage_to_rank[s]);
      info.transport_by_stage[s] = b.empty() ? transport->backend() : b;
    }
    info.samples_per_step = spec.data().batch_size();
    if (collective != nullptr) info.collective = collective->engine();
    info.tokens_per_step = TokensPerStep(spec);
    eo.observer = options_.metrics->BeginJob(info);
  }
  {
    std::vector<std::string> mine;
    for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
      if (schedule.stage_to_rank[s] == plan.rank() && s < static_cast<int>(blocks.size())) {
        mine.push_back(absl::StrCat(blocks[s].first, "-", blocks[s].last - 1));
      }
    }
    job.phase = absl::StrCat("building its blocks (", absl::StrJoin(mine, ", "), ")");
  }
  absl::StatusOr<std::unique_ptr<StageExecutor>> ex =
      StageExecutor::Create(spec, schedule, blocks, plan.rank(), transport.get(), eo);
  if (!ex.ok()) {
    cleanup();
    return ex.status();
  }
  const bool owns_last = schedule.stage_to_rank.back() == plan.rank();
  std::vector<std::string> block_names;
  for (const BlockInfo& b : DescribeBlocks(spec.model())) block_names.push_back(b.name);
  // Resume: every rank picks the same checkpoint (the newest complete one at or before the
  // plan's step, by the same files) and says which in its first report.
  int64_t first_step = 0;
  std::vector<std::string> skipped;
  if (!plan.resume_job_dir().empty()) {
    job.phase = absl::StrCat("loading a checkpoint from ", plan.resume_job_dir());
    // resume_step 0: the newest complete one (a recovery).
    absl::StatusOr<int64_t> at = LatestCompleteCheckpoint(
        plan.resume_job_dir(), block_names, plan.resume_step() > 0 ? plan.resume_step() : -1,
        &skipped);
    absl::StatusOr<int64_t> loaded =
        at.ok() ? (*ex)->LoadCheckpoint(CheckpointStepDir(plan.resume_job_dir(), *at))
                : at.status();
    if (!loaded.ok()) {
      cleanup();
      std::string why = absl::StrJoin(skipped, "; ");
      return absl::Status(loaded.status().code(),
                          absl::StrCat("resume from ", plan.resume_job_dir(), ": ",
                                       loaded.status().message(),
                                       why.empty() ? "" : absl::StrCat(" (", why, ")")));
    }
    first_step = *loaded;
    job.steps_done.store(first_step);
    // A recovery resumes from the job's own checkpoints: what an earlier attempt wrote
    // after this step (perhaps by another partition, with other manifests) goes. Rank 0
    // alone, before its first step: no rank can finish a step, let alone write one, before
    // rank 0 has started it.
    if (plan.rank() == 0 && plan.replica() == 0 && spec.has_checkpoint() &&
        plan.resume_job_dir() == CheckpointJobDir(spec.checkpoint().dir(), plan.job_id())) {
      for (int64_t later : ListCheckpointSteps(plan.resume_job_dir())) {
        if (later <= first_step) continue;
        std::error_code ec;
        std::filesystem::remove_all(CheckpointStepDir(plan.resume_job_dir(), later), ec);
        if (ec) Log(absl::StrCat("removing an earlier attempt's step ", later, ": ", ec.message()));
      }
    }
    Log(absl::StrCat("job ", plan.job_id(), " resumes from ", plan.resume_job_dir(), " step ",
                     first_step));
  }
  const std::string checkpoint_dir =
      spec.has_checkpoint() ? CheckpointJobDir(spec.checkpoint().dir(), plan.job_id()) : "";
  // Its destructor waits for a write in flight, on every way out of this function.
  std::unique_ptr<CheckpointWriter> writer;
  // Every replica holds the same weights and optimizer state: replica 0's ranks write them.
  if (!checkpoint_dir.empty() && plan.replica() == 0) {
    writer = std::make_unique<CheckpointWriter>(checkpoint_dir, block_names,
                                                spec.checkpoint().keep());
  }
  absl::Status status;
  for (int64_t step = first_step; step < spec.steps() && status.ok(); ++step) {
    if (job.aborted.load()) {
      status = absl::AbortedError("aborted");
      break;
    }
    job.phase = absl::StrCat("training step ", step + 1);
    absl::StatusOr<RankStepResult> r = (*ex)->RunStep(step);
    if (!r.ok()) {
      status = r.status();
      break;
    }
    job.steps_done.store(step + 1);
    baton::v1::ReportProgressRequest req;
    req.set_worker_id(worker_id());
    req.set_job_id(plan.job_id());
    req.set_rank(GlobalRank(plan));
    req.set_step(step + 1);
    req.set_attempt(plan.attempt());
    std::optional<float> loss;
    if (owns_last) {
      StepLoss mean;
      for (float l : r->losses) mean.Add(l);
      loss = mean.Mean();
      req.set_loss(*loss);
      if (!std::isfinite(*loss)) {
        // Divergence is a failure: the weights are garbage from here on.
        status = DivergedError(absl::StrCat("training diverged: step ", step + 1, " loss is ",
                                            *loss, " on stage ", schedule.num_stages() - 1,
                                            " (rank ", plan.rank(), ")"));
        break;
      }
    }
    if (options_.metrics != nullptr) options_.metrics->RecordStep(*r, loss);
    if (writer != nullptr) {
      const bool last = step + 1 == spec.steps();
      if ((step + 1) % spec.checkpoint().every_steps() == 0 || last) {
        // Training stands still only while the snapshot is taken; the files are written
        // while the next steps run. The last step's write is waited for: the job is done
        // only with its final checkpoint complete.
        const absl::Time t0 = absl::Now();
        job.phase = absl::StrCat("taking the checkpoint after step ", step + 1);
        absl::StatusOr<CheckpointSnapshot> snap = (*ex)->SnapshotCheckpoint(
            CheckpointStepDir(checkpoint_dir, step + 1), plan.job_id(), step + 1);
        if (!snap.ok()) {
          status = absl::Status(snap.status().code(),
                                absl::StrCat("checkpoint after step ", step + 1, ": ",
                                             snap.status().message()));
          break;
        }
        writer->Start(*std::move(snap), step + 1, absl::Now() - t0);
      }
      std::vector<CheckpointWriter::Done> done = last ? writer->Wait() : writer->Poll();
      for (const CheckpointWriter::Done& d : done) {
        if (!d.status.ok()) {
          status = d.status;
          break;
        }
        baton::v1::CheckpointWrite* w = req.add_checkpoints();
        w->set_step(d.step);
        w->set_bytes(d.bytes);
        *w->mutable_duration() = ToProtoDuration(d.stall);
        *w->mutable_write() = ToProtoDuration(d.write);
        if (options_.metrics != nullptr) options_.metrics->RecordCheckpoint(d.stall, d.bytes);
      }
      if (!status.ok()) break;
    }
    if (step == first_step && !plan.resume_job_dir().empty()) {
      req.set_resumed_from_step(first_step);
      for (const std::string& why : skipped) req.add_checkpoints_skipped(why);
    }
    *req.mutable_timing() = Timing(*r);
    *req.mutable_trace() = RankTraceFromStep(*r);
    if (step == first_step) {
      if (collective != nullptr) *req.add_groups() = group;
      for (const LinkPlan& l : links) {
        baton::v1::LinkReport* link = req.add_links();
        link->set_rank(std::min(plan.rank(), l.peer));
        link->set_peer(std::max(plan.rank(), l.peer));
        link->set_transport(l.nccl ? "nccl" : "grpc");
        link->set_reason(l.reason);
      }
    }
    baton::v1::ReportProgressResponse resp;
    auto ctx = ClusterContext();
    absl::Status s = FromGrpcStatus(cluster_->ReportProgress(ctx.get(), req, &resp));
    if (s.ok() && !resp.keep_running()) {
      AbortJob(plan.job_id(), "the coordinator stopped the job").IgnoreError();
    } else if (!s.ok()) {
      Log(absl::StrCat("progress report for step ", step + 1, " failed: ", s.ToString()));
    }
  }
  if (status.ok()) {
    const std::vector<BlockInfo> infos = DescribeBlocks(spec.model());
    baton::v1::ReportResultRequest req;
    for (auto& [index, digest] : (*ex)->BlockDigests()) {
      baton::v1::IndexedBlockDigest* d = req.add_block_digests();
      d->set_index(index);
      d->mutable_digest()->set_block(index < static_cast<int>(infos.size()) ? infos[index].name
                                                                            : "");
      d->mutable_digest()->set_sha256(DigestHex(digest));
    }
    std::lock_guard<std::mutex> lock(job.mu);
    job.result = std::move(req);
  }
  cleanup();
  return status;
}

absl::StatusOr<std::unique_ptr<Collective>> WorkerAgent::JoinReplicaGroup(
    const baton::v1::JobPlan& plan, absl::Duration timeout, baton::v1::GroupReport* report) {
  const int replicas = std::max(1, plan.data_parallel());
  const int member = plan.replica();
  if (member < 0 || member >= replicas || plan.replica_peers_size() != replicas ||
      options_.rendezvous == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: replica ", member, " of ", replicas, " with ", plan.replica_peers_size(),
        " replica peers",
        options_.rendezvous == nullptr ? " (and this worker takes no rendezvous)" : ""));
  }
  const bool fast = plan.spec().pipeline().reduce_mode() == baton::v1::REDUCE_MODE_FAST;
  const bool nccl_required =
      plan.spec().pipeline().collective_engine() == baton::v1::COLLECTIVE_ENGINE_NCCL;
  report->set_rank(plan.rank());
  report->set_mode(fast ? "fast" : "ordered");
  auto failed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("data-parallel group of rank ", plan.rank(), ": ",
                                               s.message()));
  };
  std::vector<std::string> addresses;
  for (const baton::v1::Peer& p : plan.replica_peers()) addresses.push_back(p.address());
  const std::string prefix = GlooGroupPrefix(plan.job_key(), plan.attempt(), plan.rank());
  GrpcGlooStore store(prefix, member, replicas, options_.rendezvous,
                      [this, &addresses](int m) { return TensorChannel(addresses[m]); }, timeout);
  struct DropKeys {  // whatever way out, this group's leftovers go
    RendezvousBox* box;
    std::string prefix;
    ~DropKeys() { box->DropPrefix(prefix); }
  } drop{options_.rendezvous, prefix};
  auto store_get = [&](const std::string& key) -> absl::StatusOr<std::string> {
    try {
      std::vector<char> v = store.get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(e.what());
    }
  };
  auto store_set = [&](const std::string& key, const std::string& value) -> absl::Status {
    try {
      store.set(key, std::vector<char>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(e.what());
    }
  };

  GroupEnginePlan engine = PlanGroupEngine(plan);
  if (engine.nccl) {
    // Every member says whether its NCCL loads; NCCL only if all do (all decide alike).
    absl::StatusOr<NcclApi*> api = LoadNccl();
    const std::string mine =
        api.ok() ? "ok" : absl::StrCat("NCCL did not load: ", api.status().message());
    if (absl::Status s = store_set(absl::StrCat("baton/verdict/", member), mine); !s.ok()) {
      return failed(s);
    }
    for (int m = 0; m < replicas && engine.nccl; ++m) {
      absl::StatusOr<std::string> theirs = store_get(absl::StrCat("baton/verdict/", m));
      if (!theirs.ok()) return failed(theirs.status());
      if (*theirs != "ok") {
        engine.nccl = false;
        engine.reason = absl::StrCat("gloo: NCCL on replica ", m, ": ", *theirs);
      }
    }
    if (engine.nccl) {
      NcclCollectiveOptions o;
      o.api = *api;
      o.cuda_device = CurrentCudaDevice();
      o.ordered = !fast;
      o.init_timeout = timeout;
      if (member == 0) {
        const NcclResult r = (*api)->GetUniqueId(&o.id);
        if (r != NcclResult::kSuccess) {
          return failed(absl::UnavailableError(
              absl::StrCat("ncclGetUniqueId: ", NcclResultName(r))));
        }
        if (absl::Status s = store_set("baton/nccl-id",
                                       std::string(o.id.bytes.data(), o.id.bytes.size()));
            !s.ok()) {
          return failed(s);
        }
      } else {
        absl::StatusOr<std::string> id = store_get("baton/nccl-id");
        if (!id.ok()) return failed(id.status());
        if (id->size() != o.id.bytes.size()) {
          return failed(absl::DataLossError("the group's NCCL id has the wrong size"));
        }
        std::copy(id->begin(), id->end(), o.id.bytes.begin());
      }
      absl::StatusOr<std::unique_ptr<NcclCollective>> c =
          NcclCollective::Connect(member, replicas, o);
      if (!c.ok()) return failed(c.status());
      report->set_engine("nccl");
      report->set_reason(absl::StrCat("nccl: ", replicas, " GPUs, communicator up"));
      return std::unique_ptr<Collective>(*std::move(c));
    }
  }
  if (nccl_required) {
    return failed(absl::FailedPreconditionError(absl::StrCat(
        "the job asks for collective engine NCCL, but it cannot be used: ", engine.reason)));
  }
  GlooOptions go;
  const std::string& own = addresses[member];
  go.hostname = own.substr(0, own.rfind(':'));
  if (go.hostname.size() >= 2 && go.hostname.front() == '[') {
    go.hostname = go.hostname.substr(1, go.hostname.size() - 2);  // [v6]:port
  }
  go.connect_timeout = timeout;
  go.ordered = !fast;
  absl::StatusOr<std::unique_ptr<GlooCollective>> c =
      GlooCollective::Connect(store, member, replicas, go);
  if (!c.ok()) return failed(c.status());
  report->set_engine("gloo");
  report->set_reason(engine.reason);
  return std::unique_ptr<Collective>(*std::move(c));
}

std::shared_ptr<grpc::Channel> WorkerAgent::TensorChannel(const std::string& address) {
  std::lock_guard<std::mutex> lock(channels_mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr) ch = MakeTensorChannel(address);
  return ch;
}

absl::StatusOr<std::unique_ptr<Transport>> WorkerAgent::BringUpNccl(const baton::v1::JobPlan& plan,
                                                                    std::vector<LinkPlan>* links) {
  const bool required = plan.spec().transport() == baton::v1::TRANSPORT_KIND_NCCL;
  auto refuse_if_required = [&]() -> absl::Status {
    if (!required) return absl::OkStatus();
    for (const LinkPlan& l : *links) {
      if (!l.nccl) {
        return absl::FailedPreconditionError(
            absl::StrCat("the job asks for transport NCCL, but the link between ranks ",
                         plan.rank(), " and ", l.peer, " cannot use it: ", l.reason));
      }
    }
    return absl::OkStatus();
  };
  std::vector<int> candidates;
  for (const LinkPlan& l : *links) {
    if (l.nccl) candidates.push_back(l.peer);
  }
  if (candidates.empty() || options_.rendezvous == nullptr) {
    for (LinkPlan& l : *links) {
      if (l.nccl) {
        l.nccl = false;
        l.reason = "grpc: this worker takes no NCCL rendezvous";
      }
    }
    BATON_RETURN_IF_ERROR(refuse_if_required());
    return std::unique_ptr<Transport>();
  }
  std::vector<std::string> address(plan.num_ranks());
  for (const baton::v1::Peer& p : plan.peers()) {
    if (p.rank() >= 0 && p.rank() < plan.num_ranks()) address[p.rank()] = p.address();
  }
  auto channel_for = [this, &address](int rank) { return TensorChannel(address[rank]); };
  const absl::Time deadline = absl::Now() + options_.nccl_init_timeout;

  // This end's bring-up.
  std::unique_ptr<Transport> nccl;
  std::string mine = "ok";
  absl::StatusOr<NcclApi*> api = LoadNccl();
  if (!api.ok()) {
    mine = absl::StrCat("NCCL did not load: ", api.status().message());
  } else {
    GrpcNcclIdExchange ids(plan.rank(), options_.rendezvous, channel_for,
                           options_.nccl_init_timeout);
    NcclTransport::Options o;
    o.rank = plan.rank();
    o.num_ranks = plan.num_ranks();
    o.job_key = plan.job_key();
    o.peers = candidates;
    o.init_timeout = options_.nccl_init_timeout;
    o.compute_stream = CudaComputeStream();
    o.cuda_device = CurrentCudaDevice();
    o.api = *api;
    o.ids = &ids;
    absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(o);
    if (t.ok()) {
      nccl = *std::move(t);
    } else {
      mine = absl::StrCat("bring-up failed: ", t.status().message());
    }
  }
  // Both ends' verdicts decide each link: NCCL only if both brought it up.
  for (int peer : candidates) {
    const absl::Status sent = SendRendezvous(
        channel_for(peer), VerdictKey(plan.job_key(), 0, plan.rank(), peer), mine, deadline);
    if (!sent.ok()) Log(absl::StrCat("NCCL verdict to rank ", peer, ": ", sent.ToString()));
  }
  bool any = false;
  for (LinkPlan& l : *links) {
    if (!l.nccl) continue;
    absl::StatusOr<std::string> theirs =
        options_.rendezvous->Take(VerdictKey(plan.job_key(), 0, l.peer, plan.rank()), deadline);
    if (mine != "ok") {
      l.nccl = false;
      l.reason = absl::StrCat("grpc: NCCL on rank ", plan.rank(), ": ", mine);
    } else if (!theirs.ok()) {
      l.nccl = false;
      l.reason =
          absl::StrCat("grpc: no NCCL verdict from rank ", l.peer, ": ", theirs.status().message());
    } else if (*theirs != "ok") {
      l.nccl = false;
      l.reason = absl::StrCat("grpc: NCCL on rank ", l.peer, ": ", *theirs);
    } else {
      l.reason = absl::StrCat("nccl: communicators up within ",
                              absl::FormatDuration(options_.nccl_init_timeout));
      any = true;
    }
  }
  BATON_RETURN_IF_ERROR(refuse_if_required());
  if (!any) nccl.reset();
  return nccl;
}

void WorkerAgent::FinishJob(Job& job, const absl::Status& status) {
  baton::v1::ReportResultRequest req;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    if (status.ok()) req = job.result;
  }
  req.set_worker_id(worker_id());
  req.set_job_id(job.plan.job_id());
  req.set_rank(GlobalRank(job.plan));
  req.set_attempt(job.plan.attempt());
  if (!status.ok()) {
    // Code and message (the cause travels typed, not as a printed payload).
    req.set_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
    req.set_cause(FailureCauseOf(status, job.aborted.load()));
  }
  Log(absl::StrCat("job ", job.plan.job_id(), " rank ", job.plan.rank(), " ended: ",
                   status.ok() ? std::string("ok") : status.ToString()));
  // The coordinator may be restarting: retry for a while, then give up (the lease logic
  // settles the job).
  for (int attempt = 0; attempt < 10; ++attempt) {
    baton::v1::ReportResultResponse resp;
    auto ctx = ClusterContext();
    absl::Status s = FromGrpcStatus(cluster_->ReportResult(ctx.get(), req, &resp));
    if (s.ok() || s.code() != absl::StatusCode::kUnavailable) {
      if (!s.ok()) Log(absl::StrCat("result report refused: ", s.ToString()));
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; })) {
      return;
    }
  }
  Log("could not report the result: coordinator unreachable");
}

}  // namespace baton
