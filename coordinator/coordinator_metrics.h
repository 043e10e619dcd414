// The coordinator's Prometheus metrics (contract: docs/observability.md).
//
// Counters and histograms are updated as things happen; the gauges of workers and jobs by
// state, and of exports under way, are computed when Prometheus scrapes, from a snapshot
// the coordinator supplies (so they cannot drift from the registry and the job store).
//
// Thread-safe.
#ifndef BATON_COORDINATOR_COORDINATOR_METRICS_H_
#define BATON_COORDINATOR_COORDINATOR_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/family.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton {

// Workers and jobs by state label ("idle", "queued", ...).
struct StateCounts {
  std::map<std::string, int64_t> workers;
  std::map<std::string, int64_t> jobs;
  int64_t exports = 0;  // ExportJob streams under way
};

class CoordinatorMetrics {
 public:
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  void ObserveQueueWait(absl::Duration wait);
  // One placement round (queue_policy.h) took `took`, holding the coordinator's lock.
  void ObservePlacementRound(absl::Duration took);
  void AddHeartbeatsMissed(int64_t n);
  void AddLeaseExpiration();
  // A job's checkpoint became complete: the slowest rank's write time and every rank's bytes.
  void ObserveCheckpoint(absl::Duration slowest_write, int64_t bytes);
  // A job went RECOVERING; and, once it ran a step again, how long that took from detection.
  void AddRecovery();
  void ObserveRecovery(absl::Duration detection_to_first_step);
  // A call refused for its credentials: `service` "jobs" or "cluster", `code`
  // UNAUTHENTICATED or PERMISSION_DENIED (other codes are ignored).
  void AddAuthRefusal(absl::string_view service, absl::StatusCode code);

  // The collector of baton_coordinator_workers, baton_coordinator_jobs and
  // baton_coordinator_exports; serve it beside
  // the registry. Until SetStateSource is called it reports nothing.
  std::shared_ptr<prometheus::Collectable> StateCollector();
  // `source` is called on the scraping thread; it must be safe to call then, and until
  // cleared with an empty function.
  // A job stopped at a checkpoint and went PREEMPTED, making room for a higher-priority one.
  void AddPreemption();
  void SetStateSource(std::function<StateCounts()> source);

 private:
  class Collector;
  prometheus::Histogram& queue_wait_;
  prometheus::Histogram& placement_round_;
  prometheus::Counter& heartbeats_missed_;
  prometheus::Counter& lease_expirations_;
  prometheus::Histogram& checkpoint_write_;
  prometheus::Counter& checkpoint_bytes_;
  prometheus::Counter& recoveries_;
  prometheus::Counter& preemptions_;
  prometheus::Histogram& recovery_seconds_;
  prometheus::Family<prometheus::Counter>& auth_refusals_;
  std::shared_ptr<Collector> collector_;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_COORDINATOR_METRICS_H_
