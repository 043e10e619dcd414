#include "common/comm/inproc_collective.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/mutex.h"
#include "common/core/status.h"

namespace baton {

class InProcessGroup::MemberImpl final : public Collective {
 public:
  MemberImpl(InProcessGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* engine() const override { return "inproc"; }
  absl::Status AllReduceSum(float* data, int64_t n, absl::Time deadline) override {
    return group_->Run(rank_, next_round_++, Op::kAllReduceSum, data, {n}, deadline);
  }
  absl::Status ReduceScatterSum(float* data, absl::Span<const int64_t> counts,
                                absl::Time deadline) override {
    BATON_RETURN_IF_ERROR(ShardOffsets(counts, size(), "reduce-scatter").status());
    return group_->Run(rank_, next_round_++, Op::kReduceScatterSum, data,
                       std::vector<int64_t>(counts.begin(), counts.end()), deadline);
  }
  absl::Status AllGather(float* data, absl::Span<const int64_t> counts,
                         absl::Time deadline) override {
    BATON_RETURN_IF_ERROR(ShardOffsets(counts, size(), "all-gather").status());
    return group_->Run(rank_, next_round_++, Op::kAllGather, data,
                       std::vector<int64_t>(counts.begin(), counts.end()), deadline);
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

namespace {

const char* OpName(int op) {
  static const char* const kNames[] = {"all-reduce", "reduce-scatter", "all-gather"};
  return kNames[op];
}

}  // namespace

absl::Status InProcessGroup::Run(int rank, int64_t round, Op op, float* data,
                                 std::vector<int64_t> counts, absl::Time deadline) {
  const char* const name = OpName(static_cast<int>(op));
  MutexLock lock(mu_);
  auto aborted = [&] {
    return absl::AbortedError(
        absl::StrCat(name, " #", round, " on replica ", rank, ": ", aborted_.message()));
  };
  if (!aborted_.ok()) return aborted();
  Round& r = rounds_[round];
  if (r.inputs.empty()) {
    r.inputs.assign(size_, nullptr);
    r.op = op;
    r.counts = counts;
  }
  if (r.op != op || r.counts != counts) {
    const absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("collective #", round, ": replica ", rank, " calls ", name, " of {",
                     absl::StrJoin(counts, ", "), "} floats, another ",
                     OpName(static_cast<int>(r.op)), " of {", absl::StrJoin(r.counts, ", "), "}"));
    aborted_ = s;
    cv_.notify_all();
    return s;
  }
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t m = 0; m < counts.size(); ++m) offsets[m + 1] = offsets[m] + counts[m];
  const int64_t n = offsets.back();
  r.inputs[rank] = data;
  if (++r.arrived == size_) {
    // The last to arrive computes, while the others wait on their buffers.
    if (op == Op::kAllGather) {
      r.result.resize(n);
      for (int m = 0; m < size_; ++m) {
        std::copy(r.inputs[m] + offsets[m], r.inputs[m] + offsets[m + 1],
                  r.result.begin() + offsets[m]);
      }
    } else {  // the ordered sum, in member order, of every element
      r.result.assign(r.inputs[0], r.inputs[0] + n);
      for (int m = 1; m < size_; ++m) {
        const float* x = r.inputs[m];
        for (int64_t i = 0; i < n; ++i) r.result[i] += x[i];
      }
    }
    r.summed = true;
    cv_.notify_all();
  }
  const auto until = absl::ToChronoTime(deadline);
  while (!r.summed && aborted_.ok()) {
    if (cv_.wait_until(lock.native(), until) == std::cv_status::timeout && !r.summed &&
        aborted_.ok()) {
      const absl::Status s = absl::DeadlineExceededError(
          absl::StrCat(name, " #", round, ": ", size_ - r.arrived, " of ", size_,
                       " replicas had not joined by the deadline"));
      aborted_ = s;  // the others would wait for the missing member forever too
      cv_.notify_all();
      return s;
    }
  }
  if (!r.summed) return aborted();
  if (op == Op::kReduceScatterSum) {
    std::copy(r.result.begin() + offsets[rank], r.result.begin() + offsets[rank + 1],
              data + offsets[rank]);
  } else {
    std::copy(r.result.begin(), r.result.end(), data);
  }
  if (++r.copied == size_) rounds_.erase(round);
  return absl::OkStatus();
}

}  // namespace baton
