#include "coordinator/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/hf.h"
#include "common/core/digest.h"
#include "common/core/log_text.h"
#include "common/core/paths.h"
#include "common/core/status.h"
#include "common/data/dataset.h"
#include "common/plan/measured_run.h"
#include "common/rpc/failure_cause.h"
#include "common/rpc/rpc.h"
#include "common/spec/spec.h"
#include "common/core/mutex.h"
#include "google/protobuf/util/message_differencer.h"

namespace baton {

using baton::v1::Job;
using baton::v1::JobEvent;
using baton::v1::JobState;

namespace {

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
// A ListJobs page ends before its jobs pass this many bytes (gRPC's default limit on a
// received message is 4 MiB; large inline texts made default pages fail).
constexpr int64_t kMaxPageBytes = int64_t{2} << 20;
constexpr size_t kMaxReasonChars = 1024;

// The tensor-tag key of a placement attempt: random (64 bits from the OS's generator), so
// tensors of an earlier attempt (a worker that was stopped and came back) never match a
// later one's, and a stranger cannot guess the tags of a running job from its id.
uint64_t NewJobKey() {
  std::random_device os;  // /dev/urandom
  uint64_t key = 0;
  while (key == 0) key = (static_cast<uint64_t>(os()) << 32) ^ static_cast<uint64_t>(os());
  return key;
}

std::string Truncate(std::string s) {
  if (s.size() > kMaxReasonChars) {
    s.resize(kMaxReasonChars);
    s += "...";
  }
  return s;
}

// "RUNNING" for JOB_STATE_RUNNING.
std::string ShortStateName(JobState state) {
  std::string name = baton::v1::JobState_Name(state);
  if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
  return name;
}

// "1 rank", "all 4 ranks".

std::string Ranks(size_t n) { return n == 1 ? "1 rank" : absl::StrCat("all ", n, " ranks"); }

std::string WorkerName(const PlacedWorker& w) {
  return absl::StrCat("worker ", w.worker_id, " (", w.address, ")");
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
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_interval: must be positive, got ",
                     absl::FormatDuration(options.heartbeat_interval)));
  }
  if (options.lease_ttl <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lease_ttl: must be longer than --heartbeat_interval (",
                     absl::FormatDuration(options.heartbeat_interval), "), got ",
                     absl::FormatDuration(options.lease_ttl)));
  }
  if (options.recv_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--recv_timeout: must be positive, got ",
                                                   absl::FormatDuration(options.recv_timeout)));
  }
  if (options.start_timeout <= absl::ZeroDuration() ||
      options.abort_timeout <= absl::ZeroDuration() || options.busy_retry < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "start_timeout and abort_timeout must be positive, busy_retry not negative");
  }
  if (options.trace_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace_steps: must be at least 1, got ", options.trace_steps));
  }
  if (options.max_exports < 1 || options.max_exports_per_caller < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_exports and --max_exports_per_caller: must be at least 1, got ",
        options.max_exports, " and ", options.max_exports_per_caller));
  }
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

absl::Status Coordinator::Recover() {
  BATON_ASSIGN_OR_RETURN(
      auto jobs, store_->ListInStates({baton::v1::JOB_STATE_QUEUED, baton::v1::JOB_STATE_PLACING,
                                       baton::v1::JOB_STATE_RUNNING,
                                       baton::v1::JOB_STATE_RECOVERING,
                                       baton::v1::JOB_STATE_PREEMPTED}));
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
  // What each needs of a worker (the planner's model: not under the lock).
  std::vector<std::vector<int64_t>> needs;
  for (const auto& [seq, job] : jobs) needs.push_back(RankNeeds(job.spec()));
  MutexLock lock(mu_);
  for (auto it = uses.rbegin(); it != uses.rend(); ++it) {
    if (!checkpoint_dirs_.Add(it->dir, it->user, it->job_id)) {
      LogWarning(absl::StrCat(it->job_id, "'s checkpoint.dir '", it->dir,
                              "' is not a directory a job may own (the checkpoint root itself, "
                              "or users/): it claims nothing for its submitter ", it->user));
    }
  }
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
      FailLocked(id, "coordinator restarted while the job was running",
                 baton::v1::FAILURE_CAUSE_WORKER_LOST, &none);
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
    if (j == nullptr || OnStartAnswered(j->job.state()) == StartAnswer::kAbortAgain) {
      // The job ended while its plans were on the way (cancelled, a worker died): an abort
      // may have reached a worker before its plan did. Abort again, then free them all.
      AbortCall again;
      again.job_id = job_id;
      again.reason = "the job ended while it was being started";
      again.workers = workers;
      if (j != nullptr) {  // recovering: it waits for these workers
        again.counted = true;
        ++j->pending_aborts;
      }
      effects.aborts.push_back(std::move(again));
    } else {
      int failed = -1;
      for (size_t i = 0; i < results.size(); ++i) {
        if (!results[i].ok() && results[i].code() != absl::StatusCode::kCancelled) {
          failed = static_cast<int>(i);
          break;
        }
      }
      if (failed < 0) {
        for (size_t i = 0; i < results.size() && failed < 0; ++i) {
          if (!results[i].ok()) failed = static_cast<int>(i);
        }
      }
      if (failed < 0) {
        j->last_step_at = Now();
        j->running_since = Now();
        j->attempt_first_step = j->job.steps_done();
        AppendStateLocked(j, baton::v1::JOB_STATE_RUNNING,
                          absl::StrCat(Ranks(workers.size()), " started"));
      } else {
        const absl::Status& s = results[failed];
        FailLocked(
            job_id,
            absl::StrCat("StartJob on ", WorkerName(workers[failed]), " for rank ", failed,
                         " failed: ", absl::StatusCodeToString(s.code()), ": ", s.message()),
            FailureCauseOf(s, FailureSite::kStartCall), &effects);
      }
    }
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
  change.set_reason(Truncate(reason));
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

Job Coordinator::EndJobLocked(const std::string& job_id_ref, JobState state,
                              const std::string& reason, Effects* effects) {
  const std::string job_id = job_id_ref;  // the reference may point into the job itself
  ActiveJob* j = FindActiveLocked(job_id);
  if (j == nullptr) return Job();
  if (j->preempted_others && state != baton::v1::JOB_STATE_SUCCEEDED) {
    // It stopped other jobs and never trained on their workers: that counts against its
    // user, whose jobs may not preempt for a while.
    const std::string& user = j->job.submitted_by();
    preempt_bars_[user] = PreemptBar{Now() + options_.preempt_penalty, job_id};
    LogWarning(absl::StrCat(job_id, " preempted other jobs and ended without training a step: ",
                            user, "'s jobs may not preempt for ",
                            absl::FormatDuration(options_.preempt_penalty)));
    // Jobs it preempted that no rank has been told to stop yet keep running.
    for (auto& [other_id, v] : active_) {
      if (v->preempted_for != job_id || v->preempt_step == 0 || v->stop_sent) continue;
      v->preempt_step = 0;
      v->preempted_for.clear();
      AppendStateLocked(v.get(), NoteState(v->job.state()),
                        absl::StrCat("preemption withdrawn: ", job_id, " ended (",
                                     ShortStateName(state), ") before any rank stopped"));
    }
  }
  AppendStateLocked(j, state, reason);
  AbortCall abort;
  abort.job_id = job_id;
  abort.reason = Truncate(reason);
  for (RankSlot& slot : j->ranks) {
    if (!slot.held) continue;
    slot.held = false;
    registry_.Unwant(slot.worker.worker_id, job_id);  // its heartbeats now get an abort
    abort.workers.push_back(slot.worker);
  }
  if (!abort.workers.empty()) effects->aborts.push_back(std::move(abort));
  queue_.erase(std::remove(queue_.begin(), queue_.end(), job_id), queue_.end());
  j->log->Close();
  Job final_job = std::move(j->job);
  active_.erase(job_id);
  WakeLoop();  // the queue head may have changed
  return final_job;
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

absl::StatusOr<RankSlot*> Coordinator::RankLocked(ActiveJob* job, int rank,
                                                  const std::string& worker_id) {
  if (rank < 0 || rank >= static_cast<int>(job->ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", rank, " is out of range; ", job->job.id(), " has ", job->ranks.size(), " ranks"));
  }
  RankSlot* slot = &job->ranks[rank];
  if (slot->worker.worker_id != worker_id) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of ", job->job.id(),
                                                      " runs on ", slot->worker.worker_id, ", not ",
                                                      EchoInput(worker_id)));
  }
  return slot;
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
                     effects);
  }
}

void Coordinator::WorkerGoneLocked(const baton::v1::WorkerInfo& w, const std::string& why,
                                   Effects* effects) {
  if (w.state() != baton::v1::WORKER_STATE_BUSY || w.job_id().empty()) return;
  ActiveJob* j = FindActiveLocked(w.job_id());
  if (j == nullptr) return;
  bool held = false;
  for (RankSlot& slot : j->ranks) {
    if (slot.worker.worker_id == w.worker_id() && slot.held) {
      slot.held = false;  // dead: not contacted
      held = true;
    }
  }
  if (!held) return;  // it ran an earlier attempt of a recovering job
  FailLocked(w.job_id(), why, baton::v1::FAILURE_CAUSE_WORKER_LOST, effects);
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
  // Who holds workers, and for which queued jobs preemptions are under way.
  std::set<std::string> preempting;
  std::vector<std::pair<const std::string*, ActiveJob*>> placed;
  for (const auto& [id, j] : active_) {
    if (j->ranks.empty()) continue;
    in.held_by_user[j->job.submitted_by()] += static_cast<int>(j->ranks.size());
    if (!IsPlacedState(j->job.state())) continue;
    if (j->preempt_step > 0) preempting.insert(j->preempted_for);
    placed.emplace_back(&id, j.get());
  }
  in.preempt = options_.preempt;
  in.now = Now();
  in.reserve_after = options_.reserve_after;
  // A round that starts 1,000 jobs holds mu_ for tens of milliseconds, and heartbeats wait
  // on it: start at most this many per round, and loop again at once for the rest.
  in.max_starts = 128;
  std::vector<std::string> still;
  std::vector<ActiveJob*> queued;  // by QueuedJob index
  queued.reserve(queue_.size());
  in.queue.reserve(queue_.size());
  std::map<std::string, QuotaLimits> limits;  // by user: one lookup per user a round
  std::optional<int32_t> top;                 // the highest priority queued
  for (const std::string& id : queue_) {
    ActiveJob* j = FindActiveLocked(id);
    if (j == nullptr) continue;
    still.push_back(id);
    queued.push_back(j);
    QueuedJob q;
    q.id = id;
    // Not a copy: the round reads the job's own spec (aliasing, owning nothing).
    q.spec = std::shared_ptr<const baton::v1::JobSpec>(std::shared_ptr<void>(), &j->job.spec());
    q.recovering = j->job.state() == baton::v1::JOB_STATE_RECOVERING;
    // A recovering or preempted job is placed again only once its previous workers stopped.
    q.stopping = (q.recovering || j->job.state() == baton::v1::JOB_STATE_PREEMPTED) &&
                 (j->pending_aborts > 0 || starting_.count(id) > 0 || StillStoppingLocked(j));
    q.preempting = preempting.count(id) > 0;
    q.rank_need_bytes = q.recovering ? RankNeedBytes(*q.spec) : BusiestRankBytes(j->rank_needs);
    if (!q.recovering) {
      q.rank_needs =
          std::shared_ptr<const std::vector<int64_t>>(std::shared_ptr<void>(), &j->rank_needs);
    }
    q.seq = j->seq;
    q.queued_since = j->queued_since;
    q.user = j->job.submitted_by();
    if (auto bar = preempt_bars_.find(q.user);
        bar != preempt_bars_.end() && in.now < bar->second.until) {
      q.no_preempt = absl::StrCat(q.user, "'s ", bar->second.job_id,
                                  " preempted other jobs and ended without training a step, so ",
                                  q.user, "'s jobs may not preempt until ",
                                  absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", bar->second.until,
                                                   absl::UTCTimeZone()));
    }
    auto limit = limits.find(q.user);
    if (limit == limits.end()) {
      // Jobs recorded before roles were (an empty role) kept no limits: as an admin's.
      const std::string& role = j->job.submitted_role();
      limit = limits.emplace(q.user, LimitsOf(q.user, role.empty() ? "admin" : role)).first;
    }
    q.limits = limit->second;
    top = std::max(top.value_or(q.spec->priority()), q.spec->priority());
    in.queue.push_back(std::move(q));
  }
  // The running jobs that could stop at a checkpoint for a queued one: only those of lower
  // priority than some queued job (with a queue of equals, the common case, none).
  for (const auto& [id, j] : placed) {
    if (!options_.preempt || !top.has_value() || j->job.spec().priority() >= *top) continue;
    RunningJob r;
    r.id = *id;
    r.priority = j->job.spec().priority();
    r.started = j->placed_at;
    bool reported = true;
    int64_t newest = 0;
    for (const RankSlot& slot : j->ranks) {
      reported = reported && slot.held && slot.reported_step > 0;
      newest = std::max(newest, slot.reported_step);
      if (std::optional<baton::v1::WorkerInfo> w = registry_.Get(slot.worker.worker_id)) {
        r.workers.push_back(*std::move(w));
      }
    }
    r.preemptible = j->job.state() == baton::v1::JOB_STATE_RUNNING &&
                    j->job.spec().has_checkpoint() && j->preempt_step == 0 &&
                    j->echo.reason.empty() && reported && newest + 1 < j->job.spec().steps();
    // Protected until this attempt has run long enough: a job just resumed keeps its workers.
    const absl::Duration ran = in.now - j->running_since;
    const int64_t trained = newest - j->attempt_first_step;
    if (r.preemptible &&
        (ran < options_.preempt_min_run || trained < options_.preempt_min_steps)) {
      r.protection = absl::StrCat(
          j->attempt() > 0 ? "resumed " : "started ", absl::ToInt64Seconds(ran),
          "s ago and trained ", trained, trained == 1 ? " step" : " steps",
          "; jobs run ", absl::FormatDuration(options_.preempt_min_run), " and ",
          options_.preempt_min_steps, " steps before they may be preempted");
    }
    in.running.push_back(std::move(r));
  }
  const QueueRound round = PlanQueueRound(in);
  if (round.more) WakeLoop();
  // The queue keeps the jobs still waiting, in their order (one pass, not one per start).
  std::vector<bool> started(still.size(), false);
  for (const QueueRound::Start& start : round.starts) started[start.index] = true;
  queue_.clear();
  for (size_t i = 0; i < still.size(); ++i) {
    if (!started[i]) queue_.push_back(still[i]);
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
      if (v != nullptr && head != nullptr) PreemptLocked(v, head);
    }
  }
  // Say why the others wait: a new history entry only when what a job waits for changes
  // (not when its position or an idle count changes), so history stays short however deep
  // the queue; the position and the whole reason are on the job (GetJob, ListJobs).
  auto what = [](absl::string_view reason) { return reason.substr(0, reason.find(" (")); };
  for (const QueueRound::Wait& w : round.waits) {
    ActiveJob* j = queued[w.index];
    if (!IsWaitingState(j->job.state())) continue;  // a start above ended it (placement failed)
    j->job.set_queue_position(w.position);
    if (j->job.wait_reason() != w.reason) j->job.set_wait_reason(w.reason);
    const auto& history = j->job.history();
    if (history.empty() || history.rbegin()->state() != j->job.state() ||
        what(history.rbegin()->reason()) != what(w.reason)) {
      AppendStateLocked(j, j->job.state(), w.reason);
    }
  }
}

void Coordinator::StartQueuedLocked(ActiveJob* j, const QueueRound::Start& start,
                                    const std::vector<baton::v1::WorkerInfo>& idle,
                                    Effects* effects) {
  const std::string id = start.id;
  baton::v1::JobSpec spec = start.spec;
  const WorkerChoice& choice = start.choice;
  // Placed again after a recovery or a preemption: the attempt's record gets the workers.
  const bool recovering = j->job.state() == baton::v1::JOB_STATE_RECOVERING ||
                          j->job.state() == baton::v1::JOB_STATE_PREEMPTED;
  if (spec.pipeline().schedule() == baton::v1::SCHEDULE_AUTO) {
    // The auto-planner chooses now, for these workers (a GPU job's budget is the smallest
    // GPU's memory), and the choice sticks: a recovery or resume trains the same clock.
    int64_t budget = 0;
    for (size_t i : choice.indices) {
      const int64_t m = idle[i].device().memory_bytes();
      if (choice.device == Device::kCuda && m > 0) budget = budget == 0 ? m : std::min(budget, m);
    }
    absl::StatusOr<Plan> plan = ResolveAutoPipeline(&spec, budget, j->auto_costs);
    if (!plan.ok()) {
      EndJobLocked(id, baton::v1::JOB_STATE_FAILED,
                   absl::StrCat("auto-planner: ", plan.status().message()), effects);
      return;
    }
    baton::v1::PipelineSpec* chosen = j->job.mutable_spec()->mutable_pipeline();
    chosen->set_schedule(spec.pipeline().schedule());
    chosen->set_virtual_stages(spec.pipeline().virtual_stages());
    chosen->set_microbatches(spec.pipeline().microbatches());
    *chosen->mutable_partition() = spec.pipeline().partition();
    AppendStateLocked(j, j->job.state(), SummarizePlan(*plan));
  }
  std::vector<PlacedWorker> placed;
  for (size_t i : choice.indices) {
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
  absl::StatusOr<Placement> placement = PlaceJob(spec, id, NewJobKey(), placed,
                                                 options_.recv_timeout, choice.device);
  if (!placement.ok()) {
    for (const PlacedWorker& w : placed) registry_.MarkIdle(w.worker_id, id);
    EndJobLocked(id, baton::v1::JOB_STATE_FAILED,
                 absl::StrCat("placement failed: ", placement.status().message()), effects);
    return;
  }
  const auto [resume_dir, resume_step] = ResumePointOf(j->job);
  for (baton::v1::JobPlan& plan : placement->plans) {
    plan.set_attempt(j->attempt());
    if (!resume_dir.empty()) {
      plan.set_resume_job_dir(resume_dir);
      plan.set_resume_step(resume_step);
    }
  }
  j->layout = std::move(placement->layout);
  j->ranks.clear();
  std::vector<std::string> names;
  for (const PlacedWorker& w : placed) {
    j->ranks.push_back(RankSlot{w});
    j->job.add_workers(w.worker_id);
    names.push_back(w.worker_id);
  }
  *j->job.mutable_pipeline() = placement->report;
  j->peak_inflight.assign(placed.size(), 0);
  std::string recovery;
  if (recovering) {
    baton::v1::Recovery* r = j->job.mutable_recoveries(j->attempt() - 1);
    r->set_stages_after(spec.pipeline().stages());
    for (const std::string& n : names) r->add_workers_after(n);
    recovery = absl::StrCat(r->preempted_by().empty() ? "recovery " : "resuming after preemption ",
                            j->attempt(), ": ", r->stages_before(), " -> ",
                            spec.pipeline().stages(), " stages, from ",
                            resume_dir.empty() ? std::string("the start")
                            : resume_step > 0  ? absl::StrCat("step ", resume_step)
                                               : std::string("the newest checkpoint"),
                            "; ");
  }
  AppendStateLocked(j, baton::v1::JOB_STATE_PLACING,
                    absl::StrCat("placing on ", absl::StrJoin(names, ", "), " (", recovery,
                                 choice.why, ")"));
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
    // Jobs whose only errors so far are ABORTED or PEER ones: no root cause came in time.
    std::vector<std::string> echoed;
    for (const auto& [id, j] : active_) {
      if (!j->echo.reason.empty() && Now() - j->echo.since >= options_.root_cause_wait) {
        echoed.push_back(id);
      }
    }
    for (const std::string& id : echoed) {
      ActiveJob* j = FindActiveLocked(id);
      // No rank said what went wrong: a worker that stopped heartbeating (killed, frozen,
      // cut off) is the likely root cause, and is named, before its lease runs out. Silent
      // means half a lease without a heartbeat (1.5 intervals at least): one heartbeat late
      // on a loaded machine is not silence. Give the silence that long and half an interval
      // more to show before settling for the echo.
      const absl::Duration silent_after =
          std::max(options_.heartbeat_interval * 1.5, registry_.lease_ttl() / 2);
      std::vector<std::string> silent;
      for (const RankSlot& slot : j->ranks) {
        if (!slot.held) continue;
        const std::optional<baton::v1::WorkerInfo> w = registry_.Get(slot.worker.worker_id);
        if (!w.has_value() || !w->has_last_heartbeat()) continue;
        const absl::Duration quiet = Now() - FromProtoTime(w->last_heartbeat());
        if (quiet > silent_after) {
          silent.push_back(absl::StrCat(WorkerName(slot.worker), " silent for ",
                                        absl::FormatDuration(absl::Trunc(quiet, absl::Milliseconds(1)))));
        }
      }
      if (silent.empty() &&
          Now() - j->echo.since < silent_after + options_.heartbeat_interval / 2) {
        continue;
      }
      if (!silent.empty()) {
        FailLocked(id,
                   absl::StrCat(absl::StrJoin(silent, ", "), " (no heartbeat; presumed lost); ",
                                "first report: ", j->echo.reason),
                   baton::v1::FAILURE_CAUSE_WORKER_LOST, &effects);
      } else {
        FailLocked(id, std::string(j->echo.reason), j->echo.cause, &effects);
      }
    }
    const absl::Time start = absl::Now();
    PlaceQueuedLocked(&effects);
    const absl::Duration took = absl::Now() - start;
    if (options_.metrics != nullptr) options_.metrics->ObservePlacementRound(took);
    if (options_.round_observer) options_.round_observer(took, queue_.size());
  }
  Run(std::move(effects), /*wait=*/false);
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

absl::StatusOr<std::unique_ptr<Coordinator::Export>> Coordinator::ExportJob(
    const baton::v1::ExportJobRequest& request, const std::string& caller) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: a step number (0: the newest checkpoint), got ", request.step()));
  }
  BATON_ASSIGN_OR_RETURN(Job job, GetJob(request.job_id()));
  if (!job.spec().has_checkpoint() || job.checkpoints().job_dir().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.id(), " has no checkpoints (its spec sets none)"));
  }
  // A place under the caps before any file is read: the hash check reads the whole
  // checkpoint.
  auto out = std::make_unique<Export>();
  BATON_ASSIGN_OR_RETURN(out->slot, export_caps_.Acquire(caller));
  const std::string& dir = job.checkpoints().job_dir();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator cannot read ", job.id(), "'s checkpoint directory ", dir,
        " (mount the checkpoint root on the coordinator, or export with batonctl export "
        "--from on a host that has it)"));
  }
  std::vector<std::string> skipped;
  // Every file hashed (in pieces), then opened for streaming, which hashes them again.
  BATON_ASSIGN_OR_RETURN(
      out->step, FindCheckpoint(dir, {}, request.step() > 0 ? request.step() : -1, &skipped));
  out->dir = CheckpointStepDir(dir, out->step);
  BATON_ASSIGN_OR_RETURN(out->weights, WeightsExport::Open(out->dir));
  return out;
}

absl::StatusOr<Job> Coordinator::GetJob(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  MutexLock lock(mu_);
  if (ActiveJob* j = FindActiveLocked(job_id)) return j->job;
  return store_->Get(job_id);
}

absl::StatusOr<baton::v1::ListJobsResponse> Coordinator::ListJobs(
    const baton::v1::ListJobsRequest& request) {
  int page_size = request.page_size();
  if (page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must not be negative, got ", page_size));
  }
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  BATON_ASSIGN_OR_RETURN(JobStore::Page page,
                         store_->List(page_size, request.page_token(), kMaxPageBytes));
  baton::v1::ListJobsResponse response;
  MutexLock lock(mu_);
  for (Job& job : page.jobs) {
    // Running jobs are fresher in memory (steps are written to the store now and then). One
    // that ended since the page was read is read again (under mu_ the store is current), so
    // the page shows every job as of one moment: no job ended and its successor placed.
    if (ActiveJob* j = FindActiveLocked(job.id())) {
      job = j->job;
    } else if (!IsTerminalState(job.state())) {
      if (absl::StatusOr<Job> ended = store_->Get(job.id()); ended.ok()) job = *std::move(ended);
    }
    *response.add_jobs() = std::move(job);
  }
  response.set_next_page_token(page.next_page_token);
  return response;
}

absl::StatusOr<Job> Coordinator::CancelJob(const baton::v1::CancelJobRequest& request) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id: required");
  Effects effects;
  Job result;
  {
    MutexLock lock(mu_);
    ActiveJob* j = FindActiveLocked(request.job_id());
    if (j == nullptr) return store_->Get(request.job_id());  // terminal: unchanged
    const std::string reason = request.reason().empty()
                                   ? "cancelled by request"
                                   : absl::StrCat("cancelled: ", request.reason());
    const JobTransition t = OnCancel(reason);
    result = EndJobLocked(request.job_id(), t.next, t.reason, &effects);
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

absl::StatusOr<std::unique_ptr<JobWatch>> Coordinator::WatchJob(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  MutexLock lock(mu_);
  JobEvent first;
  first.set_job_id(job_id);
  *first.mutable_time() = ToProtoTime(Now());
  if (ActiveJob* j = FindActiveLocked(job_id)) {
    if (!j->job.history().empty()) *first.mutable_state_change() = *j->job.history().rbegin();
    return std::make_unique<JobWatch>(j->log, j->log->End(), std::move(first));
  }
  BATON_ASSIGN_OR_RETURN(Job job, store_->Get(job_id));
  if (!job.history().empty()) *first.mutable_state_change() = *job.history().rbegin();
  auto log = std::make_shared<JobEventLog>();
  log->Close();
  return std::make_unique<JobWatch>(std::move(log), 0, std::move(first));
}

StateCounts Coordinator::CountStates() {
  StateCounts counts;
  counts.exports = export_caps_.in_use();
  for (const char* state : {"idle", "busy", "dead"}) counts.workers[state] = 0;
  {
    MutexLock lock(mu_);
    for (const baton::v1::WorkerInfo& w : registry_.List()) {
      switch (w.state()) {
        case baton::v1::WORKER_STATE_IDLE: ++counts.workers["idle"]; break;
        case baton::v1::WORKER_STATE_BUSY: ++counts.workers["busy"]; break;
        case baton::v1::WORKER_STATE_DEAD: ++counts.workers["dead"]; break;
        default: break;
      }
    }
  }
  // Every state gets a series (0 included); when the store cannot be read, none does
  // rather than wrong zeros.
  absl::StatusOr<std::map<JobState, int64_t>> by_state = store_->CountByState();
  if (!by_state.ok()) {
    LogWarning(absl::StrCat("metrics: ", by_state.status().ToString()));
    return counts;
  }
  for (int s = baton::v1::JOB_STATE_QUEUED; s <= baton::v1::JOB_STATE_PREEMPTED; ++s) {
    const auto it = by_state->find(static_cast<JobState>(s));
    std::string name = absl::AsciiStrToLower(JobState_Name(static_cast<JobState>(s)));
    counts.jobs[name.substr(std::string("job_state_").size())] =
        it == by_state->end() ? 0 : it->second;
  }
  return counts;
}

absl::StatusOr<baton::v1::JobTrace> Coordinator::GetJobTrace(
    const baton::v1::GetJobTraceRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be 0 (the latest) or a 1-based step, got ", request.step()));
  }
  BATON_ASSIGN_OR_RETURN(Job job, GetJob(request.job_id()));
  if (job.workers_size() == 0) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has no trace: it never ran"));
  }
  const int ranks = job.workers_size();
  BATON_ASSIGN_OR_RETURN(JobStore::TraceSteps kept, store_->GetTraceSteps(job.id(), ranks));
  if (kept.last == 0) {
    return absl::NotFoundError(
        absl::StrCat("job ", job.id(), " has no trace: no step has finished"));
  }
  const int64_t step = request.step() == 0 ? kept.last_complete : request.step();
  std::vector<baton::v1::RankTrace> traces;
  if (step > 0) {
    BATON_ASSIGN_OR_RETURN(traces, store_->GetTrace(job.id(), step));
  }
  if (traces.empty()) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has no trace of step ", step,
                                            ": steps ", kept.first, " to ", kept.last,
                                            " are kept"));
  }
  baton::v1::JobTrace out;
  out.set_job_id(job.id());
  out.set_step(step);
  out.set_first_kept_step(kept.first);
  out.set_last_kept_step(kept.last);
  // The layout placement built, from the spec (the same function the placement used) with
  // the stages it ran on (a recovery may have re-planned onto fewer).
  baton::v1::JobSpec planned = job.spec();
  if (job.pipeline().stages() > 0) SetPipelineStages(&planned, job.pipeline().stages());
  absl::StatusOr<PipelineLayout> layout = BuildPipelineLayout(planned);
  if (layout.ok()) {
    out.set_num_stages(static_cast<int>(layout->schedule.stage_to_rank.size()));
    for (int r : layout->schedule.stage_to_rank) out.add_stage_to_rank(r);
    out.set_schedule(ScheduleKindName(layout->schedule.kind));
  }
  for (baton::v1::RankTrace& t : traces) {
    if (t.rank() >= 0 && t.rank() < ranks) t.set_worker_id(job.workers(t.rank()));
    *out.add_ranks() = std::move(t);
  }
  return out;
}

absl::StatusOr<baton::v1::JobHistory> Coordinator::GetJobHistory(
    const baton::v1::GetJobHistoryRequest& request) {
  if (request.from_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "from_step: must be 0 (the first step) or a 1-based step, got ", request.from_step()));
  }
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must not be negative, got ", request.page_size()));
  }
  const int64_t page_size = request.page_size() == 0
                                ? kMaxHistoryPageSize
                                : std::min(request.page_size(), kMaxHistoryPageSize);
  BATON_ASSIGN_OR_RETURN(Job job, GetJob(request.job_id()));
  // One row more than the page: whether another page follows.
  BATON_ASSIGN_OR_RETURN(
      std::vector<baton::v1::StepProgress> steps,
      store_->GetSteps(job.id(), std::max<int64_t>(1, request.from_step()), page_size + 1));
  baton::v1::JobHistory out;
  out.set_job_id(job.id());
  if (static_cast<int64_t>(steps.size()) > page_size) {
    steps.pop_back();
    out.set_next_from_step(steps.back().step() + 1);
  }
  for (baton::v1::StepProgress& step : steps) *out.add_steps() = std::move(step);
  return out;
}

std::vector<MeasuredRun> Coordinator::EarlierRunsOf(const baton::v1::JobSpec& spec) {
  std::vector<MeasuredRun> out;
  if (spec.name().empty()) return out;
  // The newest jobs first; a bounded look back (traces are kept for recent jobs only).
  absl::StatusOr<JobStore::Page> page = store_->List(200, "");
  if (!page.ok()) return out;
  for (const Job& job : page->jobs) {
    const int64_t rows = MicrobatchRows(job);
    if (job.spec().name() != spec.name() || job.workers_size() == 0 || rows < 1 ||
        !google::protobuf::util::MessageDifferencer::Equals(job.spec().model(), spec.model())) {
      continue;
    }
    // A second run only if its micro-batch size differs (it is what fits the overhead).
    if (!out.empty() && out.front().rows == rows) continue;
    baton::v1::GetJobTraceRequest req;
    req.set_job_id(job.id());
    absl::StatusOr<baton::v1::JobTrace> trace = GetJobTrace(req);
    if (!trace.ok()) continue;
    absl::StatusOr<MeasuredRun> run = MeasuredRunFromJob(job, *trace);
    if (!run.ok()) continue;
    out.push_back(*std::move(run));
    if (out.size() == 2) break;
  }
  return out;
}

baton::v1::ListWorkersResponse Coordinator::ListWorkers() {
  MutexLock lock(mu_);
  baton::v1::ListWorkersResponse response;
  for (baton::v1::WorkerInfo& w : registry_.List()) *response.add_workers() = std::move(w);
  return response;
}

// ---------------------------------------------------------------------------------------
// ClusterService

absl::StatusOr<baton::v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const baton::v1::RegisterWorkerRequest& request, const WorkerCaller& caller) {
  if (options_.require_worker_certificate && caller.identity.empty()) {
    return absl::UnauthenticatedError(
        "registering a worker needs a certificate signed by the cluster CA (mutual TLS)");
  }
  if (!options_.join_token.empty()) {
    if (caller.join_token.empty()) {
      return absl::UnauthenticatedError(
          "registering a worker needs the cluster's join token (worker --join_token_file)");
    }
    if (!SecretsEqual(caller.join_token, options_.join_token)) {
      return absl::PermissionDeniedError("wrong join token");
    }
  }
  if (options_.require_worker_certificate &&
      std::none_of(caller.uris.begin(), caller.uris.end(), [&](const std::string& u) {
        return absl::StartsWith(u, options_.worker_uri_prefix);
      })) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the certificate of ", caller.identity, " is not a worker's: it carries no URI SAN ",
        options_.worker_uri_prefix, "... (docs/security.md, \"Worker certificates\")"));
  }
  Effects effects;
  baton::v1::RegisterWorkerResponse response;
  absl::Status status;
  {
    MutexLock lock(mu_);
    ExpireLeasesLocked(&effects);  // an expired lease is reported as such, not as "replaced"
    absl::StatusOr<WorkerRegistry::Registration> reg = registry_.Register(request, caller.identity);
    if (!reg.ok()) {
      status = reg.status();
    } else {
      for (const baton::v1::WorkerInfo& old : reg->replaced) {
        LogWarning(absl::StrCat("worker ", old.worker_id(), " (", old.address(),
                                ") replaced by a new registration as ", reg->worker.worker_id()));
        if (old.state() != baton::v1::WORKER_STATE_BUSY || old.job_id().empty()) continue;
        ActiveJob* j = FindActiveLocked(old.job_id());
        if (j == nullptr) continue;
        int rank = -1;
        for (size_t r = 0; r < j->ranks.size(); ++r) {
          if (j->ranks[r].worker.worker_id == old.worker_id() && j->ranks[r].held) {
            j->ranks[r].held = false;  // gone; the new process runs nothing
            rank = static_cast<int>(r);
          }
        }
        if (rank < 0) continue;  // it ran an earlier attempt of a recovering job
        FailLocked(old.job_id(),
                   absl::StrCat("worker ", old.worker_id(), " (", old.address(),
                                ") registered again while running rank ", rank),
                   baton::v1::FAILURE_CAUSE_WORKER_LOST, &effects);
      }
      LogWarning(absl::StrCat("worker ", reg->worker.worker_id(), " registered from ",
                              reg->worker.address(),
                              caller.identity.empty() ? "" : " as " + caller.identity));
      response.set_worker_id(reg->worker.worker_id());
      *response.mutable_heartbeat_interval() = ToProtoDuration(options_.heartbeat_interval);
      *response.mutable_lease_ttl() = ToProtoDuration(options_.lease_ttl);
      WakeLoop();
    }
  }
  Run(std::move(effects), /*wait=*/false);
  if (!status.ok()) return status;
  return response;
}

absl::Status Coordinator::AuthenticateWorker(const std::string& worker_id,
                                             const WorkerCaller& caller) {
  return registry_.CheckSession(worker_id, caller.session, caller.identity);  // its own lock
}

absl::StatusOr<baton::v1::HeartbeatResponse> Coordinator::Heartbeat(
    const baton::v1::HeartbeatRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  baton::v1::HeartbeatResponse response;
  if (request.leaving()) {
    // Shutting down: out of service now, not once the lease runs out.
    Effects effects;
    {
      MutexLock lock(mu_);
      if (std::optional<baton::v1::WorkerInfo> w = registry_.Leave(request.worker_id())) {
        LogWarning(absl::StrCat("worker ", w->worker_id(), " (", w->address(), ") left"));
        WorkerGoneLocked(*w,
                         absl::StrCat("worker ", w->worker_id(), " (", w->address(),
                                      ") shut down while running the job"),
                         &effects);
        WakeLoop();
      }
    }
    Run(std::move(effects), /*wait=*/false);
    response.set_known(false);
    return response;
  }
  // Most heartbeats settle nothing but the lease (an idle worker idle, a busy one running
  // the job it was given): the registry's own lock suffices, and they never wait for a
  // placement round or a report holding mu_.
  const WorkerRegistry::Beat beat =
      registry_.HeartbeatAndCheck(request.worker_id(), request.job_id());
  if (options_.metrics != nullptr && beat.known) {
    options_.metrics->AddHeartbeatsMissed(MissedHeartbeats(beat.previous, Now()));
  }
  response.set_known(beat.known);
  if (!beat.known || beat.settled) return response;
  MutexLock lock(mu_);
  if (request.job_id().empty()) {
    // Busy with a job that no longer holds it (its AbortJob did not get through), and the
    // worker says it runs nothing: free it.
    const std::optional<baton::v1::WorkerInfo> info = registry_.Get(request.worker_id());
    if (info.has_value() && info->state() == baton::v1::WORKER_STATE_BUSY &&
        starting_.count(info->job_id()) == 0) {
      bool held = false;
      if (ActiveJob* j = FindActiveLocked(info->job_id())) {
        for (const RankSlot& slot : j->ranks) {
          held |= slot.worker.worker_id == request.worker_id() && slot.held;
        }
      }
      if (!held && registry_.MarkIdle(request.worker_id(), info->job_id())) WakeLoop();
    }
    return response;
  }
  bool wanted = false;
  if (ActiveJob* j = FindActiveLocked(request.job_id());
      j != nullptr && IsPlacedState(j->job.state())) {
    for (const RankSlot& slot : j->ranks) {
      if (slot.worker.worker_id == request.worker_id() && slot.held && !slot.finished) {
        wanted = true;
      }
    }
  }
  if (!wanted) response.add_abort_job_ids(request.job_id());
  return response;
}

absl::StatusOr<baton::v1::ReportProgressResponse> Coordinator::RecordProgress(
    const baton::v1::ReportProgressRequest& request, Effects* effects) {
  baton::v1::ReportProgressResponse response;
  MutexLock lock(mu_);
  ActiveJob* j = FindActiveLocked(request.job_id());
  if (j == nullptr || !IsPlacedState(j->job.state())) {
    response.set_keep_running(false);
    return response;
  }
  if (request.step() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be at least 1 (1-based), got ", request.step()));
  }
  absl::StatusOr<RankSlot*> slot = RankLocked(j, request.rank(), request.worker_id());
  if (!slot.ok()) {
    if (slot.status().code() == absl::StatusCode::kFailedPrecondition) {
      response.set_keep_running(false);  // not this worker's rank (any more)
      return response;
    }
    return slot.status();
  }
  if (!(*slot)->held || !j->echo.reason.empty() || request.attempt() != j->attempt()) {
    response.set_keep_running(false);
    return response;
  }
  if (j->preempt_step > 0 && request.step() > j->preempt_step) {
    // Cannot happen: each rank waits for its report's answer before its next step.
    response.set_keep_running(false);
    return response;
  }
  (*slot)->reported_step = std::max((*slot)->reported_step, request.step());
  if (j->attempt() > 0) {
    baton::v1::Recovery* r = j->job.mutable_recoveries(j->attempt() - 1);
    if (!r->has_resumed()) {
      // The first step after the resume: the recovery is over.
      *r->mutable_resumed() = ToProtoTime(Now());
      if (options_.metrics != nullptr && r->preempted_by().empty()) {
        options_.metrics->ObserveRecovery(Now() - FromProtoTime(r->detected()));
      }
    }
  }
  if (request.resumed_from_step() > 0) {
    const ResumeTally resume = TallyResume(request, &j->resumed_from, &j->job);
    if (!resume.failure.empty()) {
      EndJobLocked(request.job_id(), baton::v1::JOB_STATE_FAILED, resume.failure, effects);
      response.set_keep_running(false);
      return response;
    }
    if (!resume.note.empty()) AppendStateLocked(j, NoteState(j->job.state()), resume.note);
  }
  j->timings[request.step()][request.rank()] = request.timing();
  // The ranks' word on their links and data-parallel groups, kept once, in the job's
  // pipeline report and (what is new) its history.
  for (const std::string& note : {TallyLinks(request, j->job.mutable_pipeline()),
                                  TallyGroups(request, j->job.mutable_pipeline())}) {
    if (!note.empty()) AppendStateLocked(j, NoteState(j->job.state()), note);
  }
  for (const baton::v1::CheckpointWrite& w : request.checkpoints()) {
    RecordCheckpointLocked(j, request.rank(), w);
  }
  int& peak = j->peak_inflight[request.rank()];
  peak = std::max(peak, request.timing().peak_inflight());
  // Ranks are global (replica * S + rank); the last stage's rank of every replica reports
  // a loss, and the step is done once all of them have: their mean, in replica order.
  const int S = j->layout.schedule.num_ranks;
  const int D = static_cast<int>(j->ranks.size()) / std::max(1, S);
  if (request.rank() % S == j->layout.last_rank) {
    if (D <= 1) {
      OnLastRankStepLocked(j, request);
    } else if (const std::optional<float> mean = TallyReplicaLoss(
                   request.step(), request.rank() / S, request.loss(), D, &j->replica_losses)) {
      baton::v1::ReportProgressRequest combined = request;
      combined.set_loss(*mean);
      OnLastRankStepLocked(j, combined);
    }
  }
  response.set_keep_running(true);
  // Being preempted: the step chosen is this rank's last; it writes that step's checkpoint.
  if (j->preempt_step > 0 && request.step() == j->preempt_step) {
    response.set_checkpoint_and_stop(true);
    j->stop_sent = true;  // the preemption can no longer be withdrawn
  }
  return response;
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

void Coordinator::OnLastRankStepLocked(ActiveJob* j,
                                       const baton::v1::ReportProgressRequest& request) {
  const int64_t k = request.step();
  if (k <= j->job.steps_done()) return;  // a repeat
  const absl::Time now = Now();
  std::vector<std::string> worker_ids;
  for (const RankSlot& slot : j->ranks) worker_ids.push_back(slot.worker.worker_id);
  StepExtras extras;
  extras.learning_rate = request.learning_rate();
  if (request.has_grad_norm()) extras.grad_norm = request.grad_norm();
  if (request.has_val_loss()) extras.val_loss = request.val_loss();
  extras.model_flops_per_step =
      TrainingFlops(j->layout.blocks, 0, static_cast<int>(j->layout.blocks.size()),
                    j->job.spec().data().batch_size());
  if (j->job.spec().eval().only()) {
    // Its step is eval.batches batches forward: a third of a training step's FLOPs each.
    extras.model_flops_per_step *= std::max(1, j->job.spec().eval().batches()) / 3.0;
  }
  std::vector<baton::v1::DeviceInfo> devices;
  for (const RankSlot& slot : j->ranks) devices.push_back(slot.worker.device);
  extras.peak_flops = PeakFlopsOf(devices, j->job.spec().precision() == baton::v1::PRECISION_BF16);
  baton::v1::StepProgress step = MakeStepProgress(
      j->job.spec(), k, request.has_loss() ? std::optional<float>(request.loss()) : std::nullopt,
      StepDuration(request.timing(), now - j->last_step_at), j->timings[k], worker_ids, extras);
  j->job.set_steps_done(k);
  if (request.has_loss()) j->job.set_last_loss(request.loss());
  j->last_step_at = now;
  j->preempted_others = false;  // it trained on the workers it took
  // The job's history (GetJobHistory), without the stages. A store that cannot take it
  // loses this step's row, not the job.
  if (absl::Status s = store_->PutStep(j->job.id(), step); !s.ok()) {
    LogWarning(
        absl::StrCat("step ", k, " of ", j->job.id(), " missing from its history: ", s.ToString()));
  }
  JobEvent event;
  *event.mutable_step() = std::move(step);
  EmitLocked(j, std::move(event));
  if (now - j->last_persist >= options_.progress_persist_interval) PersistLocked(j);
  PruneStepTimings(k, &j->timings);
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
    // An earlier attempt's rank (a worker stopped and continued) has nothing to say.
    if (request.attempt() != j->attempt()) return baton::v1::ReportResultResponse();
    BATON_ASSIGN_OR_RETURN(RankSlot * slot, RankLocked(j, request.rank(), request.worker_id()));
    if (slot->finished || !slot->held) return baton::v1::ReportResultResponse();
    const std::string who =
        absl::StrCat("rank ", request.rank(), " on worker ", request.worker_id());
    // The reporting rank has stopped either way.
    slot->held = false;
    registry_.MarkIdle(request.worker_id(), request.job_id());
    for (const baton::v1::CheckpointWrite& w : request.checkpoints()) {
      RecordCheckpointLocked(j, request.rank(), w);
    }
    std::string failure;
    if (!request.error().empty()) {
      failure = absl::StrCat(who, ": ", request.error());
    } else if (request.stopped_after_step() > 0) {
      if (request.stopped_after_step() == j->preempt_step) {
        slot->stopped = true;
      } else {
        failure = absl::StrCat(who, " stopped after step ", request.stopped_after_step(),
                               j->preempt_step > 0
                                   ? absl::StrCat(", not after step ", j->preempt_step, " as asked")
                                   : std::string(" unasked"));
      }
    } else {
      failure = TallyResultDigests(request, j->layout, &j->digests);
      slot->finished = failure.empty();
    }
    const bool all_reported =
        std::none_of(j->ranks.begin(), j->ranks.end(), [](const RankSlot& s) { return s.held; });
    const bool all_finished =
        std::all_of(j->ranks.begin(), j->ranks.end(), [](const RankSlot& s) { return s.finished; });
    const bool all_stopped =
        std::all_of(j->ranks.begin(), j->ranks.end(), [](const RankSlot& s) { return s.stopped; });
    if (all_stopped) {
      PreemptedLocked(j, &effects);  // every rank stopped where it was asked, without error
    } else {
      const ResultVerdict verdict =
          OnRankResult(request, failure, all_reported, all_finished, Now(), &j->echo);
      switch (verdict.action) {
        case ResultVerdict::Action::kFail:
          FailLocked(request.job_id(), verdict.reason, verdict.cause, &effects);
          break;
        case ResultVerdict::Action::kSucceed:
          SucceedLocked(j, &effects);
          break;
        case ResultVerdict::Action::kNone:
          break;
      }
    }
    WakeLoop();
  }
  Run(std::move(effects), /*wait=*/false);
  return baton::v1::ReportResultResponse();
}

void Coordinator::RecordCheckpointLocked(ActiveJob* j, int rank,
                                         const baton::v1::CheckpointWrite& write) {
  // Replica 0's ranks write a data-parallel job's checkpoints (every replica holds the same
  // weights and optimizer state); the others write none.
  const std::optional<CheckpointTally> t = TallyCheckpointWrite(
      rank, write, j->layout.schedule.num_ranks, j->job.spec().checkpoint().keep(), Now(),
      &j->checkpoints, j->job.mutable_checkpoints());
  if (!t.has_value()) return;
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveCheckpoint(t->write_time, t->bytes);
  }
  LogWarning(absl::StrCat(j->job.id(), " checkpoint after step ", write.step(), " complete (",
                          t->bytes, " bytes, slowest rank ", absl::FormatDuration(t->write_time),
                          ")"));
  PersistLocked(j);
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

void Coordinator::FailLocked(const std::string& job_id_ref, const std::string& reason,
                             baton::v1::FailureCause cause, Effects* effects) {
  const std::string job_id = job_id_ref;  // the reference may point into the job itself
  ActiveJob* j = FindActiveLocked(job_id);
  if (j == nullptr) return;
  const FailureFacts facts = FailureFactsOf(j->job, cause);
  if (j->preempt_step > 0 && IsPlacedState(j->job.state())) {
    ApplyLocked(j, OnPreemptionFailure(facts, j->preempted_for, reason), facts, reason, effects);
    return;
  }
  ApplyLocked(j, OnFailure(facts, reason), facts, reason, effects);
}

void Coordinator::ApplyLocked(ActiveJob* j, const JobTransition& t, const FailureFacts& facts,
                              const std::string& what, Effects* effects) {
  using Effect = JobTransition::Effect;
  const std::string id = j->job.id();
  for (Effect e : t.effects) {
    if (e == Effect::kEnd) {
      EndJobLocked(id, t.next, t.reason, effects);
      return;  // j is gone
    }
  }
  // Stages, not workers: a data-parallel job has data_parallel workers per stage.
  const int replicas = std::max(1, j->job.spec().pipeline().data_parallel());
  const int stages_before =
      (j->ranks.empty() ? j->job.workers_size() : static_cast<int>(j->ranks.size())) / replicas;
  for (Effect e : t.effects) {
    switch (e) {
      case Effect::kRecordRecovery: {
        baton::v1::Recovery* r = j->job.add_recoveries();
        r->set_reason(Truncate(what));
        r->set_cause(facts.cause);
        *r->mutable_detected() = ToProtoTime(Now());
        r->set_from_step(facts.resume_step);
        r->set_lost_steps(std::max<int64_t>(0, facts.steps_done - facts.resume_step));
        r->set_stages_before(stages_before);
        r->set_preempted_by(t.preempted_by);
        if (!t.preempted_by.empty()) {
          if (ActiveJob* by = FindActiveLocked(t.preempted_by)) {
            r->set_preempted_by_user(by->job.submitted_by());
          }
        }
        if (options_.metrics != nullptr) {
          if (t.preempted_by.empty()) {
            options_.metrics->AddRecovery();
          } else {
            options_.metrics->AddPreemption();
          }
        }
        break;
      }
      case Effect::kStopRanks: {
        AbortCall abort;
        abort.job_id = id;
        abort.reason = Truncate(absl::StrCat(
            t.next == baton::v1::JOB_STATE_PREEMPTED ? "preempted: " : "recovering: ", what));
        for (RankSlot& slot : j->ranks) {
          if (!slot.held) continue;
          slot.held = false;
          registry_.Unwant(slot.worker.worker_id, id);  // its heartbeats now get an abort
          abort.workers.push_back(slot.worker);
        }
        if (!abort.workers.empty()) {
          abort.counted = true;  // it is placed again once these returned
          ++j->pending_aborts;
          effects->aborts.push_back(std::move(abort));
        }
        break;
      }
      case Effect::kForgetAttempt:
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
        j->job.set_steps_done(facts.resume_step);
        break;
      case Effect::kQueueFirst:
        queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
        queue_.push_front(id);  // RECOVERING: the queue policy puts it before queued jobs
        j->queued_since = Now();
        WakeLoop();
        break;
      case Effect::kQueue:
        queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
        queue_.push_back(id);  // PREEMPTED: the queue policy orders it by priority
        j->queued_since = Now();
        WakeLoop();
        break;
      case Effect::kEnd:
        break;  // handled above
    }
  }
  AppendStateLocked(j, t.next, t.reason);  // persists
}

void Coordinator::SucceedLocked(ActiveJob* j, Effects* effects) {
  Job& job = j->job;
  SetFinalDigests(j->layout, j->digests, &job);
  job.set_steps_done(job.spec().steps());
  job.mutable_pipeline()->clear_peak_inflight();
  for (int p : j->peak_inflight) job.mutable_pipeline()->add_peak_inflight(p);
  const JobTransition t = OnSuccess(absl::StrCat(Ranks(j->ranks.size()), " finished ",
                                                job.spec().steps(),
                                                job.spec().steps() == 1 ? " step" : " steps"));
  EndJobLocked(job.id(), t.next, t.reason, effects);
}

void Coordinator::PreemptLocked(ActiveJob* v, ActiveJob* for_job) {
  int64_t newest = 0;
  for (const RankSlot& slot : v->ranks) newest = std::max(newest, slot.reported_step);
  // A rank may have finished the step after its newest report, but none can have started
  // the one after that: it waits for the answer to that step's report first.
  v->preempt_step = newest + 1;
  v->preempted_for = for_job->job.id();
  for_job->preempted_others = true;
  AppendStateLocked(v, NoteState(v->job.state()),
                    absl::StrCat("preempting for ", for_job->job.id(), " (priority ",
                                 for_job->job.spec().priority(), " > ", v->job.spec().priority(),
                                 "): every rank stops after step ", v->preempt_step,
                                 " with its checkpoint, then gives its worker to it"));
  AppendStateLocked(for_job, NoteState(for_job->job.state()),
                    absl::StrCat("preempting ", v->job.id(), " (priority ",
                                 v->job.spec().priority(), ", ", v->ranks.size(),
                                 " workers): it stops after step ", v->preempt_step,
                                 " with its checkpoint"));
}

void Coordinator::PreemptedLocked(ActiveJob* j, Effects* effects) {
  // Every rank reported its result: nothing left to stop.
  FailureFacts facts = FailureFactsOf(j->job, baton::v1::FAILURE_CAUSE_UNSPECIFIED);
  facts.steps_done = j->preempt_step;
  const JobTransition t = OnPreempted(facts, j->preempted_for);
  ApplyLocked(j, t, facts, absl::StrCat("preempted by ", j->preempted_for), effects);
}

}  // namespace baton
