#include "common/transport/tensor_inbox.h"
#include "common/core/mutex.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {
// condition_variable::wait_for adds the duration to now(): keep it finite.
std::chrono::nanoseconds WaitFor(absl::Duration d) {
  return absl::ToChronoNanoseconds(std::min(d, absl::Hours(1)));
}
}  // namespace

TensorInbox::Reservation& TensorInbox::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    Release();
    inbox_ = o.inbox_;
    generation_ = o.generation_;
    source_rank_ = o.source_rank_;
    tag_ = o.tag_;
    bytes_ = o.bytes_;
    o.inbox_ = nullptr;
  }
  return *this;
}

void TensorInbox::Reservation::Release() {
  if (inbox_ == nullptr) return;
  TensorInbox* inbox = inbox_;
  inbox_ = nullptr;
  MutexLock lock(inbox->mu_);
  if (inbox->generation_ != generation_) return;  // Open/Close dropped it already
  const Key key{source_rank_, tag_};
  auto it = inbox->entries_.find(key);
  if (it == inbox->entries_.end() || it->second.filed) return;
  inbox->entries_.erase(it);
  inbox->ReleaseLocked(key, bytes_);
}

absl::Status TensorInbox::Reservation::Commit(Tensor t) {
  if (inbox_ == nullptr) return absl::FailedPreconditionError("commit of an empty reservation");
  const std::string where = absl::StrCat(tag_.ToString(), " from rank ", source_rank_);
  if (static_cast<int64_t>(t.nbytes()) != bytes_) {
    Release();
    return absl::InternalError(absl::StrCat("inbox: ", where, " has ", t.nbytes(), " bytes but ",
                                            bytes_, " were reserved"));
  }
  TensorInbox* inbox = inbox_;
  inbox_ = nullptr;
  MutexLock lock(inbox->mu_);
  if (inbox->generation_ != generation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("inbox: ", where, " arrived after its job was closed"));
  }
  const Key key{source_rank_, tag_};
  auto it = inbox->entries_.find(key);
  if (it == inbox->entries_.end() || it->second.filed) {
    return absl::InternalError(absl::StrCat("inbox: lost the reservation of ", where));
  }
  if (!inbox->aborted_.ok()) {
    inbox->entries_.erase(it);
    inbox->ReleaseLocked(key, bytes_);
    return inbox->aborted_;
  }
  it->second.filed = true;
  it->second.tensor = std::move(t);
  ++inbox->stats_.tensors_filed;
  ++inbox->stats_.tensors_delivered;
  inbox->changed_.notify_all();
  return absl::OkStatus();
}

void TensorInbox::Open(uint64_t job_key, int64_t capacity_bytes,
                       std::vector<std::string> identities) {
  InboxPlan plan;
  plan.job_key = job_key;
  plan.capacity_bytes = capacity_bytes;
  plan.num_ranks = static_cast<int>(identities.size());
  plan.identities = std::move(identities);
  Open(std::move(plan));
}

void TensorInbox::Open(InboxPlan plan) {
  MutexLock lock(mu_);
  open_ = true;
  job_key_ = plan.job_key;
  num_ranks_ = std::max(plan.num_ranks, 0);
  identities_ = std::move(plan.identities);
  sources_ = std::move(plan.sources);
  ++generation_;
  capacity_ = std::max<int64_t>(plan.capacity_bytes, 0);
  aborted_ = absl::OkStatus();
  entries_.clear();
  bytes_by_source_.clear();
  stats_ = TensorInboxStats{};
  stats_.open = true;
  stats_.job_key = job_key_;
  stats_.capacity_bytes = capacity_;
  changed_.notify_all();
}

void TensorInbox::Close() {
  MutexLock lock(mu_);
  open_ = false;
  ++generation_;
  entries_.clear();
  bytes_by_source_.clear();
  stats_.open = false;
  stats_.bytes_in_use = 0;
  stats_.tensors_filed = 0;
  changed_.notify_all();
}

void TensorInbox::Abort(const absl::Status& reason) {
  MutexLock lock(mu_);
  AbortLocked(reason);
}

absl::Status TensorInbox::CheckSourceLocked(int source_rank, const TensorTag& tag) const {
  if (source_rank < 0 || (num_ranks_ > 0 && source_rank >= num_ranks_)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", source_rank, " is not a rank of this job",
        num_ranks_ > 0 ? absl::StrCat(" (ranks 0..", num_ranks_ - 1, ")") : std::string()));
  }
  if (!sources_.empty() &&
      std::find(sources_.begin(), sources_.end(),
                InboxSource{source_rank, tag.stage, tag.kind}) == sources_.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("this rank receives no ", tag.ToString(), " from rank ", source_rank,
                     ": the plan has that rank send it no ",
                     tag.kind == TensorKind::kActivation ? "activation" : "gradient",
                     " of stage ", tag.stage));
  }
  return absl::OkStatus();
}

absl::Status TensorInbox::CheckSender(int source_rank, const TensorTag& tag,
                                      absl::string_view identity) const {
  MutexLock lock(mu_);
  if (!open_) return absl::OkStatus();
  // The key first: a stranger learns nothing of the job's ranks.
  if (absl::Status s = CheckAcceptsLocked(source_rank, tag); !s.ok()) return s;
  if (absl::Status s = CheckSourceLocked(source_rank, tag); !s.ok()) return s;
  if (source_rank >= static_cast<int>(identities_.size())) return absl::OkStatus();
  const std::string& want = identities_[source_rank];
  if (want.empty() || want == identity) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("rank ", source_rank, " of this job is ", want, ", not ",
                   identity.empty() ? "a stream without a certificate" : identity));
}

bool TensorInbox::AbortJob(uint64_t job_key, const absl::Status& reason,
                           absl::string_view identity) {
  MutexLock lock(mu_);
  if (!open_ || job_key_ != job_key) return false;
  if (std::any_of(identities_.begin(), identities_.end(),
                  [](const std::string& i) { return !i.empty(); }) &&
      std::find(identities_.begin(), identities_.end(), identity) == identities_.end()) {
    return false;
  }
  AbortLocked(reason);
  return true;
}

void TensorInbox::AbortLocked(const absl::Status& reason) {
  if (!aborted_.ok()) return;  // the first reason wins
  aborted_ = absl::AbortedError(reason.message().empty() ? "aborted" : reason.message());
  changed_.notify_all();
}

absl::Status TensorInbox::CheckAcceptsLocked(int source_rank, const TensorTag& tag) const {
  if (!open_) {
    // This worker is not running the sender's job: it has not opened it yet or has ended it
    // (a rank that failed closes its inbox). The sender's job cannot go on with this rank,
    // but nothing in its configuration is wrong: UNAVAILABLE, a failure a recovery may cure.
    return absl::UnavailableError(absl::StrCat(
        "unexpected tag ", tag.ToString(), " from rank ", source_rank, ": no job is open"));
  }
  if (tag.job != job_key_) {
    // Neither key is named: the open job's is its secret, and a wrong one is a guess.
    return absl::FailedPreconditionError(
        absl::StrCat("unexpected tag ", tag.ToString(), " from rank ", source_rank,
                     ": its job key is not the open job's (the key is wrong)"));
  }
  if (!aborted_.ok()) return aborted_;
  return absl::OkStatus();
}

void TensorInbox::ReleaseLocked(const Key& key, int64_t bytes) {
  stats_.bytes_in_use -= bytes;
  auto it = bytes_by_source_.find(key.source_rank);
  if (it != bytes_by_source_.end()) {
    it->second -= bytes;
    if (it->second <= 0) bytes_by_source_.erase(it);
  }
  changed_.notify_all();
}

absl::StatusOr<TensorInbox::Reservation> TensorInbox::Reserve(
    int source_rank, const TensorTag& tag, int64_t bytes, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative size ", bytes, " for ", tag.ToString(), " from rank ", source_rank));
  }
  const Key key{source_rank, tag};
  MutexLock lock(mu_);
  const uint64_t generation = generation_;
  bool waited = false;
  while (true) {
    if (generation_ != generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("unexpected tag ", tag.ToString(), " from rank ", source_rank,
                       ": its job was closed while it waited for space"));
    }
    if (absl::Status s = CheckAcceptsLocked(source_rank, tag); !s.ok()) return s;
    if (absl::Status s = CheckSourceLocked(source_rank, tag); !s.ok()) return s;
    if (entries_.contains(key)) {
      return absl::AlreadyExistsError(
          absl::StrCat("duplicate tag ", tag.ToString(), " from rank ", source_rank));
    }
    const bool source_empty = !bytes_by_source_.contains(source_rank);
    if (source_empty || stats_.bytes_in_use + bytes <= capacity_) break;
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while ", tag.ToString(), " from rank ",
                                               source_rank, " waited for space in the inbox"));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the inbox stayed full (", stats_.bytes_in_use, " of ", capacity_,
                       " bytes) until the deadline: no room for ", tag.ToString(), " (", bytes,
                       " bytes) from rank ", source_rank));
    }
    waited = true;
    absl::Duration wait = deadline - now;
    if (cancelled) wait = std::min(wait, absl::Milliseconds(50));
    ++deliveries_waiting_;
    changed_.wait_for(lock.native(), WaitFor(wait));
    --deliveries_waiting_;
  }
  if (waited) ++stats_.delivery_waits;
  entries_.emplace(key, Entry{false, Tensor(), bytes});
  bytes_by_source_[source_rank] += bytes;
  stats_.bytes_in_use += bytes;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  Reservation r;
  r.inbox_ = this;
  r.generation_ = generation_;
  r.source_rank_ = source_rank;
  r.tag_ = tag;
  r.bytes_ = bytes;
  return r;
}

absl::Status TensorInbox::Deliver(int source_rank, const TensorTag& tag, Tensor t,
                                  absl::Time deadline) {
  absl::StatusOr<Reservation> r =
      Reserve(source_rank, tag, static_cast<int64_t>(t.nbytes()), deadline);
  if (!r.ok()) return r.status();
  return r->Commit(std::move(t));
}

absl::StatusOr<Tensor> TensorInbox::Take(int source_rank, const TensorTag& tag,
                                         absl::Time deadline) {
  const Key key{source_rank, tag};
  MutexLock lock(mu_);
  const uint64_t generation = generation_;
  while (true) {
    if (!aborted_.ok()) return aborted_;
    if (!open_ || generation_ != generation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot receive ", tag.ToString(), " from rank ", source_rank, ": no job is open"));
    }
    if (tag.job != job_key_) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot receive ", tag.ToString(), " from rank ", source_rank,
                       ": the inbox is open for another job key"));
    }
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.filed) {
      Tensor t = std::move(it->second.tensor);
      const int64_t bytes = it->second.bytes;
      entries_.erase(it);
      --stats_.tensors_filed;
      ReleaseLocked(key, bytes);
      return t;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out waiting for ", tag.ToString(), " from rank ", source_rank,
                       it == entries_.end() ? "" : " (it is still arriving)"));
    }
    ++takes_waiting_;
    changed_.wait_for(lock.native(), WaitFor(deadline - now));
    --takes_waiting_;
  }
}

TensorInboxStats TensorInbox::Stats() const {
  MutexLock lock(mu_);
  TensorInboxStats s = stats_;
  s.deliveries_waiting = deliveries_waiting_;
  s.takes_waiting = takes_waiting_;
  return s;
}

}  // namespace baton
