#include "common/comm/inproc_collective.h"
#include "common/core/mutex.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {

class InProcessGroup::MemberImpl final : public Collective {
 public:
  MemberImpl(InProcessGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* engine() const override { return "inproc"; }
  absl::Status AllReduceSum(float* data, int64_t n, absl::Time deadline) override {
    return group_->AllReduceSum(rank_, next_round_++, data, n, deadline);
  }
  void Abort(const absl::Status& why) override { group_->Abort(why); }

 private:
  InProcessGroup* const group_;
  const int rank_;
  int64_t next_round_ = 0;  // collectives this member has started
};

InProcessGroup::InProcessGroup(int size) : size_(size) {}

std::unique_ptr<Collective> InProcessGroup::Member(int rank) {
  return std::make_unique<MemberImpl>(this, rank);
}

void InProcessGroup::Abort(const absl::Status& why) {
  {
    MutexLock lock(mu_);
    if (aborted_.ok()) {
      aborted_ = why.ok() ? absl::AbortedError("the data-parallel group was aborted") : why;
    }
  }
  cv_.notify_all();
}

absl::Status InProcessGroup::AllReduceSum(int rank, int64_t round, float* data, int64_t n,
                                          absl::Time deadline) {
  MutexLock lock(mu_);
  auto aborted = [&] {
    return absl::AbortedError(absl::StrCat("all-reduce #", round, " on replica ", rank, ": ",
                                           aborted_.message()));
  };
  if (!aborted_.ok()) return aborted();
  Round& r = rounds_[round];
  if (r.inputs.empty()) r.inputs.assign(size_, nullptr);
  if (r.n < 0) r.n = n;
  if (r.n != n) {
    const absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("all-reduce #", round, ": replica ", rank, " passes ", n,
                     " floats, another ", r.n));
    aborted_ = s;
    cv_.notify_all();
    return s;
  }
  r.inputs[rank] = data;
  if (++r.arrived == size_) {
    // The last to arrive sums, in member order, while the others wait on their buffers.
    r.result.assign(r.inputs[0], r.inputs[0] + n);
    for (int m = 1; m < size_; ++m) {
      const float* x = r.inputs[m];
      for (int64_t i = 0; i < n; ++i) r.result[i] += x[i];
    }
    r.summed = true;
    cv_.notify_all();
  }
  const auto until = absl::ToChronoTime(deadline);
  while (!r.summed && aborted_.ok()) {
    if (cv_.wait_until(lock.native(), until) == std::cv_status::timeout && !r.summed && aborted_.ok()) {
      const absl::Status s = absl::DeadlineExceededError(
          absl::StrCat("all-reduce #", round, ": ", size_ - r.arrived, " of ", size_,
                       " replicas had not joined by the deadline"));
      aborted_ = s;  // the others would wait for the missing member forever too
      cv_.notify_all();
      return s;
    }
  }
  if (!r.summed) return aborted();
  std::copy(r.result.begin(), r.result.end(), data);
  if (++r.copied == size_) rounds_.erase(round);
  return absl::OkStatus();
}

}  // namespace baton
