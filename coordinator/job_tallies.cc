#include "coordinator/job_tallies.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/digest.h"
#include "common/core/step_loss.h"
#include "common/rpc/rpc.h"
#include "common/spec/spec.h"
#include "google/protobuf/util/message_differencer.h"

namespace baton {

namespace {

std::optional<Digest> ParseDigestHex(const std::string& hex) {
  if (hex.size() != 64) return std::nullopt;
  Digest d{};
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(hex[2 * i + k])));
      int nib;
      if (c >= '0' && c <= '9') {
        nib = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        nib = c - 'a' + 10;
      } else {
        return std::nullopt;
      }
      v = v * 16 + nib;
    }
    d[i] = static_cast<uint8_t>(v);
  }
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Checkpoints

std::optional<CheckpointTally> TallyCheckpointWrite(int rank,
                                                    const baton::v1::CheckpointWrite& write,
                                                    int writers, int keep, absl::Time now,
                                                    CheckpointTallies* tallies,
                                                    baton::v1::JobCheckpoints* c) {
  if (!c->complete().empty() && write.step() <= c->complete().rbegin()->step()) {
    return std::nullopt;
  }
  CheckpointTally& t = (*tallies)[write.step()];
  if (!t.ranks.insert(rank).second) return std::nullopt;  // a repeat
  t.bytes += write.bytes();
  t.write_time = std::max(t.write_time, FromProtoDuration(write.duration()));
  if (static_cast<int>(t.ranks.size()) < writers) return std::nullopt;
  baton::v1::CheckpointRecord* r = c->add_complete();
  r->set_step(write.step());
  r->set_bytes(t.bytes);
  *r->mutable_time() = ToProtoTime(now);
  *r->mutable_write_time() = ToProtoDuration(t.write_time);
  // The ranks prune the files by the same rule (rank 0, after its writes): the newest
  // `keep` complete ones stay.
  keep = std::max(1, keep);
  if (c->complete_size() > keep) {
    c->mutable_complete()->DeleteSubrange(0, c->complete_size() - keep);
  }
  CheckpointTally done = std::move(t);
  tallies->erase(tallies->begin(), tallies->upper_bound(write.step()));
  return done;
}

// ---------------------------------------------------------------------------------------
// Resume

ResumePoint ResumePointOf(const baton::v1::Job& job) {
  const baton::v1::JobCheckpoints& c = job.checkpoints();
  if (job.recoveries_size() > 0 && !c.complete().empty()) {
    // The newest complete one the ranks find (step 0): the workers may have written newer
    // ones than the coordinator recorded (it was restarting), and older ones than its
    // record may already be pruned.
    return {c.job_dir(), 0};
  }
  // The first attempt, or a recovery before the job wrote a checkpoint of its own: where the
  // job itself started: the step the user named, or (step 0) the newest complete one the
  // ranks find, which may be newer than the record (its last writes reported late).
  if (!c.resumed_from_dir().empty()) {
    return {c.resumed_from_dir(), job.spec().resume_from().step() > 0 ? c.resumed_from_step() : 0};
  }
  return {"", 0};
}

int64_t RecordedResumeStep(const baton::v1::JobCheckpoints& c) {
  if (!c.complete().empty()) return c.complete().rbegin()->step();
  if (!c.resumed_from_dir().empty()) return c.resumed_from_step();
  return 0;
}

FailureFacts FailureFactsOf(const baton::v1::Job& job, baton::v1::FailureCause cause) {
  FailureFacts facts;
  facts.state = job.state();
  facts.cause = cause;
  facts.max_restarts = job.spec().has_restart() ? job.spec().restart().max_restarts() : 0;
  for (const baton::v1::Recovery& r : job.recoveries()) {
    if (r.preempted_by().empty()) ++facts.restarts_done;  // preemptions are not restarts
    facts.diverged_before |= r.cause() == baton::v1::FAILURE_CAUSE_DIVERGED;
  }
  facts.steps_done = job.steps_done();
  facts.resume_step = RecordedResumeStep(job.checkpoints());
  return facts;
}

ResumeTally TallyResume(const baton::v1::ReportProgressRequest& request,
                        std::map<int, int64_t>* resumed_from, baton::v1::Job* job) {
  ResumeTally out;
  const int64_t step = request.resumed_from_step();
  auto [it, fresh] = resumed_from->emplace(request.rank(), step);
  if (!fresh) return out;
  for (const auto& [rank, other] : *resumed_from) {
    if (other != step) {
      // Ranks that saw different files (one written or damaged in between) would train a
      // model that never existed: stop.
      out.failure =
          absl::StrCat("ranks resumed from different checkpoints: rank ", rank, " from step ",
                       other, ", rank ", request.rank(), " from step ", step);
      return out;
    }
  }
  if (resumed_from->size() != 1) return out;
  const int attempt = job->recoveries_size();
  baton::v1::JobCheckpoints* c = job->mutable_checkpoints();
  const ResumePoint asked = ResumePointOf(*job);
  const bool own = attempt > 0 && asked.dir == c->job_dir();
  out.note = absl::StrCat("resumed from ", own ? "its own checkpoint" : c->resumed_from_job(),
                          " step ", step);
  const std::string skipped = absl::StrJoin(request.checkpoints_skipped(), "; ");
  if (asked.step > 0 && step != asked.step) {
    absl::StrAppend(&out.note, " (asked for step ", asked.step, "; skipped: ", skipped, ")");
  } else if (!skipped.empty()) {
    absl::StrAppend(&out.note, " (the newest complete; skipped: ", skipped, ")");
  }
  if (attempt > 0) {
    // What the ranks loaded, which may be newer than the coordinator knew.
    baton::v1::Recovery* r = job->mutable_recoveries(attempt - 1);
    const int64_t done_at_detection = r->from_step() + r->lost_steps();
    r->set_from_step(step);
    r->set_lost_steps(std::max<int64_t>(0, done_at_detection - step));
  } else {
    c->set_resumed_from_step(step);
  }
  // An evaluation-only job's one step is the evaluation, whatever step it loaded.
  if (!job->spec().eval().only()) job->set_steps_done(std::max<int64_t>(job->steps_done(), step));
  return out;
}

absl::Status CheckResumeSource(const baton::v1::JobSpec& spec, const baton::v1::Job& source,
                               bool ended, const std::string& submitted_by, bool admin,
                               baton::v1::JobCheckpoints* checkpoints) {
  const baton::v1::ResumeFrom& from = spec.resume_from();
  // A checkpoint holds its owner's trained weights: another user's need an admin.
  if (!admin && source.submitted_by() != submitted_by) {
    return absl::PermissionDeniedError(absl::StrCat(
        "resume_from.job_id: ", source.id(), " was submitted by ", source.submitted_by(),
        "; resuming from another user's job needs the admin role"));
  }
  if (!ended) {
    std::string name = baton::v1::JobState_Name(source.state());
    if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
    return absl::InvalidArgumentError(
        absl::StrCat("resume_from.job_id: ", from.job_id(), " is still ", name,
                     "; resume from it once it has ended (its checkpoints are still changing)"));
  }
  const auto& complete = source.checkpoints().complete();
  if (complete.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_from.job_id: ", source.id(), " has no complete checkpoint",
                     source.spec().has_checkpoint() ? " (it ended before every rank wrote one)"
                                                    : " (its spec asks for none)"));
  }
  int64_t step = complete.rbegin()->step();
  if (from.step() > 0) {
    std::vector<std::string> kept;
    bool found = false;
    for (const baton::v1::CheckpointRecord& r : complete) {
      kept.push_back(absl::StrCat(r.step()));
      found = found || r.step() == from.step();
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume_from.step: ", source.id(), " has no complete checkpoint after step ",
                       from.step(), " (it keeps steps ", absl::StrJoin(kept, ", "), ")"));
    }
    step = from.step();
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(source.spec().model(), spec.model())) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_from: the spec's model differs from ", source.id(),
                     "'s; a checkpoint loads only into the model it was written for"));
  }
  if (source.spec().optimizer().algorithm_case() != spec.optimizer().algorithm_case()) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_from: the spec's optimizer differs in kind from ", source.id(),
                     "'s; its checkpoint holds that optimizer's state"));
  }
  if (step >= spec.steps() && !spec.eval().only()) {  // an evaluation trains nothing
    return absl::InvalidArgumentError(absl::StrCat("steps: ", spec.steps(), " leaves nothing to ",
                                                   "train after ", source.id(),
                                                   "'s checkpoint of step ", step));
  }
  checkpoints->set_resumed_from_job(source.id());
  checkpoints->set_resumed_from_step(step);
  checkpoints->set_resumed_from_dir(source.checkpoints().job_dir());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Progress

std::optional<float> TallyReplicaLoss(int64_t step, int replica, float loss, int replicas,
                                      ReplicaLosses* losses) {
  std::map<int, float>& of_step = (*losses)[step];
  of_step[replica] = loss;
  if (static_cast<int>(of_step.size()) < replicas) return std::nullopt;
  StepLoss mean;  // of the replicas' means, in replica order
  for (const auto& [r, l] : of_step) mean.Add(l);
  const float out = mean.Mean();
  losses->erase(losses->begin(), losses->upper_bound(step));
  return out;
}

void PruneStepTimings(int64_t step, StepTimings* timings) {
  timings->erase(timings->begin(), timings->lower_bound(step - kKeptStepTimings));
}

absl::Duration StepDuration(const baton::v1::RankTiming& timing, absl::Duration since_previous) {
  const absl::Duration d = FromProtoDuration(timing.step());
  return d > absl::ZeroDuration() ? d : since_previous;
}

double PeakFlopsOf(const std::vector<baton::v1::DeviceInfo>& devices, bool bf16) {
  double sum = 0;
  for (const baton::v1::DeviceInfo& d : devices) {
    const double peak = bf16 ? d.peak_flops_bf16() : d.peak_flops();
    if (peak <= 0) return 0;
    sum += peak;
  }
  return sum;
}

baton::v1::StepProgress MakeStepProgress(const baton::v1::JobSpec& spec, int64_t k,
                                         std::optional<float> loss, absl::Duration d,
                                         const std::map<int, baton::v1::RankTiming>& timings,
                                         const std::vector<std::string>& worker_ids,
                                         const StepExtras& extras) {
  const double seconds = absl::ToDoubleSeconds(d);
  baton::v1::StepProgress step;
  step.set_step(k);
  step.set_total_steps(spec.steps());
  if (loss.has_value()) step.set_loss(*loss);
  step.set_learning_rate(extras.learning_rate);
  if (extras.grad_norm.has_value()) step.set_grad_norm(*extras.grad_norm);
  if (extras.val_loss.has_value()) step.set_val_loss(*extras.val_loss);
  if (seconds > 0) {
    step.set_samples_per_second(spec.data().batch_size() / seconds);
    step.set_tokens_per_second(static_cast<double>(TokensPerStep(spec)) / seconds);
    const double flops_per_second = extras.model_flops_per_step / seconds;
    step.set_model_tflops(flops_per_second / 1e12);
    if (extras.peak_flops > 0) step.set_mfu(flops_per_second / extras.peak_flops);
  }
  *step.mutable_duration() = ToProtoDuration(d);
  for (const auto& [rank, t] : timings) {
    baton::v1::StageTiming* st = step.add_stages();
    st->set_rank(rank);
    if (rank >= 0 && rank < static_cast<int>(worker_ids.size())) {
      st->set_worker_id(worker_ids[rank]);
    }
    *st->mutable_forward() = t.forward();
    *st->mutable_backward() = t.backward();
    *st->mutable_weight() = t.weight();
    *st->mutable_send() = t.send();
    *st->mutable_recv_wait() = t.recv_wait();
    *st->mutable_step() = t.step();
    st->set_peak_inflight(t.peak_inflight());
  }
  return step;
}

// ---------------------------------------------------------------------------------------
// Links and groups

std::string TallyLinks(const baton::v1::ReportProgressRequest& request,
                       baton::v1::PipelineReport* report) {
  std::vector<std::string> said;
  for (const baton::v1::LinkReport& l : request.links()) {
    if (l.rank() != request.rank()) continue;  // this rank is the pair's higher one
    bool known = false;
    for (const baton::v1::LinkReport& k : report->links()) {
      known = known || (k.rank() == l.rank() && k.peer() == l.peer());
    }
    if (known) continue;
    *report->add_links() = l;
    said.push_back(absl::StrCat("ranks ", l.rank(), "-", l.peer(), " ", l.reason()));
  }
  if (said.empty()) return "";
  return absl::StrCat("links: ", absl::StrJoin(said, "; "));
}

std::string TallyGroups(const baton::v1::ReportProgressRequest& request,
                        baton::v1::PipelineReport* report) {
  std::vector<std::string> said;
  for (const baton::v1::GroupReport& g : request.groups()) {
    bool known = false;
    for (const baton::v1::GroupReport& k : report->groups()) known = known || k.rank() == g.rank();
    if (known) continue;
    *report->add_groups() = g;
    said.push_back(
        absl::StrCat("rank ", g.rank(), " ", g.engine(), " ", g.mode(), " (", g.reason(), ")"));
  }
  if (said.empty()) return "";
  return absl::StrCat("data-parallel groups: ", absl::StrJoin(said, "; "));
}

// ---------------------------------------------------------------------------------------
// Results

std::string TallyResultDigests(const baton::v1::ReportResultRequest& request,
                               const PipelineLayout& layout, std::map<int, std::string>* digests) {
  const std::string who = absl::StrCat("rank ", request.rank(), " on worker ", request.worker_id());
  const int S = std::max(1, layout.schedule.num_ranks);
  const std::vector<int>& expected = layout.rank_blocks[request.rank() % S];
  std::map<int, std::string> got;
  for (const baton::v1::IndexedBlockDigest& d : request.block_digests()) {
    if (!std::binary_search(expected.begin(), expected.end(), d.index())) {
      return absl::StrCat(who, " reported a digest for block ", d.index(),
                          ", which it does not own");
    }
    std::optional<Digest> parsed = ParseDigestHex(d.digest().sha256());
    if (!parsed.has_value()) {
      return absl::StrCat(who, " reported a malformed digest for block ", d.index(), ": \"",
                          d.digest().sha256(), "\"");
    }
    got[d.index()] = DigestHex(*parsed);
  }
  for (int b : expected) {
    if (got.count(b) == 0) {
      return absl::StrCat(who, " finished without a digest for block ", b, " (",
                          layout.blocks[b].name, ")");
    }
  }
  // Replicas must end with the same weights: a block whose digest differs from what
  // another replica reported fails the job.
  for (const auto& [b, hex] : got) {
    auto it = digests->find(b);
    if (it != digests->end() && it->second != hex) {
      return absl::StrCat(who, " (replica ", request.rank() / S, ") ended block ", b,
                          " with digest ", hex.substr(0, 16), "..., another replica with ",
                          it->second.substr(0, 16), "...: the replicas diverged");
    }
  }
  digests->insert(got.begin(), got.end());
  return "";
}

void SetFinalDigests(const PipelineLayout& layout, const std::map<int, std::string>& digests,
                     baton::v1::Job* job) {
  std::vector<Digest> combined;
  job->clear_block_digests();
  for (size_t b = 0; b < layout.blocks.size(); ++b) {
    const auto it = digests.find(static_cast<int>(b));
    const std::string hex = it == digests.end() ? std::string() : it->second;
    combined.push_back(ParseDigestHex(hex).value_or(Digest{}));
    baton::v1::BlockDigest* d = job->add_block_digests();
    d->set_block(layout.blocks[b].name);
    d->set_sha256(hex);
  }
  job->set_weights_digest(DigestHex(CombineBlockDigests(combined)));
}

ResultVerdict OnRankResult(const baton::v1::ReportResultRequest& request,
                           const std::string& failure, bool all_reported, bool all_finished,
                           absl::Time now, EchoFailure* echo) {
  using Action = ResultVerdict::Action;
  const baton::v1::FailureCause cause =
      request.error().empty() || request.cause() == baton::v1::FAILURE_CAUSE_UNSPECIFIED
          ? baton::v1::FAILURE_CAUSE_INTERNAL  // a malformed report, or no cause given
          : request.cause();
  // An ABORTED error is most likely another rank's failure echoed through the transport;
  // a PEER error (a link or the replicas' group failed) may be a peer that died, or one
  // that merely stopped because its own neighbour died. Both wait a moment for the root
  // cause: an error of another kind, or a worker gone silent (the coordinator's Tick).
  const bool is_echo =
      !failure.empty() && !request.error().empty() &&
      (cause == baton::v1::FAILURE_CAUSE_ABORTED || cause == baton::v1::FAILURE_CAUSE_PEER);
  if (is_echo) {
    if (echo->reason.empty()) echo->since = now;
    // The first PEER error says more than any ABORTED one.
    if (echo->reason.empty() || (echo->cause == baton::v1::FAILURE_CAUSE_ABORTED &&
                                 cause == baton::v1::FAILURE_CAUSE_PEER)) {
      echo->reason = failure;
      echo->cause = cause;
    }
    if (all_reported) return {Action::kFail, echo->reason, echo->cause};
    return {};
  }
  if (!failure.empty()) return {Action::kFail, failure, cause};
  if (!echo->reason.empty() && all_reported) return {Action::kFail, echo->reason, echo->cause};
  if (all_finished) return {Action::kSucceed, "", baton::v1::FAILURE_CAUSE_UNSPECIFIED};
  return {};
}

}  // namespace baton
