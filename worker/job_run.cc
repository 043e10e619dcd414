#include "worker/job_run.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/checkpoint.h"
#include "common/core/cuda_context.h"
#include "common/core/host_info.h"
#include "common/core/mutex.h"
#include "common/core/paths.h"
#include "common/core/status.h"
#include "common/core/step_loss.h"
#include "common/nn/model.h"
#include "common/pipeline/stage_executor.h"
#include "common/pipeline/step_trace.h"
#include "common/plan/clock_proto.h"
#include "common/plan/planner.h"
#include "common/rpc/failure_cause.h"
#include "common/rpc/rpc.h"
#include "common/schedule/schedule.h"
#include "common/spec/spec.h"
#include "common/transport/grpc_transport.h"
#include "common/transport/routed_transport.h"
#include "worker/checkpoint_writer.h"
#include "worker/links.h"
#include "worker/worker_log.h"

namespace baton {

namespace {

absl::StatusOr<Schedule> ScheduleFromPlan(const baton::v1::JobPlan& plan) {
  Schedule s;
  BATON_ASSIGN_OR_RETURN(s.kind, ScheduleKindFromProto(plan.schedule_kind()));
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
  for (const baton::v1::PlanAction& p : plan.clock()) {
    BATON_ASSIGN_OR_RETURN(Action a, ActionFromProto(p));
    if (HasStage(a.kind) &&
        (a.stage >= s.num_stages() || s.stage_to_rank[a.stage] != plan.rank())) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: action ", a.ToString(), " is not for rank ", plan.rank()));
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
      case ActionKind::kForward:
        f += d;
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        b += d;
        break;
      case ActionKind::kBackwardWeight:
        w += d;
        break;
      case ActionKind::kSendF:
      case ActionKind::kSendB:
        send += d;
        break;
      case ActionKind::kRecvF:
      case ActionKind::kRecvB:
        recv += d;
        break;
      case ActionKind::kStep:
      case ActionKind::kReduceGrad:  // queues the reduction; its time is its own
      case ActionKind::kTieGrad:
      case ActionKind::kClipGrad:
        break;
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

// Transport errors name peers by rank and address; add the worker ids the coordinator and
// users know them by.
absl::Status NamePeers(const absl::Status& s, const baton::v1::JobPlan& plan) {
  if (s.ok()) return s;
  std::string msg(s.message());
  std::string names;
  for (const baton::v1::Peer& p : plan.peers()) {
    if (!p.address().empty() && msg.find(p.address()) != std::string::npos &&
        !p.worker_id().empty()) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", p.address(), " is worker ", p.worker_id());
    }
  }
  // A failed collective (all-reduce; reduce-scatter and all-gather with a sharded optimizer)
  // names the data-parallel group (Gloo's and NCCL's errors name their own ports, not
  // baton's workers).
  const bool collective = msg.find("all-reduce") != std::string::npos ||
                          msg.find("reduce-scatter") != std::string::npos ||
                          msg.find("all-gather") != std::string::npos;
  if (plan.replica_peers_size() > 1 && collective) {
    std::vector<std::string> members;
    for (const baton::v1::Peer& p : plan.replica_peers()) {
      members.push_back(absl::StrCat("replica ", p.rank(), " on ", p.worker_id()));
    }
    absl::StrAppend(&names, names.empty() ? "" : "; ", "data-parallel group of rank ", plan.rank(),
                    ": ", absl::StrJoin(members, ", "));
  }
  if (names.empty()) return s;
  return WithMessage(s, absl::StrCat(msg, " [", names, "]"));
}

// "0-3, 8-11": the blocks of this rank's stages, for the phase an out-of-memory error names.
std::string OwnBlocks(const Schedule& schedule, const std::vector<BlockRange>& blocks, int rank) {
  std::vector<std::string> mine;
  for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
    if (schedule.stage_to_rank[s] == rank && s < static_cast<int>(blocks.size())) {
      mine.push_back(absl::StrCat(blocks[s].first, "-", blocks[s].last - 1));
    }
  }
  return absl::StrJoin(mine, ", ");
}

}  // namespace

int GlobalRank(const baton::v1::JobPlan& plan) {
  return std::max(0, plan.replica()) * plan.num_ranks() + plan.rank();
}

absl::Status OutOfMemoryError(const std::string& worker_id, int64_t memory_bytes,
                              const std::string& what, const baton::v1::JobPlan& plan) {
  return absl::ResourceExhaustedError(
      absl::StrCat("worker ", worker_id, " ran out of memory while ", what, " (", plan.job_id(),
                   " rank ", plan.rank(), "; it offers ", memory_bytes >> 20,
                   " MiB): the job needs more than this worker can allocate"));
}

// How this rank's run ended, for its result report: what only the run knows (diverged, told
// to stop) first, then the shared table.
baton::v1::FailureCause RunFailureCause(const absl::Status& s, bool aborted) {
  if (IsDiverged(s)) return baton::v1::FAILURE_CAUSE_DIVERGED;
  if (aborted) {
    // Told to stop (ABORTED), or stopping because this worker shuts down (UNAVAILABLE).
    return s.code() == absl::StatusCode::kUnavailable ? baton::v1::FAILURE_CAUSE_SHUTDOWN
                                                      : baton::v1::FAILURE_CAUSE_ABORTED;
  }
  return FailureCauseOf(s, FailureSite::kRankRun);
}

// What Run builds. Its destructor takes it down on every way out of RunSteps (an
// exception included) in the order the pieces depend on each other: the transports first
// (Abort no longer reaches them), then the inbox closes, the checkpoint writer waits for a
// write in flight, the executor goes, and last the collective it reduced through.
struct JobRun::Pipeline {
  explicit Pipeline(JobRun* r) : run(r) {}
  ~Pipeline() {
    if (transport != nullptr) run->DetachTransport();
    transport.reset();
    nccl.reset();
    if (grpc != nullptr) {
      grpc.reset();
      run->options_.inbox->Close();
    }
    writer.reset();
    executor.reset();
    collective.reset();
  }

  JobRun* const run;
  std::optional<ValidatedJobSpec> valid;  // set by Prepare
  const baton::v1::JobSpec& spec() const { return valid->proto(); }
  Schedule schedule;
  std::vector<BlockRange> blocks;  // per stage
  absl::Duration recv_timeout;
  // gRPC serves every link that does not use NCCL; NCCL the links both ends brought up.
  std::unique_ptr<GrpcTransport> grpc;
  std::unique_ptr<Transport> nccl;
  std::vector<LinkPlan> links;
  std::unique_ptr<RoutedTransport> transport;
  std::unique_ptr<Collective> collective;
  baton::v1::GroupReport group;
  std::unique_ptr<StageExecutor> executor;
  std::vector<std::string> block_names;
  bool owns_last = false;  // runs the last stage: reports the loss
  int64_t first_step = 0;
  std::vector<std::string> skipped;  // checkpoints a resume passed over, and why
  std::string checkpoint_dir;        // this job's, when the spec checkpoints
  // Replica 0's ranks write the checkpoints; with a sharded optimizer every replica writes
  // a part of its rank's blocks (StageExecutor::SaveCheckpoint). Null on the others.
  std::unique_ptr<CheckpointWriter> writer;
  int64_t snapshot_step = 0;         // the newest step a checkpoint was taken after
  int64_t stopped_after = 0;         // preempted: the run ended after this step
};

absl::StatusOr<std::unique_ptr<JobRun>> JobRun::Create(const baton::v1::JobPlan& plan,
                                                       JobRunOptions options) {
  std::unique_ptr<JobRun> run(new JobRun(plan, std::move(options)));
  BATON_RETURN_IF_ERROR(run->Admit());
  return run;
}

JobRun::JobRun(const baton::v1::JobPlan& plan, JobRunOptions options)
    : plan_(plan), options_(std::move(options)) {}

JobRun::~JobRun() = default;

absl::Status JobRun::Admit() {
  const baton::v1::JobPlan& plan = plan_;
  const std::string& worker = options_.worker_id;
  // Refuse a job this worker cannot checkpoint or resume now, not at its first checkpoint.
  // INVALID_ARGUMENT, not FAILED_PRECONDITION: the coordinator retries the latter (busy).
  // Only under this worker's checkpoint root, whatever the coordinator let through.
  if (plan.spec().has_checkpoint()) {
    absl::StatusOr<std::string> root = ConfinedCheckpointDir(plan.spec().checkpoint().dir());
    if (!root.ok()) return root.status();
    const std::string dir = CheckpointJobDir(*root, plan.job_id());
    if (absl::Status w = CheckCheckpointDirWritable(dir); !w.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.dir on worker ", worker, ": ", w.message()));
    }
  }
  if (!plan.resume_job_dir().empty()) {
    if (absl::StatusOr<std::string> in = ConfinedCheckpointDir(plan.resume_job_dir()); !in.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: ", in.status().message()));
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(plan.resume_job_dir(), ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume_from: worker ", worker, " cannot see the checkpoint directory ",
                       plan.resume_job_dir(), " (is checkpoint.dir mounted on every worker?)"));
    }
  }
  if (absl::Status fault = CudaDeviceFault(); !fault.ok()) {
    return absl::UnavailableError(
        absl::StrCat("worker ", worker, " is leaving: ", fault.message()));
  }
  // A CPU job this process cannot hold now is refused before anything is built: running
  // out of memory mid-job is the last resort (Run), not the plan. (A GPU job's memory is
  // the GPU's, which placement checked.)
  if (plan.spec().device() != baton::v1::DEVICE_KIND_CUDA) {
    const int64_t need = RankNeedBytes(plan.spec());
    const int64_t usable = UsableMemoryBytes();
    if (need > 0 && usable > 0 && need > usable) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker ", worker, " cannot hold rank ", plan.rank(), " of ", plan.job_id(),
          ": it needs about ", HumanBytes(static_cast<double>(need)),
          " (parameters, gradients, optimizer state, activations in flight), and this worker "
          "can allocate ",
          HumanBytes(static_cast<double>(usable)), " now"));
    }
  }
  // Everything the plan's size decides is allocated before any state changes, so running
  // out of memory here leaves the worker as it was. The inbox will accept the tensors this
  // rank's clock receives, from their ranks.
  BATON_ASSIGN_OR_RETURN(Schedule schedule, ScheduleFromPlan(plan));
  inbox_plan_ = PlanInbox(plan, schedule, options_.inbox_bytes);
  members_ = RendezvousMembers(plan);
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobRun::ConfinedCheckpointDir(const std::string& dir) const {
  if (options_.checkpoint_root.empty()) return dir;
  absl::StatusOr<std::string> in = ConfineCheckpointDir(dir, options_.checkpoint_root);
  if (!in.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", options_.worker_id, ": ", in.status().message()));
  }
  return in;
}

void JobRun::Open() {
  // Accept the job's tensors before answering: once every rank has answered StartJob, any
  // peer may send to this one (the coordinator starts rank 0, the first sender, last).
  // Its rendezvous values too (the members' NCCL ids, verdicts and Gloo addresses), until
  // the attempt ends.
  options_.inbox->Open(std::move(inbox_plan_));
  if (options_.rendezvous != nullptr) {
    options_.rendezvous->OpenJob(plan_.job_key(), std::move(members_));
  }
}

void JobRun::Abort(const absl::Status& why) {
  MutexLock lock(mu_);
  if (!aborted_.exchange(true)) {
    abort_status_ = why;
    WorkerLog(absl::StrCat("aborting job ", plan_.job_id(), ": ", why.message()));
  }
  if (transport_ != nullptr) transport_->Abort(abort_status_);
}

void JobRun::DetachTransport() {
  MutexLock lock(mu_);
  transport_ = nullptr;
}

JobRun::Outcome JobRun::Run(ProgressSink* sink) {
  absl::Status status;
  try {
    status = NamePeers(RunSteps(sink), plan_);
  } catch (const std::bad_alloc&) {
    // Whatever RunSteps held is released by now; what the allocators cached of it goes
    // back to the system, so the worker keeps serving.
    DetachTransport();
    CpuAllocator()->ReleaseCached();
    malloc_trim(0);
    status = OutOfMemoryError(options_.worker_id, options_.memory_bytes, phase_, plan_);
  }
  options_.inbox->Close();  // also when RunSteps failed before it had a transport
  // The attempt's rendezvous values expire with it; later ones for it are refused.
  if (options_.rendezvous != nullptr) options_.rendezvous->CloseJob(plan_.job_key());
  if (!status.ok() && aborted_.load()) {
    // Where the abort reached the run, for the log; its result says why it was aborted.
    WorkerLog(absl::StrCat("job ", plan_.job_id(), " rank ", plan_.rank(),
                           " stopped on the abort: ", status.message()));
    MutexLock lock(mu_);
    status = absl::Status(abort_status_.code(), absl::StrCat("aborted: ", abort_status_.message()));
  }
  return Outcome{status, ResultReport(status)};
}

baton::v1::ReportResultRequest JobRun::ResultReport(const absl::Status& status) const {
  baton::v1::ReportResultRequest req;
  if (status.ok()) req = digests_;
  req.set_job_id(plan_.job_id());
  req.set_rank(GlobalRank(plan_));
  req.set_attempt(plan_.attempt());
  if (!status.ok()) {
    // Code and message (the cause travels typed, not as a printed payload).
    req.set_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
    req.set_cause(RunFailureCause(status, aborted_.load()));
  }
  return req;
}

absl::Status JobRun::RunSteps(ProgressSink* sink) {
  Pipeline p(this);
  // An abort is checked between the phases too: building the blocks and loading a
  // checkpoint wait on no transport that Abort could wake.
  for (absl::Status (JobRun::*phase)(Pipeline&) :
       {&JobRun::Prepare, &JobRun::Connect, &JobRun::JoinGroup, &JobRun::Build, &JobRun::Resume}) {
    BATON_RETURN_IF_ERROR((this->*phase)(p));
    if (aborted_.load()) return absl::AbortedError(absl::StrCat("aborted while ", phase_));
  }
  BATON_RETURN_IF_ERROR(Train(p, sink));
  if (p.stopped_after > 0) {
    // Preempted: no digests (the weights are mid-training); the checkpoint carries on.
    digests_.set_stopped_after_step(p.stopped_after);
    return absl::OkStatus();
  }
  const std::vector<BlockInfo> infos = DescribeBlocks(p.spec().model());
  BATON_ASSIGN_OR_RETURN(const auto digests, p.executor->BlockDigests());
  for (const auto& [index, digest] : digests) {
    baton::v1::IndexedBlockDigest* d = digests_.add_block_digests();
    d->set_index(index);
    d->mutable_digest()->set_block(index < static_cast<int>(infos.size()) ? infos[index].name : "");
    d->mutable_digest()->set_sha256(DigestHex(digest));
  }
  return absl::OkStatus();
}

absl::Status JobRun::Prepare(Pipeline& p) {
  // The one validation of the spec in this process: the confined checkpoint directory is
  // written in first (Create checked where it lies), and the rest takes the validated spec.
  baton::v1::JobSpec spec = plan_.spec();
  if (spec.has_checkpoint()) {
    BATON_ASSIGN_OR_RETURN(std::string dir, ConfinedCheckpointDir(spec.checkpoint().dir()));
    spec.mutable_checkpoint()->set_dir(std::move(dir));
  }
  BATON_ASSIGN_OR_RETURN(p.valid, ValidatedJobSpec::Validate(std::move(spec)));
  BATON_RETURN_IF_ERROR(RequireChosenSchedule(p.spec()));
  BATON_ASSIGN_OR_RETURN(p.schedule, ScheduleFromPlan(plan_));
  p.blocks.resize(plan_.stages_size());
  for (const baton::v1::StagePlan& sp : plan_.stages()) {
    if (sp.stage() < 0 || sp.stage() >= plan_.stages_size()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: stage ", sp.stage(), " out of range"));
    }
    p.blocks[sp.stage()] = BlockRange{sp.first_block(), sp.last_block()};
  }
  p.recv_timeout =
      plan_.has_recv_timeout() ? FromProtoDuration(plan_.recv_timeout()) : absl::Seconds(60);
  return absl::OkStatus();
}

absl::Status JobRun::Connect(Pipeline& p) {
  GrpcTransport::Options topts;
  topts.rank = plan_.rank();
  topts.job_key = plan_.job_key();
  topts.peer_addresses.resize(plan_.num_ranks());
  for (const baton::v1::Peer& peer : plan_.peers()) {
    if (peer.rank() >= 0 && peer.rank() < plan_.num_ranks()) {
      topts.peer_addresses[peer.rank()] = peer.address();
    }
  }
  topts.send_timeout = p.recv_timeout;
  topts.make_channel = options_.channels;
  phase_ = "setting up the transport";
  p.grpc = std::make_unique<GrpcTransport>(topts, options_.inbox);
  p.links = PlanLinks(plan_, Neighbours(p.schedule, plan_.rank()));
  absl::StatusOr<std::unique_ptr<Transport>> nccl = BringUpNccl(
      plan_, options_.rendezvous, options_.channels, options_.nccl_init_timeout, &p.links);
  if (options_.rendezvous != nullptr) {
    options_.rendezvous->DropPrefix(JobRendezvousPrefix(plan_.job_key()));
  }
  if (!nccl.ok()) return nccl.status();
  p.nccl = *std::move(nccl);
  std::vector<Transport*> by_peer(plan_.num_ranks(), nullptr);
  for (const LinkPlan& l : p.links) {
    if (l.peer >= 0 && l.peer < plan_.num_ranks()) {
      by_peer[l.peer] = l.nccl ? p.nccl.get() : static_cast<Transport*>(p.grpc.get());
    }
  }
  p.transport = std::make_unique<RoutedTransport>(plan_.rank(), std::move(by_peer));
  MutexLock lock(mu_);
  transport_ = p.transport.get();
  if (aborted_.load()) transport_->Abort(abort_status_);
  return absl::OkStatus();
}

absl::Status JobRun::JoinGroup(Pipeline& p) {
  // Data parallelism: join this rank's group (the same rank of every replica).
  if (std::max(1, plan_.data_parallel()) <= 1) return absl::OkStatus();
  phase_ = "joining the data-parallel group";
  BATON_ASSIGN_OR_RETURN(
      p.collective,
      JoinReplicaGroup(plan_, options_.rendezvous, options_.channels, p.recv_timeout, &p.group));
  return absl::OkStatus();
}

absl::Status JobRun::Build(Pipeline& p) {
  const Schedule& schedule = p.schedule;
  StageExecutorOptions eo;
  eo.replica = plan_.replica();
  eo.collective = p.collective.get();
  eo.job_id = plan_.job_key();
  eo.data = options_.data;
  eo.recv_timeout = p.recv_timeout;
  // Placement wrote the device every rank computes on into the plan's spec.
  eo.device = p.spec().device() == baton::v1::DEVICE_KIND_CUDA ? Device::kCuda : Device::kCpu;
  // Abort reaches the steps and evaluations between micro-batches, also where the transport
  // has nothing to wake (a single stage, an evaluation's first stage).
  eo.stop = &aborted_;
  if (options_.metrics != nullptr) {
    JobMetricsInfo info;
    info.job_id = plan_.job_id();
    info.rank = plan_.rank();
    for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
      if (schedule.stage_to_rank[s] == plan_.rank()) info.stages.push_back(s);
    }
    info.transport = p.transport->backend();
    for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
      const std::string b = p.transport->BackendFor(schedule.stage_to_rank[s]);
      info.transport_by_stage[s] = b.empty() ? p.transport->backend() : b;
    }
    info.samples_per_step = p.spec().data().batch_size();
    if (p.collective != nullptr) info.collective = p.collective->engine();
    info.tokens_per_step = TokensPerStep(p.spec());
    // This rank's blocks' share of the step's model FLOPs, on its replica's samples.
    const std::vector<BlockInfo> blocks = DescribeBlocks(p.spec().model());
    const double samples = static_cast<double>(p.spec().data().batch_size()) /
                           std::max(1, p.spec().pipeline().data_parallel());
    for (int s = 0; s < static_cast<int>(schedule.stage_to_rank.size()); ++s) {
      if (schedule.stage_to_rank[s] == plan_.rank() && s < static_cast<int>(p.blocks.size())) {
        info.model_flops_per_step +=
            TrainingFlops(blocks, p.blocks[s].first, p.blocks[s].last, samples);
      }
    }
    info.peak_flops = p.spec().precision() == baton::v1::PRECISION_BF16 ? options_.peak_flops_bf16
                                                                        : options_.peak_flops;
    eo.observer = options_.metrics->BeginJob(info);
  }
  phase_ = absl::StrCat("building its blocks (", OwnBlocks(schedule, p.blocks, plan_.rank()), ")");
  BATON_ASSIGN_OR_RETURN(p.executor, StageExecutor::Create(*p.valid, schedule, p.blocks, plan_.rank(),
                                                           p.transport.get(), eo));
  p.owns_last = schedule.stage_to_rank.back() == plan_.rank();
  for (const BlockInfo& b : DescribeBlocks(p.spec().model())) p.block_names.push_back(b.name);
  return absl::OkStatus();
}

absl::Status JobRun::Resume(Pipeline& p) {
  if (plan_.resume_job_dir().empty()) return absl::OkStatus();
  // Every rank picks the same checkpoint (the newest complete one at or before the plan's
  // step, by the same files) and says which in its first report.
  const std::string& from = plan_.resume_job_dir();
  phase_ = absl::StrCat("loading a checkpoint from ", from);
  // resume_step 0: the newest complete one (a recovery).
  absl::StatusOr<int64_t> at = LatestCompleteCheckpoint(
      from, p.block_names, plan_.resume_step() > 0 ? plan_.resume_step() : -1, &p.skipped);
  absl::StatusOr<int64_t> loaded =
      at.ok() ? p.executor->LoadCheckpoint(CheckpointStepDir(from, *at)) : at.status();
  if (!loaded.ok()) {
    const std::string why = absl::StrJoin(p.skipped, "; ");
    return absl::Status(loaded.status().code(),
                        absl::StrCat("resume from ", from, ": ", loaded.status().message(),
                                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  p.first_step = *loaded;
  steps_done_.store(p.first_step);
  // A recovery resumes from the job's own checkpoints: what an earlier attempt wrote after
  // this step (perhaps by another partition, with other manifests) goes. Rank 0 alone,
  // before its first step: no rank can finish a step, let alone write one, before rank 0
  // has started it.
  if (plan_.rank() == 0 && plan_.replica() == 0 && p.spec().has_checkpoint() &&
      from == CheckpointJobDir(p.spec().checkpoint().dir(), plan_.job_id())) {
    for (int64_t later : ListCheckpointSteps(from)) {
      if (later <= p.first_step) continue;
      std::error_code ec;
      std::filesystem::remove_all(CheckpointStepDir(from, later), ec);
      if (ec) {
        WorkerLog(absl::StrCat("removing an earlier attempt's step ", later, ": ", ec.message()));
      }
    }
  }
  WorkerLog(absl::StrCat("job ", plan_.job_id(), " resumes from ", from, " step ", p.first_step));
  return absl::OkStatus();
}

absl::Status JobRun::Train(Pipeline& p, ProgressSink* sink) {
  if (p.spec().has_checkpoint()) {
    p.checkpoint_dir = CheckpointJobDir(p.spec().checkpoint().dir(), plan_.job_id());
  }
  // Every replica holds the same weights and optimizer state: replica 0's ranks write them.
  // A sharded optimizer's replicas each hold a share of the state: each writes a part.
  if (!p.checkpoint_dir.empty() && (plan_.replica() == 0 || p.spec().optimizer().shard())) {
    p.writer = std::make_unique<CheckpointWriter>(p.checkpoint_dir, p.block_names,
                                                  p.spec().checkpoint().keep(), &aborted_);
  }
  if (p.spec().eval().only()) {  // one evaluation, reported as the job's one step
    BATON_ASSIGN_OR_RETURN(baton::v1::ReportProgressRequest report, Step(p, 0));
    sink->OnStep(std::move(report));
    return absl::OkStatus();
  }
  for (int64_t step = p.first_step; step < p.spec().steps(); ++step) {
    if (aborted_.load()) return absl::AbortedError("aborted");
    BATON_ASSIGN_OR_RETURN(baton::v1::ReportProgressRequest report, Step(p, step));
    if (sink->OnStep(std::move(report)) == StepAnswer::kCheckpointAndStop &&
        step + 1 < p.spec().steps()) {
      // Preempted. Every rank was told to stop after this step, so no peer waits for this
      // one; what the step left in flight (the report's writes aside) is written and kept.
      if (p.writer != nullptr) {
        BATON_RETURN_IF_ERROR(
            Checkpoint(p, step, /*stopping=*/true, digests_.mutable_checkpoints()));
      }
      p.stopped_after = step + 1;
      WorkerLog(absl::StrCat("job ", plan_.job_id(), " rank ", plan_.rank(),
                             " stopped after step ", step + 1, " (preempted)"));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<baton::v1::ReportProgressRequest> JobRun::Step(Pipeline& p, int64_t step) {
  // eval.only: the job's one step is the evaluation of the weights as loaded, and its loss
  // the validation loss; nothing trains. Its report is a first step's, wherever it resumed.
  const bool eval_only = p.spec().eval().only();
  const bool first = step == p.first_step || eval_only;
  RankStepResult r;
  if (eval_only) {
    phase_ = "evaluating the weights as loaded (eval.only)";
    r.rank = plan_.rank();
    r.start = absl::Now();
    BATON_ASSIGN_OR_RETURN(r.val_loss, p.executor->Evaluate(0));
    r.end_ns = absl::ToInt64Nanoseconds(absl::Now() - r.start);
    if (r.val_loss.has_value()) r.losses = {*r.val_loss};
  } else {
    phase_ = absl::StrCat("training step ", step + 1);
    BATON_ASSIGN_OR_RETURN(r, p.executor->RunStep(step));
  }
  steps_done_.store(step + 1);
  if (!eval_only && p.executor->EvaluatesAfter(step)) {
    phase_ = absl::StrCat("evaluating after step ", step + 1);
    BATON_ASSIGN_OR_RETURN(r.val_loss, p.executor->Evaluate(step));
  }
  baton::v1::ReportProgressRequest req;
  req.set_job_id(plan_.job_id());
  req.set_rank(GlobalRank(plan_));
  req.set_step(step + 1);
  req.set_attempt(plan_.attempt());
  req.set_learning_rate(r.learning_rate);
  if (r.grad_norm.has_value()) req.set_grad_norm(*r.grad_norm);
  if (r.val_loss.has_value()) req.set_val_loss(*r.val_loss);
  std::optional<float> loss;
  if (p.owns_last) {
    StepLoss mean;
    for (float l : r.losses) mean.Add(l);
    loss = mean.Mean();
    req.set_loss(*loss);
    if (!std::isfinite(*loss)) {
      // Divergence is a failure: the weights are garbage from here on.
      return DivergedError(absl::StrCat("training diverged: step ", step + 1, " loss is ", *loss,
                                        " on stage ", p.schedule.num_stages() - 1, " (rank ",
                                        plan_.rank(), ")"));
    }
  }
  if (options_.metrics != nullptr) options_.metrics->RecordStep(r, loss);
  if (p.writer != nullptr) {
    BATON_RETURN_IF_ERROR(Checkpoint(p, step, /*stopping=*/false, req.mutable_checkpoints()));
  }
  if (first && !plan_.resume_job_dir().empty()) {
    req.set_resumed_from_step(p.first_step);
    for (const std::string& why : p.skipped) req.add_checkpoints_skipped(why);
  }
  *req.mutable_timing() = Timing(r);
  *req.mutable_trace() = RankTraceFromStep(r);
  if (first) {
    if (p.collective != nullptr) *req.add_groups() = p.group;
    for (const LinkPlan& l : p.links) {
      baton::v1::LinkReport* link = req.add_links();
      link->set_rank(std::min(plan_.rank(), l.peer));
      link->set_peer(std::max(plan_.rank(), l.peer));
      link->set_transport(l.nccl ? "nccl" : "grpc");
      link->set_reason(l.reason);
    }
  }
  return req;
}

absl::Status JobRun::Checkpoint(
    Pipeline& p, int64_t step, bool stopping,
    google::protobuf::RepeatedPtrField<baton::v1::CheckpointWrite>* writes) {
  const bool last = step + 1 == p.spec().steps() || stopping;
  const bool due = (step + 1) % p.spec().checkpoint().every_steps() == 0 || last;
  if (due && p.snapshot_step != step + 1) {
    // Training stands still only while the snapshot is taken; the files are written while
    // the next steps run. The last step's write is waited for: the job is done only with
    // its final checkpoint complete.
    const absl::Time t0 = absl::Now();
    phase_ = absl::StrCat("taking the checkpoint after step ", step + 1);
    absl::StatusOr<CheckpointSnapshot> snap = p.executor->SnapshotCheckpoint(
        CheckpointStepDir(p.checkpoint_dir, step + 1), plan_.job_id(), step + 1);
    if (!snap.ok()) {
      return absl::Status(snap.status().code(), absl::StrCat("checkpoint after step ", step + 1,
                                                             ": ", snap.status().message()));
    }
    p.snapshot_step = step + 1;
    p.writer->Start(*std::move(snap), step + 1, absl::Now() - t0);
  }
  if (p.writer == nullptr) return absl::OkStatus();
  for (const CheckpointWriter::Done& d : last ? p.writer->Wait() : p.writer->Poll()) {
    BATON_RETURN_IF_ERROR(d.status);
    baton::v1::CheckpointWrite* w = writes->Add();
    w->set_step(d.step);
    w->set_bytes(d.bytes);
    *w->mutable_duration() = ToProtoDuration(d.stall);
    *w->mutable_write() = ToProtoDuration(d.write);
    if (options_.metrics != nullptr) options_.metrics->RecordCheckpoint(d.stall, d.bytes);
  }
  return absl::OkStatus();
}

}  // namespace baton
