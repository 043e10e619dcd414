#include "common/collective/gloo_collective.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/mutex.h"
#include "common/core/status.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace baton {

namespace {

// Gloo's TCP pairs write with writev. A write that lands after a peer's FIN is answered by a
// reset, and the next one raises SIGPIPE, whose default action ends this process without a
// word: a worker whose replica's worker died would die too, silently, instead of reporting
// the loss. Ignored, the write fails with EPIPE, which Gloo turns into an IoException and
// AllReduceSum into a status. Process-wide, as a signal's action is; a handler the process
// installed itself is kept (it returns, so the write still fails with EPIPE). baton's own
// sockets send with MSG_NOSIGNAL and gRPC's do too, so nothing else relies on SIGPIPE.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction now {};
  if (sigaction(SIGPIPE, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  (void)sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

GlooCollective::GlooCollective(int rank, int size, bool ordered,
                               std::shared_ptr<gloo::Context> context)
    : rank_(rank), size_(size), ordered_(ordered), context_(std::move(context)) {}

GlooCollective::~GlooCollective() = default;

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Connect(
    gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: member ", rank, " of a group of ", size));
  }
  IgnoreSigpipeUnlessHandled();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::milliseconds(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(options.connect_timeout))));
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooCollective>(new GlooCollective(rank, size, options.ordered, std::move(context)));
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat("gloo: member ", rank, " of ", size,
                                                    " could not join its group: ", e.what()));
  }
}

void GlooCollective::Abort(const absl::Status& why) {
  MutexLock lock(mu_);
  if (aborted_.ok()) {
    aborted_ = why.ok() ? absl::AbortedError("the data-parallel group was aborted") : why;
  }
}

absl::Status GlooCollective::Begin(const char* what) {
  MutexLock lock(mu_);
  if (!aborted_.ok()) {
    return absl::AbortedError(absl::StrCat(what, " on replica ", rank_, ": ", aborted_.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::chrono::milliseconds> GlooCollective::TimeLeft(absl::Time deadline,
                                                                   const char* what) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the deadline passed before it started"));
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
}

absl::Status GlooCollective::Run(const char* what, const std::function<void()>& op) {
  try {
    op();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    // A member's connection broke (its worker died or its network is gone) or timed out.
    const std::string message = e.what();
    const bool timeout = message.find("Timed out") != std::string::npos ||
                         message.find("timed out") != std::string::npos;
    const absl::Status s = absl::Status(
        timeout ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
        absl::StrCat(what, " on replica ", rank_, " of ", size_, ": ",
                     timeout ? "a member did not answer in time: " : "lost a member: ", message));
    Abort(s);  // the group is out of step now; later calls fail at once
    return s;
  } catch (const std::exception& e) {
    const absl::Status s = absl::DeadlineExceededError(
        absl::StrCat(what, " on replica ", rank_, " of ", size_, ": ", e.what()));
    Abort(s);
    return s;
  }
}

absl::Status GlooCollective::AllReduceSum(float* data, int64_t n, absl::Time deadline) {
  BATON_RETURN_IF_ERROR(Begin("all-reduce"));
  if (size_ == 1 || n == 0) return absl::OkStatus();
  BATON_ASSIGN_OR_RETURN(const std::chrono::milliseconds timeout, TimeLeft(deadline, "all-reduce"));
  if (!ordered_) {
    return Run("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setInput(data, static_cast<size_t>(n));  // in place
      opts.setOutput(data, static_cast<size_t>(n));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(tag_++);
      opts.setTimeout(timeout);
      gloo::allreduce(opts);
    });
  }
  gathered_.resize(static_cast<size_t>(n) * size_);
  BATON_RETURN_IF_ERROR(Run("all-reduce", [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(data, static_cast<size_t>(n));
    opts.setOutput(gathered_.data(), gathered_.size());
    opts.setTag(tag_++);
    opts.setTimeout(timeout);
    gloo::allgather(opts);
  }));
  // The ordered sum, member 0 first, as the interface promises.
  std::copy(gathered_.begin(), gathered_.begin() + n, data);
  for (int m = 1; m < size_; ++m) {
    const float* x = gathered_.data() + static_cast<size_t>(m) * n;
    for (int64_t i = 0; i < n; ++i) data[i] += x[i];
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AgreeOnCounts(const char* what, absl::Span<const int64_t> counts,
                                           std::chrono::milliseconds timeout) {
  if (agreed_.Contains(counts)) return absl::OkStatus();
  std::vector<int64_t> all(static_cast<size_t>(size_) * size_);
  BATON_RETURN_IF_ERROR(Run(what, [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<int64_t*>(counts.data()), counts.size());
    opts.setOutput(all.data(), all.size());
    opts.setTag(tag_++);
    opts.setTimeout(timeout);
    gloo::allgather(opts);
  }));
  for (int m = 0; m < size_; ++m) {
    const absl::Span<const int64_t> theirs(all.data() + static_cast<size_t>(m) * size_, size_);
    if (theirs != counts) {
      // Every member sees the same table, so every member fails here, naming the first.
      const absl::Status s = absl::InvalidArgumentError(absl::StrCat(
          what, " on replica ", rank_, ": replica ", m, " passes shard counts {",
          absl::StrJoin(theirs, ", "), "}, this one {", absl::StrJoin(counts, ", "), "}"));
      Abort(s);
      return s;
    }
  }
  agreed_.Add(counts);
  return absl::OkStatus();
}

absl::Status GlooCollective::ReduceScatterSum(float* data, absl::Span<const int64_t> counts,
                                              absl::Time deadline) {
  const char* const what = "reduce-scatter";
  BATON_RETURN_IF_ERROR(Begin(what));
  BATON_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, ShardOffsets(counts, size_, what));
  if (size_ == 1) return absl::OkStatus();
  BATON_ASSIGN_OR_RETURN(const std::chrono::milliseconds timeout, TimeLeft(deadline, what));
  BATON_RETURN_IF_ERROR(AgreeOnCounts(what, counts, timeout));
  const int64_t mine = counts[rank_];
  if (offsets.back() == 0) return absl::OkStatus();
  // Every member sends member m its copy of shard m and receives the others' copies of its
  // own, in member order: gathered_[m * mine, (m + 1) * mine) is member m's.
  gathered_.resize(static_cast<size_t>(mine) * size_);
  BATON_RETURN_IF_ERROR(Run(what, [&] {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(data, std::vector<int64_t>(counts.begin(), counts.end()));
    opts.setOutput(gathered_.data(), std::vector<int64_t>(size_, mine));
    opts.setTag(tag_++);
    opts.setTimeout(timeout);
    gloo::alltoallv(opts);
  }));
  float* const shard = data + offsets[rank_];
  std::copy(gathered_.begin(), gathered_.begin() + mine, shard);
  for (int m = 1; m < size_; ++m) {
    const float* x = gathered_.data() + static_cast<size_t>(m) * mine;
    for (int64_t i = 0; i < mine; ++i) shard[i] += x[i];
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllGather(float* data, absl::Span<const int64_t> counts,
                                       absl::Time deadline) {
  const char* const what = "all-gather";
  BATON_RETURN_IF_ERROR(Begin(what));
  BATON_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, ShardOffsets(counts, size_, what));
  if (size_ == 1) return absl::OkStatus();
  BATON_ASSIGN_OR_RETURN(const std::chrono::milliseconds timeout, TimeLeft(deadline, what));
  BATON_RETURN_IF_ERROR(AgreeOnCounts(what, counts, timeout));
  if (offsets.back() == 0) return absl::OkStatus();
  return Run(what, [&] {
    gloo::AllgathervOptions opts(context_);
    // No input: this member's shard is already in place in the output (allgatherv then
    // only passes the shards around its ring).
    opts.setOutput(data, std::vector<size_t>(counts.begin(), counts.end()));
    opts.setTag(tag_++);
    opts.setTimeout(timeout);
    gloo::allgatherv(opts);
  });
}

}  // namespace baton
