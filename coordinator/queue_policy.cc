#include "coordinator/queue_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/spec/spec.h"
#include "coordinator/job_lifecycle.h"

namespace baton {
namespace {

int WorkersOf(const baton::v1::JobSpec& spec) {
  return spec.pipeline().stages() * std::max(1, spec.pipeline().data_parallel());
}

// Whether `w` could run a rank of `spec` (ChooseWorkers' filter: enough memory, a GPU when
// the job asks for CUDA).
bool CanUse(const baton::v1::JobSpec& spec, int64_t rank_bytes, const baton::v1::WorkerInfo& w) {
  const int64_t has = w.device().memory_bytes();
  if (has > 0 && has < rank_bytes) return false;
  const bool wants_cuda = spec.device() == baton::v1::DEVICE_KIND_CUDA ||
                          (spec.device() == baton::v1::DEVICE_KIND_UNSPECIFIED &&
                           spec.transport() == baton::v1::TRANSPORT_KIND_NCCL);
  return !wants_cuda || w.device().kind() == "cuda";
}

std::string Minutes(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

}  // namespace

QueueRound PlanQueueRound(const QueueRoundInput& in) {
  std::vector<const QueuedJob*> order;
  for (const QueuedJob& j : in.queue) order.push_back(&j);
  std::stable_sort(order.begin(), order.end(), [](const QueuedJob* a, const QueuedJob* b) {
    if (a->recovering != b->recovering) return a->recovering;
    if (a->spec.priority() != b->spec.priority()) return a->spec.priority() > b->spec.priority();
    return a->seq < b->seq;
  });
  int64_t largest = 0;
  for (const baton::v1::WorkerInfo& w : in.registered) {
    largest = std::max(largest, w.device().memory_bytes());
  }
  QueueRound out;
  std::vector<bool> taken(in.idle.size(), false);  // started on this round, or reserved
  std::map<std::string, int> held = in.held_by_user;
  const QueuedJob* head = nullptr;
  int position = 0;
  for (const QueuedJob* j : order) {
    auto wait = [&](std::string reason) {  // positions count the jobs still waiting
      out.waits.push_back({j->id, ++position, std::move(reason)});
    };
    baton::v1::JobSpec spec = j->spec;
    if (j->recovering) {
      if (j->stopping) {
        wait("stopping the job's other workers");
        continue;
      }
      int free = 0;
      for (size_t i = 0; i < in.idle.size(); ++i) {
        free += !taken[i] && CanUse(spec, 0, in.idle[i]) ? 1 : 0;
      }
      const int stages = RecoveryStages(spec, free);
      if (stages == 0) {
        wait(absl::StrCat("waiting for ",
                          std::max(1, spec.restart().min_stages()) *
                              std::max(1, spec.pipeline().data_parallel()),
                          " idle workers to recover on (", free, " idle)"));
        if (head == nullptr) head = j;
        continue;
      }
      SetPipelineStages(&spec, stages);
    } else {
      // Could the registered workers, all idle, ever run it?
      std::string never;
      if (!ChooseWorkers(spec, in.registered, {}, &never, j->rank_need_bytes, largest)) {
        wait(absl::StrCat(
            "cannot run on the workers registered now (",
            absl::StrReplaceAll(never, {{"waiting for ", "it needs "},
                                        {"waiting: ", ""},
                                        {" idle", " registered"}}),
            "); it waits for more to register and holds no one up"));
        continue;
      }
    }
    const int need = WorkersOf(spec);
    if (j->limits.max_workers.has_value() && held[j->user] + need > *j->limits.max_workers) {
      wait(absl::StrCat("user ", j->user, " holds ", held[j->user], " of its ",
                        *j->limits.max_workers, " workers and this job needs ", need,
                        " (quota max_workers)"));
      continue;
    }
    std::string why;
    std::optional<WorkerChoice> choice =
        ChooseWorkers(spec, in.idle, taken, &why, j->rank_need_bytes, largest);
    if (choice.has_value()) {
      for (size_t i : choice->indices) taken[i] = true;
      held[j->user] += need;
      out.starts.push_back({j->id, std::move(spec), *std::move(choice)});
      continue;
    }
    // Reasons start with what the job waits for, the details after " (" (the history
    // records a reason again only when that start changes: coordinator.cc).
    if (head != nullptr) {
      wait(absl::StrCat("behind the first in line: ", why, "; the first is ", head->id,
                        out.reserved_for.empty()
                            ? ""
                            : absl::StrCat(", which holds ", out.reserved_workers,
                                           " idle workers")));
      continue;
    }
    head = j;
    const absl::Duration waited = in.now - j->queued_since;
    if (waited >= in.reserve_after) {
      for (size_t i = 0; i < in.idle.size(); ++i) {
        if (!taken[i] && CanUse(spec, j->rank_need_bytes, in.idle[i])) {
          taken[i] = true;
          ++out.reserved_workers;
        }
      }
      out.reserved_for = j->id;
      wait(absl::StrCat("first in line, holding workers: ", why, "; after waiting ",
                        Minutes(waited), " it holds the ", out.reserved_workers,
                        " idle workers it can use"));
    } else {
      wait(absl::StrCat("first in line: ", why, "; jobs behind it may start on idle workers "
                        "until it has waited ", Minutes(in.reserve_after)));
    }
  }
  return out;
}

}  // namespace baton
