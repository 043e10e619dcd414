#include "common/comm/inproc_transport.h"
#include "common/core/mutex.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {

std::string TensorTag::ToString() const {
  // Not the job key: it is the secret that guards a job's tensor streams, and this text ends
  // up in errors that people and logs see.
  const char* what = kind == TensorKind::kActivation     ? " activation"
                     : kind == TensorKind::kGradient     ? " gradient"
                     : kind == TensorKind::kTiedGradient ? " tied embedding gradient"
                                                         : " gradient norm";
  return absl::StrCat("step ", step, " microbatch ", microbatch, " stage ", stage, what);
}

namespace {
class DoneWork final : public SendWork {
 public:
  explicit DoneWork(absl::Status s) : status_(std::move(s)) {}
  absl::Status Wait(absl::Time) override { return status_; }
  bool IsCompleted() override { return true; }

 private:
  const absl::Status status_;
};
}  // namespace

std::unique_ptr<SendWork> CompletedSend(absl::Status status) {
  return std::make_unique<DoneWork>(std::move(status));
}

class InProcessHub::End final : public Transport {
 public:
  End(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}
  const char* backend() const override { return "inproc"; }
  int rank() const override { return rank_; }
  std::unique_ptr<SendWork> Send(int peer, const TensorTag& tag, const Tensor& t) override {
    return hub_->Send(rank_, peer, tag, t);
  }
  absl::StatusOr<Tensor> Recv(int peer, const TensorTag& tag, absl::Time deadline) override {
    return hub_->Recv(peer, rank_, tag, deadline);
  }
  void Abort(const absl::Status& reason) override { hub_->Abort(rank_, reason); }

 private:
  InProcessHub* const hub_;
  const int rank_;
};

InProcessHub::InProcessHub(int num_ranks) {
  for (int r = 0; r < num_ranks; ++r) ends_.push_back(std::make_unique<End>(this, r));
}

InProcessHub::~InProcessHub() = default;

std::unique_ptr<SendWork> InProcessHub::Send(int src, int dst, const TensorTag& tag,
                                             const Tensor& t) {
  if (dst < 0 || dst >= num_ranks() || dst == src) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat("inproc: rank ", src, " cannot send ", tag.ToString(), " to rank ", dst)));
  }
  // Outside the lock: the copy is the expensive part. Same device as the sender's.
  absl::StatusOr<Tensor> copy = t.CopyTo(t.device());
  if (!copy.ok()) {
    return CompletedSend(absl::Status(
        copy.status().code(), absl::StrCat("inproc: rank ", src, " sending ", tag.ToString(), ": ",
                                           copy.status().message())));
  }
  MutexLock lock(mu_);
  if (!aborted_.ok()) return CompletedSend(aborted_);
  auto [it, inserted] = mailbox_.try_emplace(Key{src, dst, tag}, *std::move(copy));
  if (!inserted) {
    return CompletedSend(absl::AlreadyExistsError(absl::StrCat(
        "inproc: rank ", src, " sent ", tag.ToString(), " to rank ", dst, " twice")));
  }
  ++counters_.tensors_sent;
  counters_.bytes_sent += static_cast<int64_t>(t.nbytes());
  arrived_.notify_all();
  return CompletedSend(absl::OkStatus());
}

absl::StatusOr<Tensor> InProcessHub::Recv(int src, int dst, const TensorTag& tag,
                                          absl::Time deadline) {
  const Key key{src, dst, tag};
  MutexLock lock(mu_);
  while (true) {
    if (!aborted_.ok()) return aborted_;
    auto it = mailbox_.find(key);
    if (it != mailbox_.end()) {
      Tensor t = std::move(it->second);
      mailbox_.erase(it);
      return t;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "inproc: rank ", dst, " timed out waiting for ", tag.ToString(), " from rank ", src));
    }
    arrived_.wait_for(lock.native(), absl::ToChronoNanoseconds(left));
  }
}

void InProcessHub::Abort(int rank, const absl::Status& reason) {
  MutexLock lock(mu_);
  if (!aborted_.ok()) return;  // the first reason wins
  aborted_ = absl::AbortedError(absl::StrCat("rank ", rank, " aborted: ", reason.message()));
  arrived_.notify_all();
}

int InProcessHub::Pending() const {
  MutexLock lock(mu_);
  return static_cast<int>(mailbox_.size());
}

TransportCounters InProcessHub::Counters() const {
  MutexLock lock(mu_);
  return counters_;
}

void InProcessHub::Reset() {
  MutexLock lock(mu_);
  mailbox_.clear();
  aborted_ = absl::OkStatus();
}

}  // namespace baton
