#include "coordinator/queue_policy.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/spec/spec.h"
#include "coordinator/job_lifecycle.h"

namespace baton {
namespace {

int WorkersOf(const baton::v1::JobSpec& spec) {
  return spec.pipeline().stages() * std::max(1, spec.pipeline().data_parallel());
}

// What ChooseWorkers' answer depends on besides the workers: jobs alike in these fit alike,
// so a round asks once per kind of job, not once per job (10,000 queued jobs are mostly
// a few kinds).
const std::vector<int64_t>& NeedsOf(const QueuedJob& j) {
  static const std::vector<int64_t> kNone;
  return j.rank_needs != nullptr ? *j.rank_needs : kNone;
}

// The per-rank shares, folded into the key without a copy: their FNV-1a hash beside their
// count (10,000 queued jobs are read every round).
using FitKey = std::tuple<int, int, int, int64_t, size_t, uint64_t>;
FitKey KeyOf(const baton::v1::JobSpec& spec, const QueuedJob& j) {
  uint64_t h = 14695981039346656037ull;
  for (int64_t n : NeedsOf(j)) {
    for (int b = 0; b < 8; ++b) {
      h = (h ^ ((static_cast<uint64_t>(n) >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
  }
  return {WorkersOf(spec), static_cast<int>(spec.device()), static_cast<int>(spec.transport()),
          j.rank_need_bytes, NeedsOf(j).size(), h};
}

// What a worker must hold to be of use to `j` at all: its smallest rank's share.
int64_t LeastNeed(const QueuedJob& j) {
  const std::vector<int64_t>& needs = NeedsOf(j);
  if (needs.empty()) return j.rank_need_bytes;
  return *std::min_element(needs.begin(), needs.end());
}

std::string Minutes(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

// The running jobs to stop so that `spec` fits on the idle workers not taken plus theirs:
// preemptible ones of lower priority holding workers it can use, the newest first (then
// the fewest workers), as few as fit; empty when even all of them would not do.
// `protected_jobs` gets the lower-priority jobs that could have been of use but are still
// protected (RunningJob::protection), one "ID (why)" each.
std::vector<std::string> ChooseVictims(const QueueRoundInput& in, const QueuedJob& head,
                                       const baton::v1::JobSpec& spec,
                                       const std::vector<bool>& taken, int64_t largest,
                                       std::vector<std::string>* protected_jobs) {
  std::vector<const RunningJob*> candidates;
  for (const RunningJob& r : in.running) {
    if (!r.preemptible || r.priority >= spec.priority()) continue;
    const bool useful = std::any_of(r.workers.begin(), r.workers.end(), [&](const auto& w) {
      return WorkerCanRunRank(spec, LeastNeed(head), w);
    });
    if (!useful) continue;
    if (!r.protection.empty()) {
      protected_jobs->push_back(absl::StrCat(r.id, " (", r.protection, ")"));
      continue;
    }
    candidates.push_back(&r);
  }
  if (candidates.empty()) return {};
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const RunningJob* a, const RunningJob* b) {
                     if (a->started != b->started) return a->started > b->started;
                     return a->workers.size() < b->workers.size();
                   });
  // The idle workers left, then those of each job chosen: whether the head fits on them.
  std::vector<baton::v1::WorkerInfo> free;
  for (size_t i = 0; i < in.idle.size(); ++i) {
    if (i >= taken.size() || !taken[i]) free.push_back(in.idle[i]);
  }
  auto fits = [&](const std::vector<baton::v1::WorkerInfo>& pool) {
    std::string why;
    return ChooseWorkers(spec, pool, {}, &why, head.rank_need_bytes, largest, NeedsOf(head))
        .has_value();
  };
  auto pool_of = [&](const std::vector<const RunningJob*>& chosen) {
    std::vector<baton::v1::WorkerInfo> pool = free;
    for (const RunningJob* r : chosen) pool.insert(pool.end(), r->workers.begin(), r->workers.end());
    return pool;
  };
  // Nothing to do unless stopping every candidate would make room (one check a round while
  // a head that is too large waits, not one per candidate).
  if (!fits(pool_of(candidates))) return {};
  std::vector<const RunningJob*> chosen;
  std::vector<baton::v1::WorkerInfo> pool = free;
  for (const RunningJob* r : candidates) {
    chosen.push_back(r);
    pool.insert(pool.end(), r->workers.begin(), r->workers.end());
    if (fits(pool)) break;
  }
  // Spare those the rest make room without (a later, larger one may cover an earlier one).
  for (size_t i = chosen.size(); i-- > 0;) {
    std::vector<const RunningJob*> without = chosen;
    without.erase(without.begin() + static_cast<std::ptrdiff_t>(i));
    if (!without.empty() && fits(pool_of(without))) chosen = std::move(without);
  }
  std::vector<std::string> ids;
  for (const RunningJob* r : chosen) ids.push_back(r->id);
  return ids;
}

}  // namespace

QueueRound PlanQueueRound(const QueueRoundInput& in) {
  std::vector<const QueuedJob*> order;
  for (const QueuedJob& j : in.queue) order.push_back(&j);
  std::stable_sort(order.begin(), order.end(), [](const QueuedJob* a, const QueuedJob* b) {
    if (a->recovering != b->recovering) return a->recovering;
    if (a->spec->priority() != b->spec->priority()) {
      return a->spec->priority() > b->spec->priority();
    }
    return a->seq < b->seq;
  });
  int64_t largest = 0;
  for (const baton::v1::WorkerInfo& w : in.registered) {
    largest = std::max(largest, w.device().memory_bytes());
  }
  QueueRound out;
  std::vector<bool> taken(in.idle.size(), false);  // started on this round, or reserved
  std::map<std::string, int> held = in.held_by_user;
  // Memos: whether a kind of job could run on the registered workers ("" yes, else why
  // not), and why a kind of job does not fit the idle workers left (cleared whenever a job
  // takes workers or a reservation holds some).
  std::map<FitKey, std::string> never_memo;
  std::map<FitKey, std::string> misfit_memo;
  const QueuedJob* head = nullptr;
  int position = 0;
  for (const QueuedJob* j : order) {
    if (static_cast<int>(out.starts.size()) >= in.max_starts) {
      out.more = true;
      break;
    }
    const size_t index = static_cast<size_t>(j - in.queue.data());
    auto wait = [&](std::string reason) {  // positions count the jobs still waiting
      out.waits.push_back({index, j->id, ++position, std::move(reason)});
    };
    std::optional<baton::v1::JobSpec> fewer;  // a recovering job's spec on fewer stages
    const baton::v1::JobSpec* spec_ptr = j->spec.get();
    if (j->stopping) {
      wait("stopping the job's other workers");
      continue;
    }
    if (j->recovering) {
      const baton::v1::JobSpec& spec = *j->spec;
      int free = 0;
      for (size_t i = 0; i < in.idle.size(); ++i) {
        free += !taken[i] && WorkerCanRunRank(spec, 0, in.idle[i]) ? 1 : 0;
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
      if (stages != spec.pipeline().stages()) {
        fewer = spec;
        SetPipelineStages(&*fewer, stages);
        spec_ptr = &*fewer;
      }
    } else {
      // Could the registered workers, all idle, ever run it?
      const FitKey key = KeyOf(*j->spec, *j);
      auto memo = never_memo.find(key);
      if (memo == never_memo.end()) {
        std::string never;
        if (ChooseWorkers(*j->spec, in.registered, {}, &never, j->rank_need_bytes, largest,
                          NeedsOf(*j))) {
          never.clear();
        } else {
          never = absl::StrCat(
              "cannot run on the workers registered now (",
              absl::StrReplaceAll(never, {{"waiting for ", "it needs "},
                                          {"waiting: ", ""},
                                          {" idle", " registered"}}),
              "); it waits for more to register and holds no one up");
        }
        memo = never_memo.emplace(key, std::move(never)).first;
      }
      if (!memo->second.empty()) {
        wait(memo->second);
        continue;
      }
    }
    const baton::v1::JobSpec& spec = *spec_ptr;
    const int need = WorkersOf(spec);
    if (j->limits.max_workers.has_value() && need > *j->limits.max_workers) {
      wait(absl::StrCat("user ", j->user, " may hold ", *j->limits.max_workers,
                        " workers and this job needs ", need,
                        " (quota max_workers); it runs once the quota is raised"));
      continue;
    }
    if (j->limits.max_workers.has_value() && held[j->user] + need > *j->limits.max_workers) {
      wait(absl::StrCat("user ", j->user, " holds ", held[j->user], " of its ",
                        *j->limits.max_workers, " workers and this job needs ", need,
                        " (quota max_workers)"));
      continue;
    }
    std::string why;
    std::optional<WorkerChoice> choice;
    const FitKey key = KeyOf(spec, *j);
    if (auto memo = misfit_memo.find(key); memo != misfit_memo.end() && !j->recovering) {
      why = memo->second;  // one like it did not fit what is left: neither does this one
    } else {
      choice = ChooseWorkers(spec, in.idle, taken, &why, j->rank_need_bytes, largest,
                             j->recovering ? std::vector<int64_t>() : NeedsOf(*j));
      if (!choice.has_value() && !j->recovering) misfit_memo.emplace(key, why);
    }
    if (choice.has_value()) {
      for (size_t i : choice->indices) taken[i] = true;
      misfit_memo.clear();
      held[j->user] += need;
      out.starts.push_back({index, j->id, spec, *std::move(choice)});
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
    // The head holds every idle worker it can use; later jobs start only on the others.
    auto reserve = [&] {
      for (size_t i = 0; i < in.idle.size(); ++i) {
        if (!taken[i] && WorkerCanRunRank(spec, LeastNeed(*j), in.idle[i])) {
          taken[i] = true;
          ++out.reserved_workers;
        }
      }
      out.reserved_for = j->id;
      misfit_memo.clear();
    };
    std::vector<std::string> victims;
    std::vector<std::string> protected_jobs;
    if (!j->preempting && !j->recovering && in.preempt && j->no_preempt.empty()) {
      victims = ChooseVictims(in, *j, spec, taken, largest, &protected_jobs);
    }
    // Why it preempts nothing, when it might have: said after the reason's first part.
    std::string no_preemption;
    if (!j->no_preempt.empty() && in.preempt && !j->preempting && !j->recovering) {
      no_preemption = absl::StrCat("; it preempts nothing: ", j->no_preempt);
    } else if (victims.empty() && !protected_jobs.empty()) {
      no_preemption = absl::StrCat("; not preempting, still protected: ",
                                   absl::StrJoin(protected_jobs, ", "));
    }
    if (j->preempting || !victims.empty()) {
      reserve();  // while the jobs it preempted stop
      if (!victims.empty()) {
        wait(absl::StrCat("preempting lower-priority jobs: ", absl::StrJoin(victims, ", "),
                          " (", why, "; they stop at a checkpoint and give their workers to it,"
                          " and it holds the ", out.reserved_workers, " idle workers it can use)"));
        out.preemption = QueueRound::Preemption{j->id, std::move(victims)};
      } else {
        wait(absl::StrCat("waiting for preempted jobs to stop at a checkpoint (", why,
                          "; it holds the ", out.reserved_workers, " idle workers it can use)"));
      }
    } else if (waited >= in.reserve_after) {
      reserve();
      wait(absl::StrCat("first in line, holding workers: ", why, "; after waiting ",
                        Minutes(waited), " it holds the ", out.reserved_workers,
                        " idle workers it can use", no_preemption));
    } else {
      wait(absl::StrCat("first in line: ", why, "; jobs behind it may start on idle workers "
                        "until it has waited ", Minutes(in.reserve_after), no_preemption));
    }
  }
  return out;
}

}  // namespace baton
