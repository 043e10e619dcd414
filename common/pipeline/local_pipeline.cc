#include "common/pipeline/local_pipeline.h"

#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective/gloo_collective.h"
#include "common/core/check.h"
#include "common/core/status.h"
#include "common/schedule/generators.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/schedule_spec.h"
#include "common/spec/spec.h"
#include "gloo/rendezvous/hash_store.h"

namespace baton {

absl::StatusOr<std::unique_ptr<LocalPipelineTrainer>> LocalPipelineTrainer::Create(
    baton::v1::JobSpec spec, LocalPipelineOptions options) {
  BATON_ASSIGN_OR_RETURN(ValidatedJobSpec valid, ValidatedJobSpec::Validate(std::move(spec)));
  BATON_RETURN_IF_ERROR(RequireChosenSchedule(*valid));
  std::unique_ptr<LocalPipelineTrainer> t(new LocalPipelineTrainer());
  t->spec_ = *valid;
  const baton::v1::PipelineSpec& p = t->spec_.pipeline();
  if (options.schedule.has_value()) {
    Schedule s = *std::move(options.schedule);
    if (!s.lowered()) {
      BATON_ASSIGN_OR_RETURN(s, Lower(s));
    }
    BATON_RETURN_IF_ERROR(Validate(s));
    if (s.num_microbatches != p.microbatches()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the custom schedule has ", s.num_microbatches,
                       " micro-batches but pipeline.microbatches is ", p.microbatches()));
    }
    t->schedule_ = std::move(s);
  } else {
    ScheduleOptions o;
    BATON_ASSIGN_OR_RETURN(o.kind, ScheduleKindFromSpec(p));
    o.num_ranks = p.stages();
    o.virtual_stages = p.virtual_stages();
    o.num_microbatches = p.microbatches();
    BATON_ASSIGN_OR_RETURN(t->schedule_, BuildSchedule(o));
  }
  const int D = p.data_parallel();
  BATON_ASSIGN_OR_RETURN(t->schedule_, AddJobActions(t->schedule_, t->spec_));
  BATON_ASSIGN_OR_RETURN(t->stage_blocks_,
                         StageBlocks(DescribeBlocks(t->spec_.model()), t->schedule_.num_stages(),
                                     {p.partition().begin(), p.partition().end()}));
  const int S = t->schedule_.num_ranks;
  // Replica d's ranks talk among themselves through hub d; rank r of every replica forms
  // data-parallel group r.
  for (int d = 0; d < D; ++d) t->hubs_.push_back(std::make_unique<InProcessHub>(S));
  // members[d * S + r]: replica d's handle on group r.
  std::vector<std::unique_ptr<Collective>> members(static_cast<size_t>(D) * S);
  if (D > 1 && options.engine == LocalPipelineOptions::Engine::kInProcess) {
    for (int r = 0; r < S; ++r) {
      t->groups_.push_back(std::make_unique<InProcessGroup>(D));
      for (int d = 0; d < D; ++d) members[d * S + r] = t->groups_.back()->Member(d);
    }
  } else if (D > 1 && options.engine == LocalPipelineOptions::Engine::kCustom) {
    if (!options.make_group) {
      return absl::InvalidArgumentError("LocalPipelineOptions: Engine::kCustom without make_group");
    }
    for (int r = 0; r < S; ++r) {
      BATON_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Collective>> group,
                             options.make_group(r, D));
      if (static_cast<int>(group.size()) != D) {
        return absl::InvalidArgumentError(absl::StrCat("make_group(", r, ", ", D, ") made ",
                                                       group.size(), " members"));
      }
      for (int d = 0; d < D; ++d) members[d * S + r] = std::move(group[d]);
    }
  } else if (D > 1) {
    // Gloo: every member of a group joins at once (each blocks until all have come).
    std::vector<absl::Status> joined(members.size());
    std::vector<std::thread> joining;
    for (int r = 0; r < S; ++r) {
      t->stores_.push_back(std::make_unique<gloo::rendezvous::HashStore>());
      gloo::rendezvous::Store* store = t->stores_.back().get();
      for (int d = 0; d < D; ++d) {
        joining.emplace_back([&members, &joined, &t, store, d, r, D, S] {
          GlooOptions go;
          go.ordered = t->spec_.pipeline().reduce_mode() != baton::v1::REDUCE_MODE_FAST;
          absl::StatusOr<std::unique_ptr<GlooCollective>> c =
              GlooCollective::Connect(*store, d, D, go);
          if (c.ok()) {
            members[d * S + r] = *std::move(c);
          } else {
            joined[d * S + r] = c.status();
          }
        });
      }
    }
    for (std::thread& th : joining) th.join();
    for (const absl::Status& st : joined) BATON_RETURN_IF_ERROR(st);
  }
  StageExecutorOptions eo;
  eo.recv_timeout = options.recv_timeout;
  // Every rank on this process's device (one GPU shared by all the stage threads).
  BATON_ASSIGN_OR_RETURN(eo.device, LocalDeviceFor(t->spec_));
  t->device_ = eo.device;
  for (int d = 0; d < D; ++d) {
    for (int r = 0; r < S; ++r) {
      eo.replica = d;
      eo.collective = nullptr;
      if (D > 1) {
        t->members_.push_back(std::move(members[d * S + r]));
        eo.collective = t->members_.back().get();
      }
      BATON_ASSIGN_OR_RETURN(
          std::unique_ptr<StageExecutor> ex,
          StageExecutor::Create(valid, t->schedule_, t->stage_blocks_, r,
                                t->hubs_[d]->transport(r), eo));
      t->executors_.push_back(std::move(ex));
    }
  }
  return t;
}

namespace {

// Runs fn(r) for every rank r on a thread of its own and returns the results by rank.
template <typename T, typename Fn>
std::vector<absl::StatusOr<T>> OnEveryRank(int ranks, Fn fn) {
  std::vector<absl::StatusOr<T>> results(ranks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([r, &fn, &results] { results[r] = fn(r); });
  }
  for (std::thread& th : threads) th.join();
  return results;
}

// The root cause among the ranks' results: the first error that is not another rank's
// abort echo; OK when every rank succeeded.
template <typename T>
absl::Status FirstError(const std::vector<absl::StatusOr<T>>& results) {
  absl::Status first_error;
  for (const auto& r : results) {
    if (r.ok()) continue;
    if (first_error.ok() || (first_error.code() == absl::StatusCode::kAborted &&
                             r.status().code() != absl::StatusCode::kAborted)) {
      first_error = r.status();
    }
  }
  return first_error;
}

}  // namespace

absl::StatusOr<float> LocalPipelineTrainer::Evaluate() {
  if (failed_) {
    return absl::FailedPreconditionError("an earlier step failed; the pipeline is stopped");
  }
  const int64_t index = steps_done_;  // tags the evaluation's tensors apart from any other
  std::vector<absl::StatusOr<std::optional<float>>> evals = OnEveryRank<std::optional<float>>(
      static_cast<int>(executors_.size()),
      [this, index](int r) { return executors_[r]->Evaluate(index); });
  if (absl::Status s = FirstError(evals); !s.ok()) {
    failed_ = true;
    return s;
  }
  const std::optional<float>& loss = *evals[schedule_.stage_to_rank.back()];
  if (!loss.has_value()) return absl::InternalError("the last stage reported no validation loss");
  return *loss;
}

absl::StatusOr<PipelineStepStats> LocalPipelineTrainer::Step() {
  if (failed_) {
    return absl::FailedPreconditionError("an earlier step failed; the pipeline is stopped");
  }
  const auto start = std::chrono::steady_clock::now();
  const int S = schedule_.num_ranks;
  const int D = replicas();
  const int ranks = S * D;
  const int64_t step = steps_done_;
  std::vector<absl::StatusOr<RankStepResult>> results = OnEveryRank<RankStepResult>(
      ranks, [this, step](int r) { return executors_[r]->RunStep(step); });
  if (absl::Status s = FirstError(results); !s.ok()) {
    failed_ = true;
    return s;
  }
  // Validation after the step, when the spec asks: every rank, like a step.
  // (Evaluate() below is the same without a step.)
  std::optional<float> val_loss;
  if (executors_[0]->EvaluatesAfter(step)) {
    std::vector<absl::StatusOr<std::optional<float>>> evals =
        OnEveryRank<std::optional<float>>(
            ranks, [this, step](int r) { return executors_[r]->Evaluate(step); });
    if (absl::Status s = FirstError(evals); !s.ok()) {
      failed_ = true;
      return s;
    }
    val_loss = *evals[schedule_.stage_to_rank.back()];
  }

  PipelineStepStats stats;
  const int last_rank = schedule_.stage_to_rank.back();
  StepLoss loss;
  for (int d = 0; d < D; ++d) {
    for (float l : results[d * S + last_rank]->losses) loss.Add(l);
  }
  ++steps_done_;
  stats.step = steps_done_;
  stats.loss = loss.Mean();
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.samples = spec_.data().batch_size();
  stats.tokens = TokensPerStep(spec_);
  // Every rank computes the same rate and norm: rank 0's (the tests check they agree).
  stats.learning_rate = results[0]->learning_rate;
  stats.grad_norm = results[0]->grad_norm;
  stats.val_loss = val_loss;
  for (auto& r : results) {
    stats.peak_inflight.push_back(r->peak_inflight);
    stats.ranks.push_back(*std::move(r));
  }
  return stats;
}

absl::Status LocalPipelineTrainer::SaveCheckpoint(const std::string& job_dir,
                                                  const std::string& job) {
  const std::string step_dir = CheckpointStepDir(job_dir, steps_done_);
  // The replicas hold the same weights: replica 0's ranks write them. With a sharded
  // optimizer every replica writes a part of its rank's blocks, with the state the owners
  // hand it through the group, so all ranks run at once.
  const bool sharded = spec_.optimizer().shard() && replicas() > 1;
  const int ranks = sharded ? static_cast<int>(executors_.size()) : schedule_.num_ranks;
  std::vector<absl::StatusOr<std::vector<CheckpointBlockFile>>> files =
      OnEveryRank<std::vector<CheckpointBlockFile>>(
          ranks, [&](int r) { return executors_[r]->SaveCheckpoint(step_dir, job, steps_done_); });
  return FirstError(files);
}

absl::Status LocalPipelineTrainer::LoadCheckpoint(const std::string& step_dir) {
  int64_t step = -1;
  for (auto& e : executors_) {
    absl::StatusOr<int64_t> s = e->LoadCheckpoint(step_dir);
    if (!s.ok()) {
      failed_ = true;
      return absl::Status(s.status().code(),
                          absl::StrCat("rank ", e->rank(), ": ", s.status().message()));
    }
    step = *s;
  }
  steps_done_ = step;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Digest>> LocalPipelineTrainer::TryBlockDigests(int replica) {
  std::vector<Digest> out(stage_blocks_.empty() ? 0 : stage_blocks_.back().last);
  const int S = schedule_.num_ranks;
  // A sharded bf16 job's ranks that keep weights as bf16 bits digest their owners' float32
  // weights, which the replica group hands over: then every replica's ranks run at once.
  const bool together =
      spec_.optimizer().shard() && replicas() > 1 && spec_.precision() == baton::v1::PRECISION_BF16;
  const int first = together ? 0 : replica * S;
  const int count = together ? static_cast<int>(executors_.size()) : S;
  std::vector<absl::StatusOr<std::vector<std::pair<int, Digest>>>> digests =
      OnEveryRank<std::vector<std::pair<int, Digest>>>(
          count, [&](int r) { return executors_[first + r]->BlockDigests(); });
  BATON_RETURN_IF_ERROR(FirstError(digests));
  for (int r = 0; r < S; ++r) {
    for (const auto& [block, digest] : *digests[replica * S + r - first]) out[block] = digest;
  }
  return out;
}

std::vector<Digest> LocalPipelineTrainer::BlockDigests(int replica) {
  absl::StatusOr<std::vector<Digest>> out = TryBlockDigests(replica);
  BATON_CHECK_OK(out.status());
  return *std::move(out);
}

}  // namespace baton
