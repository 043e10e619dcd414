#include "coordinator/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/checkpoint/checkpoint.h"
#include "common/core/log_text.h"
#include "common/core/mutex.h"
#include "common/core/status.h"
#include "common/rpc/rpc.h"
#include "common/spec/spec.h"
#include "coordinator/job_events.h"
#include "coordinator/placement_round.h"

namespace baton {

using baton::v1::Job;
using baton::v1::JobEvent;
using baton::v1::JobState;

namespace {

// The tensor-tag key of a placement attempt: random (64 bits from the OS's generator), so
// tensors of an earlier attempt (a worker that was stopped and came back) never match a
// later one's, and a stranger cannot guess the tags of a running job from its id.
uint64_t NewJobKey() {
  std::random_device os;  // /dev/urandom
  uint64_t key = 0;
  while (key == 0) key = (static_cast<uint64_t>(os()) << 32) ^ static_cast<uint64_t>(os());
  return key;
}

std::chrono::nanoseconds ToChrono(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Construction, the loop, threads

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      registry_(options_.lease_ttl, options_.clock),
      checkpoint_dirs_(options_.checkpoint_root),
      export_caps_("exports", options_.max_exports, options_.max_exports_per_caller),
      runner_(EffectsRunner::Options{options_.worker_client, options_.start_timeout,
                                     options_.abort_timeout, options_.busy_retry,
                                     options_.clock, options_.sleep, options_.background},
              RunnerCallbacks()) {}

EffectsRunner::Callbacks Coordinator::RunnerCallbacks() {
  EffectsRunner::Callbacks c;
  c.aborted = [this](const AbortCall& call, std::vector<PlacedWorker> stopped) {
    AbortReturned(call, stopped);
  };
  c.started = [this](const StartCall& call, const std::vector<absl::Status>& results) {
    FinishStart(call.job_id, call.workers, results);
  };
  c.still_placing = [this](const std::string& job_id) { return StillPlacing(job_id); };
  c.log = [this](const std::string& message) { LogWarning(message); };
  return c;
}

int64_t Coordinator::MissedHeartbeats(absl::Time last, absl::Time now) const {
  // Heartbeats are due every interval; a gap of k intervals (rounded down) missed k - 1.
  absl::Duration rest;  // IDivDuration needs somewhere to put the remainder
  const int64_t intervals =
      absl::IDivDuration(now - last, options_.heartbeat_interval, &rest);
  return intervals > 1 ? intervals - 1 : 0;
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  BATON_RETURN_IF_ERROR(ValidateCoordinatorOptions(options));
  if (!options.clock) options.clock = [] { return absl::Now(); };
  if (!options.sleep) options.sleep = [](absl::Duration d) { absl::SleepFor(d); };
  if (options.worker_client == nullptr)
    options.worker_client = std::make_shared<GrpcWorkerClient>();
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options)));
  BATON_ASSIGN_OR_RETURN(c->store_, JobStore::Open(c->options_.db_path));
  BATON_RETURN_IF_ERROR(c->Recover());
  if (c->options_.background) c->loop_ = std::thread([p = c.get()] { p->LoopMain(); });
  if (c->options_.metrics != nullptr) {
    c->options_.metrics->SetStateSource([p = c.get()] { return p->CountStates(); });
  }
  return c;
}

absl::Status Coordinator::RecoverCheckpointDirs() {
  // Who writes checkpoints where: every stored job's directory, oldest job first (the first
  // to name a directory owns it; pages run newest first).
  struct CheckpointUse {
    std::string dir, user, job_id;
  };
  std::vector<CheckpointUse> uses;
  std::string token;
  do {
    BATON_ASSIGN_OR_RETURN(JobStore::Page page, store_->List(kMaxPageSize, token, kMaxPageBytes));
    for (const Job& j : page.jobs) {
      if (j.spec().has_checkpoint()) {
        uses.push_back({j.spec().checkpoint().dir(), j.submitted_by(), j.id()});
      }
    }
    token = page.next_page_token;
  } while (!token.empty());
  MutexLock lock(mu_);
  for (auto it = uses.rbegin(); it != uses.rend(); ++it) {
    if (!checkpoint_dirs_.Add(it->dir, it->user, it->job_id)) {
      LogWarning(absl::StrCat(it->job_id, "'s checkpoint.dir '", it->dir,
                              "' is not a directory a job may own (the checkpoint root itself, "
                              "or users/): it claims nothing for its submitter ", it->user));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Recover() {
  BATON_RETURN_IF_ERROR(RecoverCheckpointDirs());
  BATON_ASSIGN_OR_RETURN(
      auto jobs,
      store_->ListInStates({baton::v1::JOB_STATE_QUEUED, baton::v1::JOB_STATE_PLACING,
                            baton::v1::JOB_STATE_RUNNING, baton::v1::JOB_STATE_RECOVERING,
                            baton::v1::JOB_STATE_PREEMPTED}));
  // What each needs of a worker (the planner's model: not under the lock).
  std::vector<std::vector<int64_t>> needs;
  for (const auto& [seq, job] : jobs) needs.push_back(RankNeeds(job.spec()));
  MutexLock lock(mu_);
  size_t next_need = 0;
  for (auto& [seq, job] : jobs) {
    auto active = std::make_unique<ActiveJob>();
    active->seq = seq;
    active->job = std::move(job);
    active->rank_needs = std::move(needs[next_need++]);
    active->log = std::make_shared<JobEventLog>();
    const std::string id = active->job.id();
    ActiveJob* j = active.get();
    active_[id] = std::move(active);
    j->queued_since = Now();  // (how long it waited before the restart is not kept)
    if (j->job.state() == baton::v1::JOB_STATE_QUEUED ||
        j->job.state() == baton::v1::JOB_STATE_PREEMPTED) {
      queue_.push_back(id);
    } else if (j->job.state() == baton::v1::JOB_STATE_RECOVERING) {
      queue_.push_front(id);  // it was waiting to be placed again; it still is
    } else {
      Effects none;
      // Its workers are not known any more (the registry is empty); their heartbeats will
      // be told to abort it (they register again and are idle). With spec restart it is
      // recovered on them from its last complete checkpoint.
      Apply(j,
            FailureEvent(*j, "coordinator restarted while the job was running",
                         baton::v1::FAILURE_CAUSE_WORKER_LOST, Ctx()),
            &none);
    }
  }
  return absl::OkStatus();
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Stop() {
  if (options_.metrics != nullptr) options_.metrics->SetStateSource(nullptr);
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  loop_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  runner_.Close();
  MutexLock lock(mu_);
  for (auto& [id, job] : active_) job->log->Stop();
  stopped_ = true;
}

void Coordinator::LoopMain() {
  MutexLock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    const absl::Time start = absl::Now();
    Tick();
    runner_.Reap();
    const absl::Duration took = absl::Now() - start;
    lock.lock();
    // A round over a deep queue holds mu_ for milliseconds, and heartbeats and submissions
    // wait on it: however often it is woken, the loop leaves them twice that long between
    // rounds (a burst of submissions does not keep the lock busy).
    if (took > absl::Milliseconds(1)) {
      loop_cv_.wait_for(lock.native(), ToChrono(2 * took),
                        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
    }
    loop_cv_.wait_for(lock.native(), ToChrono(options_.heartbeat_interval / 2),
                      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stopping_; });
    wake_ = false;
  }
}

void Coordinator::WakeLoop() {
  // mu_ is held (the flag is read by the loop under mu_).
  wake_ = true;
  loop_cv_.notify_all();
}

void Coordinator::LogWarning(const std::string& message) {
  if (!options_.log) return;
  // Messages carry client text (job names, reasons): one line each, whatever they contain.
  std::fprintf(stderr, "coordinator: %s\n", OneLine(message).c_str());
  std::fflush(stderr);
}

void Coordinator::AbortReturned(const AbortCall& a, const std::vector<PlacedWorker>& stopped) {
  // A worker still stopping, or unreachable, stays busy: a heartbeat saying it runs nothing
  // frees it (see Heartbeat), or its lease runs out if it is dead.
  MutexLock lock(mu_);
  FreeWorkersLocked(a.job_id, stopped);
  if (a.counted) {
    if (ActiveJob* j = FindActiveLocked(a.job_id); j != nullptr && j->pending_aborts > 0) {
      --j->pending_aborts;
      // Those still stopping are waited for a while more: placed again at once, the job
      // would get fewer stages than its own workers give it back a moment later.
      for (const PlacedWorker& w : a.workers) {
        const bool freed = std::any_of(stopped.begin(), stopped.end(), [&](const PlacedWorker& s) {
          return s.worker_id == w.worker_id;
        });
        if (!freed) j->stopping_workers.insert(w.worker_id);
      }
      if (!j->stopping_workers.empty()) j->stopping_until = Now() + options_.stop_grace;
      WakeLoop();
    }
  }
}

bool Coordinator::StillPlacing(const std::string& job_id) {
  MutexLock lock(mu_);
  ActiveJob* j = FindActiveLocked(job_id);
  return j != nullptr && j->job.state() == baton::v1::JOB_STATE_PLACING;
}

void Coordinator::FinishStart(const std::string& job_id, const std::vector<PlacedWorker>& workers,
                              const std::vector<absl::Status>& results) {
  Effects effects;
  {
    MutexLock lock(mu_);
    starting_.erase(job_id);
    ActiveJob* j = FindActiveLocked(job_id);
    Apply(j, StartAnsweredEvent(j, job_id, workers, results, Ctx()), &effects);
  }
  runner_.RunNow(std::move(effects));
}

// ---------------------------------------------------------------------------------------
// Job bookkeeping (mu_ held)

ActiveJob* Coordinator::FindActiveLocked(const std::string& job_id) {
  auto it = active_.find(job_id);
  return it == active_.end() ? nullptr : it->second.get();
}

void Coordinator::PersistLocked(ActiveJob* job) {
  job->last_persist = Now();
  const absl::Status s = store_->Put(job->job);
  if (!s.ok()) LogWarning(absl::StrCat("cannot save ", job->job.id(), ": ", s.ToString()));
}

void Coordinator::EmitLocked(ActiveJob* job, JobEvent event) {
  event.set_job_id(job->job.id());
  *event.mutable_time() = ToProtoTime(Now());
  job->log->Append(std::move(event));
}

void Coordinator::AppendStateLocked(ActiveJob* job, JobState state, const std::string& reason) {
  if (!TransitionAllowed(job->job.state(), state)) {
    // A bug: the job life's table (job_lifecycle.h) does not allow this change. It is made
    // (refusing it would strand the job) but counted and logged; tests require none.
    ++invalid_transitions_;
    LogWarning(absl::StrCat("BUG: ", job->job.id(), " ", JobState_Name(job->job.state()), " -> ",
                            JobState_Name(state), " is not an allowed transition"));
  }
  baton::v1::StateChange change;
  change.set_state(state);
  *change.mutable_time() = ToProtoTime(Now());
  change.set_reason(TruncateReason(reason));
  *job->job.add_history() = change;
  if (!IsWaitingState(state)) {
    job->job.set_queue_position(0);  // it no longer waits
    job->job.clear_wait_reason();
  }
  const bool started = state == baton::v1::JOB_STATE_RUNNING &&
                       job->job.state() != baton::v1::JOB_STATE_RUNNING;  // not a note
  job->job.set_state(state);
  if (started && options_.metrics != nullptr && job->job.has_create_time()) {
    options_.metrics->ObserveQueueWait(Now() - FromProtoTime(job->job.create_time()));
  }
  LogWarning(absl::StrCat(job->job.id(), " ", ShortStateName(state), ": ", change.reason()));
  PersistLocked(job);
  JobEvent event;
  *event.mutable_state_change() = std::move(change);
  EmitLocked(job, std::move(event));
}

bool Coordinator::StillStoppingLocked(ActiveJob* j) {
  for (auto it = j->stopping_workers.begin(); it != j->stopping_workers.end();) {
    // Free (idle, dead, gone) or moved on to another job: no longer waited for.
    const std::optional<baton::v1::WorkerInfo> w = registry_.Get(*it);
    const bool stopping = w.has_value() && w->state() == baton::v1::WORKER_STATE_BUSY &&
                          w->job_id() == j->job.id();
    it = stopping ? std::next(it) : j->stopping_workers.erase(it);
  }
  if (Now() >= j->stopping_until) j->stopping_workers.clear();
  return !j->stopping_workers.empty();
}

void Coordinator::FreeWorkersLocked(const std::string& job_id,
                                    const std::vector<PlacedWorker>& workers) {
  // While its StartJob calls are in flight, FinishStart frees the job's workers.
  if (starting_.count(job_id) > 0) return;
  for (const PlacedWorker& w : workers) registry_.MarkIdle(w.worker_id, job_id);
  WakeLoop();
}

void Coordinator::ExpireLeasesLocked(Effects* effects) {
  for (const baton::v1::WorkerInfo& w : registry_.ExpireLeases()) {
    LogWarning(absl::StrCat("worker ", w.worker_id(), " (", w.address(), ") lease expired"));
    if (options_.metrics != nullptr) {
      options_.metrics->AddLeaseExpiration();
      options_.metrics->AddHeartbeatsMissed(
          MissedHeartbeats(FromProtoTime(w.last_heartbeat()), Now()));
    }
    WorkerGoneLocked(w,
                     absl::StrCat("worker ", w.worker_id(), " (", w.address(),
                                  ") lease expired (no heartbeat for ",
                                  absl::FormatDuration(registry_.lease_ttl()), ")"),
                     /*name_rank=*/false, effects);
  }
}

void Coordinator::WorkerGoneLocked(const baton::v1::WorkerInfo& w, const std::string& why,
                                   bool name_rank, Effects* effects) {
  if (w.state() != baton::v1::WORKER_STATE_BUSY || w.job_id().empty()) return;
  if (ActiveJob* j = FindActiveLocked(w.job_id())) {
    Apply(j, WorkerGoneEvent(j, w.worker_id(), why, name_rank, Ctx()), effects);
  }
}

QuotaLimits Coordinator::LimitsOf(const std::string& user, const std::string& role) const {
  return options_.quotas != nullptr ? options_.quotas->LimitsFor(user, role) : DefaultLimits(role);
}

void Coordinator::PlaceQueuedLocked(Effects* effects) {
  QueueRoundInput in;
  in.idle = registry_.IdleWorkers();
  for (const baton::v1::WorkerInfo& w : registry_.List()) {
    if (w.state() != baton::v1::WORKER_STATE_DEAD) in.registered.push_back(w);
  }
  in.preempt = options_.preempt;
  in.now = Now();
  in.reserve_after = options_.reserve_after;
  // A round that starts 1,000 jobs holds mu_ for tens of milliseconds, and heartbeats wait
  // on it: start at most this many per round, and loop again at once for the rest.
  in.max_starts = 128;
  std::vector<ActiveJob*> queued = QueueInputLocked(&in);  // by QueuedJob index
  const QueueRound round = PlanQueueRound(in);
  if (round.more) WakeLoop();
  // The queue keeps the jobs still waiting, in their order (one pass, not one per start).
  std::vector<bool> started(queued.size(), false);
  for (const QueueRound::Start& start : round.starts) started[start.index] = true;
  queue_.clear();
  for (size_t i = 0; i < queued.size(); ++i) {
    if (!started[i]) queue_.push_back(queued[i]->job.id());
  }
  for (const QueueRound::Start& start : round.starts) {
    ActiveJob* j = queued[start.index];
    j->job.set_queue_position(0);
    j->job.clear_wait_reason();
    StartQueuedLocked(j, start, in.idle, effects);
  }
  if (round.preemption.has_value()) {
    ActiveJob* head = FindActiveLocked(round.preemption->for_job);
    for (const std::string& victim : round.preemption->victims) {
      ActiveJob* v = FindActiveLocked(victim);
      if (v == nullptr || head == nullptr) continue;
      const PreemptDecision d = PreemptEvent(v, head);
      Apply(v, d.victim, effects);
      Apply(head, d.for_job, effects);
    }
  }
  // Say why the others wait: a new history entry only when what a job waits for changes,
  // so history stays short however deep the queue; the position and the whole reason are
  // on the job (GetJob, ListJobs).
  for (const QueueRound::Wait& w : round.waits) {
    ActiveJob* j = queued[w.index];
    if (!IsWaitingState(j->job.state())) continue;  // a start above ended it (placement failed)
    j->job.set_queue_position(w.position);
    if (j->job.wait_reason() != w.reason) j->job.set_wait_reason(w.reason);
    if (WaitIsNews(j->job, w.reason)) AppendStateLocked(j, j->job.state(), w.reason);
  }
}

std::vector<ActiveJob*> Coordinator::QueueInputLocked(QueueRoundInput* in) {
  // Who holds workers, and for which queued jobs preemptions are under way.
  std::set<std::string> preempting;
  std::vector<ActiveJob*> placed;
  for (const auto& [id, j] : active_) {
    if (j->ranks.empty()) continue;
    in->held_by_user[j->job.submitted_by()] += static_cast<int>(j->ranks.size());
    if (!IsPlacedState(j->job.state())) continue;
    if (j->preempt_step > 0) preempting.insert(j->preempted_for);
    placed.push_back(j.get());
  }
  std::vector<ActiveJob*> queued;
  queued.reserve(queue_.size());
  in->queue.reserve(queue_.size());
  std::map<std::string, QuotaLimits> limits;  // by user: one lookup per user a round
  std::optional<int32_t> top;                 // the highest priority queued
  for (const std::string& id : queue_) {
    ActiveJob* j = FindActiveLocked(id);
    if (j == nullptr) continue;
    queued.push_back(j);
    const std::string& user = j->job.submitted_by();
    auto limit = limits.find(user);
    if (limit == limits.end()) {
      // Jobs recorded before roles were (an empty role) kept no limits: as an admin's.
      const std::string& role = j->job.submitted_role();
      limit = limits.emplace(user, LimitsOf(user, role.empty() ? "admin" : role)).first;
    }
    const auto bar = preempt_bars_.find(user);
    // A recovering or preempted job is placed again only once its previous workers stopped.
    const bool again = j->job.state() == baton::v1::JOB_STATE_RECOVERING ||
                       j->job.state() == baton::v1::JOB_STATE_PREEMPTED;
    in->queue.push_back(QueuedJobOf(
        *j, again && (j->pending_aborts > 0 || starting_.count(id) > 0 || StillStoppingLocked(j)),
        preempting.count(id) > 0, limit->second,
        bar == preempt_bars_.end()
            ? ""
            : NoPreemptReason(user, bar->second.job_id, bar->second.until, in->now)));
    top = std::max(top.value_or(j->job.spec().priority()), j->job.spec().priority());
  }
  // The running jobs that could stop at a checkpoint for a queued one: only those of lower
  // priority than some queued job (with a queue of equals, the common case, none).
  for (ActiveJob* j : placed) {
    if (!options_.preempt || !top.has_value() || j->job.spec().priority() >= *top) continue;
    std::vector<baton::v1::WorkerInfo> workers;
    for (const RankSlot& slot : j->ranks) {
      if (std::optional<baton::v1::WorkerInfo> w = registry_.Get(slot.worker.worker_id)) {
        workers.push_back(*std::move(w));
      }
    }
    in->running.push_back(RunningJobOf(*j, std::move(workers), in->now, options_.preempt_min_run,
                                       options_.preempt_min_steps));
  }
  return queued;
}

void Coordinator::StartQueuedLocked(ActiveJob* j, const QueueRound::Start& start,
                                    const std::vector<baton::v1::WorkerInfo>& idle,
                                    Effects* effects) {
  const std::string id = start.id;
  baton::v1::JobSpec spec = start.spec;
  // Placed again after a recovery or a preemption: the attempt's record gets the workers.
  const bool again = j->job.state() == baton::v1::JOB_STATE_RECOVERING ||
                     j->job.state() == baton::v1::JOB_STATE_PREEMPTED;
  if (spec.pipeline().schedule() == baton::v1::SCHEDULE_AUTO) {
    // The auto-planner chooses now, for these workers.
    absl::StatusOr<std::string> plan = ChooseAutoPlan(start.choice, idle, &spec, j);
    if (!plan.ok()) {
      const std::string why = absl::StrCat("auto-planner: ", plan.status().message());
      Apply(j, EndEvent(*j, baton::v1::JOB_STATE_FAILED, why, Ctx()), effects);
      return;
    }
    AppendStateLocked(j, j->job.state(), *plan);
  }
  std::vector<PlacedWorker> placed;
  for (size_t i : start.choice.indices) {
    const baton::v1::WorkerInfo& w = idle[i];
    placed.push_back({w.worker_id(),
                      w.address(),
                      w.device(),
                      {w.capabilities().begin(), w.capabilities().end()},
                      w.identity(),
                      registry_.SessionOf(w.worker_id())});
    const absl::Status s = registry_.MarkBusy(w.worker_id(), id);
    if (!s.ok()) LogWarning(s.ToString());  // cannot happen: the worker was just idle
  }
  absl::StatusOr<Placement> placement =
      PlaceJob(spec, id, NewJobKey(), placed, options_.recv_timeout, start.choice.device);
  if (!placement.ok()) {
    for (const PlacedWorker& w : placed) registry_.MarkIdle(w.worker_id, id);
    const std::string why = absl::StrCat("placement failed: ", placement.status().message());
    Apply(j, EndEvent(*j, baton::v1::JOB_STATE_FAILED, why, Ctx()), effects);
    return;
  }
  AppendStateLocked(j, baton::v1::JOB_STATE_PLACING,
                    RecordPlacement(spec, placed, again, ResumePointOf(j->job), start.choice.why,
                                    &*placement, j));
  j->placed_at = Now();
  j->stopping_workers.clear();
  starting_.insert(id);
  effects->starts.push_back(StartCall{id, std::move(placed), std::move(placement->plans)});
}

void Coordinator::Tick() {
  Effects effects;
  {
    MutexLock lock(mu_);
    ExpireLeasesLocked(&effects);
    SettleEchoesLocked(&effects);
    const absl::Time start = absl::Now();
    PlaceQueuedLocked(&effects);
    const absl::Duration took = absl::Now() - start;
    if (options_.metrics != nullptr) options_.metrics->ObservePlacementRound(took);
    if (options_.round_observer) options_.round_observer(took, queue_.size());
  }
  Run(std::move(effects), /*wait=*/false);
}

void Coordinator::SettleEchoesLocked(Effects* effects) {
  // Jobs whose only errors so far are ABORTED or PEER ones: no root cause came in time.
  std::vector<std::string> echoed;
  for (const auto& [id, j] : active_) {
    if (!j->echo.reason.empty() && Now() - j->echo.since >= options_.root_cause_wait) {
      echoed.push_back(id);
    }
  }
  // Silent means half a lease without a heartbeat (1.5 intervals at least): one heartbeat
  // late on a loaded machine is not silence. The silence gets that long and half an
  // interval more to show before the echo is settled for.
  const absl::Duration silent_after =
      std::max(options_.heartbeat_interval * 1.5, registry_.lease_ttl() / 2);
  for (const std::string& id : echoed) {
    ActiveJob* j = FindActiveLocked(id);
    std::map<int, absl::Duration> quiet;
    for (size_t r = 0; r < j->ranks.size(); ++r) {
      const std::optional<baton::v1::WorkerInfo> w = registry_.Get(j->ranks[r].worker.worker_id);
      if (!w.has_value() || !w->has_last_heartbeat()) continue;
      quiet[static_cast<int>(r)] = Now() - FromProtoTime(w->last_heartbeat());
    }
    Apply(j,
          EchoWaitedEvent(*j, quiet, silent_after, silent_after + options_.heartbeat_interval / 2,
                          Ctx()),
          effects);
  }
}

// ---------------------------------------------------------------------------------------
// JobService

absl::StatusOr<Job> Coordinator::SubmitJob(const baton::v1::SubmitJobRequest& request,
                                           const std::string& submitted_by, bool admin) {
  BATON_ASSIGN_OR_RETURN(
      AdmittedJob admitted,
      Admit(request, submitted_by,
            AdmissionOptions{options_.checkpoint_root, options_.data_roots,
                             options_.max_data_file_bytes},
            [this](const baton::v1::JobSpec& spec) { return EarlierRunsOf(spec); }));
  return EnqueueAdmitted(std::move(admitted), submitted_by, admin);
}

absl::StatusOr<Job> Coordinator::EnqueueAdmitted(AdmittedJob admitted,
                                                 const std::string& submitted_by, bool admin) {
  const baton::v1::JobSpec& spec = admitted.spec.proto();
  MutexLock lock(mu_);
  baton::v1::JobCheckpoints checkpoints;
  if (spec.has_resume_from()) {
    BATON_RETURN_IF_ERROR(ResolveResumeLocked(spec, &checkpoints, submitted_by, admin));
  }
  if (spec.has_checkpoint()) {
    BATON_RETURN_IF_ERROR(checkpoint_dirs_.Check(spec.checkpoint().dir(), submitted_by, admin));
  }
  if (!admitted.submission_id.empty()) {
    BATON_ASSIGN_OR_RETURN(std::optional<Job> existing,
                           store_->FindBySubmission(admitted.submission_id));
    if (existing.has_value()) {
      if (!SameSubmission(existing->spec(), spec)) {
        return absl::AlreadyExistsError(
            absl::StrCat("submission_id: \"", EchoInput(admitted.submission_id),
                         "\" was already used for ", existing->id(), " with a different spec"));
      }
      if (ActiveJob* j = FindActiveLocked(existing->id())) return j->job;
      return *existing;
    }
  }
  const std::string role = admin ? "admin" : "submitter";
  int queued = 0;
  for (const auto& [other_id, other] : active_) {
    queued += other->job.state() == baton::v1::JOB_STATE_QUEUED &&
              other->job.submitted_by() == submitted_by;
  }
  BATON_RETURN_IF_ERROR(
      CheckQuota(LimitsOf(submitted_by, role), submitted_by, role, spec.priority(), queued));
  auto active = std::make_unique<ActiveJob>();
  active->seq = store_->NextSequence();
  const std::string id = absl::StrFormat("job-%06d", active->seq);
  if (spec.has_checkpoint()) checkpoint_dirs_.Add(spec.checkpoint().dir(), submitted_by, id);
  const absl::Time now = Now();
  active->job = NewJobRecord(id, submitted_by, role, std::move(checkpoints), now, &admitted);
  active->auto_costs = std::move(admitted.auto_costs);
  active->rank_needs = std::move(admitted.rank_needs);
  BATON_RETURN_IF_ERROR(store_->Insert(active->seq, active->job));
  active->last_persist = now;
  active->log = std::make_shared<JobEventLog>();
  active->queued_since = now;
  Job copy = active->job;
  queue_.push_back(id);
  active_[id] = std::move(active);
  LogWarning(absl::StrCat(id, " QUEUED: submitted", copy.spec().name().empty() ? "" : " as ",
                          copy.spec().name()));
  WakeLoop();
  return copy;
}

absl::StatusOr<Job> Coordinator::CancelJob(const baton::v1::CancelJobRequest& request) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  Effects effects;
  Job result;
  {
    MutexLock lock(mu_);
    ActiveJob* j = FindActiveLocked(request.job_id());
    if (j == nullptr) return store_->Get(request.job_id());  // terminal: unchanged
    result = *Apply(j, CancelEvent(*j, request.reason(), Ctx()), &effects);
  }
  // On return the workers that answered "stopped" are idle; the rest stay busy until their
  // heartbeats report them free.
  Run(std::move(effects), /*wait=*/true);
  return result;
}

absl::StatusOr<Job> Coordinator::SetJobPriority(const std::string& job_id, int32_t priority) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  MutexLock lock(mu_);
  ActiveJob* j = FindActiveLocked(job_id);
  if (j == nullptr) {
    BATON_ASSIGN_OR_RETURN(const Job ended, store_->Get(job_id));  // NOT_FOUND passes through
    return absl::FailedPreconditionError(absl::StrCat(
        job_id, " is ", JobState_Name(ended.state()), ": only a waiting job's priority changes"));
  }
  const JobState state = j->job.state();
  if (std::find(queue_.begin(), queue_.end(), job_id) == queue_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        job_id, " is ", JobState_Name(state), ": only a waiting job's priority changes"));
  }
  const int32_t before = j->job.spec().priority();
  j->job.mutable_spec()->set_priority(priority);
  AppendStateLocked(j, state, absl::StrCat("priority ", before, " -> ", priority));
  WakeLoop();
  return j->job;
}

absl::StatusOr<baton::v1::ReportProgressResponse> Coordinator::RecordProgress(
    const baton::v1::ReportProgressRequest& request, Effects* effects) {
  MutexLock lock(mu_);
  ActiveJob* j = FindActiveLocked(request.job_id());
  BATON_ASSIGN_OR_RETURN(ProgressDecision out, ProgressEvent(j, request, Ctx()));
  Apply(j, out.decision, effects);
  return out.response;
}

absl::StatusOr<baton::v1::ReportProgressResponse> Coordinator::ReportProgress(
    const baton::v1::ReportProgressRequest& request) {
  Effects effects;
  absl::StatusOr<baton::v1::ReportProgressResponse> result =
      RecordProgress(request, &effects);
  Run(std::move(effects), /*wait=*/false);
  BATON_ASSIGN_OR_RETURN(baton::v1::ReportProgressResponse response, std::move(result));
  // The trace goes to the store outside mu_: it is the bulk of the request, and only
  // GetJobTrace reads it back.
  if (response.keep_running() && request.has_trace()) {
    baton::v1::RankTrace trace = request.trace();
    trace.set_rank(request.rank());
    absl::Status s =
        store_->PutTrace(request.job_id(), request.step(), trace, options_.trace_steps);
    if (!s.ok()) LogWarning(absl::StrCat("trace of ", request.job_id(), " lost: ", s.ToString()));
  }
  return response;
}

absl::StatusOr<baton::v1::ReportResultResponse> Coordinator::ReportResult(
    const baton::v1::ReportResultRequest& request) {
  Effects effects;
  {
    MutexLock lock(mu_);
    ActiveJob* j = FindActiveLocked(request.job_id());
    if (j == nullptr || !IsPlacedState(j->job.state())) {
      // Already ended (an abort echo from a rank, say): nothing to do, unless the id is not
      // a job at all.
      if (j == nullptr) BATON_RETURN_IF_ERROR(store_->Get(request.job_id()).status());
      return baton::v1::ReportResultResponse();
    }
    BATON_ASSIGN_OR_RETURN(const Decision d, RankResultEvent(j, request, Ctx()));
    Apply(j, d, &effects);
  }
  Run(std::move(effects), /*wait=*/false);
  return baton::v1::ReportResultResponse();
}

absl::Status Coordinator::ResolveResumeLocked(const baton::v1::JobSpec& spec,
                                              baton::v1::JobCheckpoints* checkpoints,
                                              const std::string& submitted_by, bool admin) {
  const baton::v1::ResumeFrom& from = spec.resume_from();
  ActiveJob* const active = FindActiveLocked(from.job_id());
  Job source;
  if (active != nullptr) {
    source = active->job;
  } else {
    absl::StatusOr<Job> stored = store_->Get(from.job_id());
    if (!stored.ok()) {
      if (stored.status().code() != absl::StatusCode::kNotFound) return stored.status();
      return absl::InvalidArgumentError(
          absl::StrCat("resume_from.job_id: there is no job ", EchoInput(from.job_id())));
    }
    source = *std::move(stored);
  }
  return CheckResumeSource(spec, source, /*ended=*/active == nullptr, submitted_by, admin,
                           checkpoints);
}

// ---------------------------------------------------------------------------------------
// Carrying out decisions (mu_ held)

std::optional<Job> Coordinator::Apply(ActiveJob* j, const Decision& d, Effects* effects) {
  for (const Effect& e : d.effects) {
    if (const auto* abort = std::get_if<effect::AbortWorkers>(&e)) {
      effects->aborts.push_back(abort->call);
    } else if (j == nullptr) {
      continue;  // the job is gone: only calls to its workers are left to make
    } else if (std::holds_alternative<effect::Remove>(e)) {
      return RemoveLocked(j);
    } else {
      std::visit([&](const auto& x)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ApplyEffectLocked(j, x, effects); },
                 e);
    }
  }
  return std::nullopt;
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::Note& e, Effects*) {
  AppendStateLocked(j, NoteState(j->job.state()), e.reason);
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::SetState& e, Effects*) {
  AppendStateLocked(j, e.next, e.reason);
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::FreeWorker& e, Effects*) {
  registry_.MarkIdle(e.worker_id, j->job.id());
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::CheckpointComplete& e, Effects*) {
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveCheckpoint(e.tally.write_time, e.tally.bytes);
  }
  LogWarning(absl::StrCat(j->job.id(), " checkpoint after step ", e.step, " complete (",
                          e.tally.bytes, " bytes, slowest rank ",
                          absl::FormatDuration(e.tally.write_time), ")"));
  PersistLocked(j);
}

void Coordinator::ApplyEffectLocked(ActiveJob*, const effect::RecoveryResumed& e, Effects*) {
  if (options_.metrics != nullptr) options_.metrics->ObserveRecovery(e.took);
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::StepDone& e, Effects*) {
  // The job's history (GetJobHistory), without the stages. A store that cannot take it
  // loses this step's row, not the job.
  if (absl::Status s = store_->PutStep(j->job.id(), e.step); !s.ok()) {
    LogWarning(absl::StrCat("step ", e.step.step(), " of ", j->job.id(),
                            " missing from its history: ", s.ToString()));
  }
  JobEvent event;
  *event.mutable_step() = e.step;
  EmitLocked(j, std::move(event));
  if (e.persist) PersistLocked(j);
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::RecordRecovery& e, Effects*) {
  baton::v1::Recovery* r = j->job.add_recoveries();
  *r = e.record;
  if (!r->preempted_by().empty()) {
    if (ActiveJob* by = FindActiveLocked(r->preempted_by())) {
      r->set_preempted_by_user(by->job.submitted_by());
    }
  }
  if (options_.metrics == nullptr) return;
  if (r->preempted_by().empty()) {
    options_.metrics->AddRecovery();
  } else {
    options_.metrics->AddPreemption();
  }
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::StopRanks& e, Effects* effects) {
  AbortCall abort;
  abort.job_id = j->job.id();
  abort.reason = e.reason;
  for (RankSlot& slot : j->ranks) {
    if (!slot.held) continue;
    slot.held = false;
    registry_.Unwant(slot.worker.worker_id, abort.job_id);  // its heartbeats now get an abort
    abort.workers.push_back(slot.worker);
  }
  if (abort.workers.empty()) return;
  if (e.counted) {
    abort.counted = true;  // it is placed again once these returned
    ++j->pending_aborts;
  }
  effects->aborts.push_back(std::move(abort));
}

void Coordinator::ApplyEffectLocked(ActiveJob*, const effect::AbortWorkers&, Effects*) {
  // Apply adds the call (the job may be gone).
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::ForgetAttempt& e, Effects*) {
  j->ranks.clear();
  j->digests.clear();
  j->timings.clear();
  j->checkpoints.clear();
  j->resumed_from.clear();
  j->peak_inflight.clear();
  j->echo = EchoFailure();
  j->preempt_step = 0;
  j->preempted_for.clear();
  j->stop_sent = false;
  j->job.clear_workers();
  j->job.set_steps_done(e.steps_done);
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::Requeue& e, Effects*) {
  const std::string& id = j->job.id();
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  // RECOVERING: the queue policy puts it before queued jobs; PREEMPTED: in priority order.
  if (e.first) {
    queue_.push_front(id);
  } else {
    queue_.push_back(id);
  }
  j->queued_since = Now();
  WakeLoop();
}

void Coordinator::ApplyEffectLocked(ActiveJob* j, const effect::BarPreemptions& e,
                                    Effects* effects) {
  const std::string job_id = j->job.id();
  preempt_bars_[e.user] = PreemptBar{e.until, job_id};
  LogWarning(
      absl::StrCat(job_id, " preempted other jobs and ended without training a step: ", e.user,
                   "'s jobs may not preempt for ", absl::FormatDuration(options_.preempt_penalty)));
  // Jobs it preempted that no rank has been told to stop yet keep running.
  for (auto& [other_id, v] : active_) {
    Apply(v.get(), PreemptionWithdrawnEvent(v.get(), job_id, e.ended), effects);
  }
}

void Coordinator::ApplyEffectLocked(ActiveJob*, const effect::Remove&, Effects*) {
  // Apply removes the job (RemoveLocked) and stops.
}

void Coordinator::ApplyEffectLocked(ActiveJob*, const effect::Wake&, Effects*) { WakeLoop(); }

Job Coordinator::RemoveLocked(ActiveJob* j) {
  const std::string id = j->job.id();
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  j->log->Close();
  Job final_job = std::move(j->job);
  active_.erase(id);
  WakeLoop();  // the queue head may have changed
  return final_job;
}

}  // namespace baton
