#include "coordinator/coordinator_metrics.h"

#include <utility>

#include "common/metrics/metrics.h"
#include "common/core/mutex.h"
#include "prometheus/metric_family.h"

namespace baton {

class CoordinatorMetrics::Collector : public prometheus::Collectable {
 public:
  void Set(std::function<StateCounts()> source) {
    MutexLock lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    StateCounts counts;
    {
      // Held while the source runs: once Set(nullptr) returns, no call is in flight.
      MutexLock lock(mu_);
      if (!source_) return {};
      counts = source_();
    }
    prometheus::MetricFamily exports;
    exports.name = "baton_coordinator_exports";
    exports.help = "ExportJob streams under way.";
    exports.type = prometheus::MetricType::Gauge;
    exports.metric.emplace_back().gauge.value = static_cast<double>(counts.exports);
    return {Family("baton_coordinator_workers", "Registered workers by state.", counts.workers),
            Family("baton_coordinator_jobs", "Jobs by state, history included.", counts.jobs),
            std::move(exports)};
  }

 private:
  static prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                         const std::map<std::string, int64_t>& by_state) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = prometheus::MetricType::Gauge;
    for (const auto& [state, n] : by_state) {
      prometheus::ClientMetric m;
      m.label.push_back({"state", state});
      m.gauge.value = static_cast<double>(n);
      f.metric.push_back(std::move(m));
    }
    return f;
  }

  mutable Mutex mu_;
  std::function<StateCounts()> source_ ABSL_GUARDED_BY(mu_);
};

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : queue_wait_(prometheus::BuildHistogram()
                      .Name("baton_coordinator_queue_wait_seconds")
                      .Help("Time from submission to running, per job that ran.")
                      .Register(registry)
                      .Add({}, StepSecondsBuckets())),
      placement_round_(prometheus::BuildHistogram()
                           .Name("baton_coordinator_placement_round_seconds")
                           .Help("Placement rounds: how long each held the coordinator's lock "
                                 "deciding which queued jobs start.")
                           .Register(registry)
                           .Add({}, prometheus::Histogram::BucketBoundaries{
                                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                        0.2, 0.5, 1})),
      heartbeats_missed_(prometheus::BuildCounter()
                             .Name("baton_coordinator_heartbeats_missed_total")
                             .Help("Heartbeat intervals that passed without a heartbeat.")
                             .Register(registry)
                             .Add({})),
      lease_expirations_(prometheus::BuildCounter()
                             .Name("baton_coordinator_lease_expirations_total")
                             .Help("Worker leases that expired.")
                             .Register(registry)
                             .Add({})),
      checkpoint_write_(prometheus::BuildHistogram()
                            .Name("baton_coordinator_checkpoint_write_seconds")
                            .Help("Per complete checkpoint: the slowest rank's write time (how "
                                  "long the pipeline stood still for it).")
                            .Register(registry)
                            .Add({}, StepSecondsBuckets())),
      checkpoint_bytes_(prometheus::BuildCounter()
                            .Name("baton_coordinator_checkpoint_bytes_total")
                            .Help("Bytes of block files in complete checkpoints.")
                            .Register(registry)
                            .Add({})),
      recoveries_(prometheus::BuildCounter()
                      .Name("baton_coordinator_recoveries_total")
                      .Help("Jobs that went RECOVERING after losing a worker (spec restart).")
                      .Register(registry)
                      .Add({})),
      preemptions_(prometheus::BuildCounter()
                       .Name("baton_coordinator_preemptions_total")
                       .Help("Jobs stopped at a checkpoint (PREEMPTED) to make room for a "
                             "higher-priority job.")
                       .Register(registry)
                       .Add({})),
      recovery_seconds_(prometheus::BuildHistogram()
                            .Name("baton_coordinator_recovery_seconds")
                            .Help("From detecting the failure to the first step after the "
                                  "resume, per recovery.")
                            .Register(registry)
                            .Add({}, StepSecondsBuckets())),
      auth_refusals_(prometheus::BuildCounter()
                         .Name("baton_coordinator_auth_refusals_total")
                         .Help("Calls refused for their credentials, by service (jobs, "
                               "cluster) and code (unauthenticated, permission_denied).")
                         .Register(registry)),
      collector_(std::make_shared<Collector>()) {
  // Present from the start, so a dashboard's rate() has a zero to start from.
  for (const char* service : {"jobs", "cluster"}) {
    for (const char* code : {"unauthenticated", "permission_denied"}) {
      auth_refusals_.Add({{"service", service}, {"code", code}});
    }
  }
}

void CoordinatorMetrics::AddAuthRefusal(absl::string_view service, absl::StatusCode code) {
  const char* name = code == absl::StatusCode::kUnauthenticated    ? "unauthenticated"
                     : code == absl::StatusCode::kPermissionDenied ? "permission_denied"
                                                                   : nullptr;
  if (name == nullptr) return;
  auth_refusals_.Add({{"service", std::string(service)}, {"code", name}}).Increment();
}

void CoordinatorMetrics::AddRecovery() { recoveries_.Increment(); }

void CoordinatorMetrics::AddPreemption() { preemptions_.Increment(); }

void CoordinatorMetrics::ObserveRecovery(absl::Duration d) {
  recovery_seconds_.Observe(absl::ToDoubleSeconds(d));
}

void CoordinatorMetrics::ObserveCheckpoint(absl::Duration slowest_write, int64_t bytes) {
  checkpoint_write_.Observe(absl::ToDoubleSeconds(slowest_write));
  checkpoint_bytes_.Increment(static_cast<double>(bytes));
}

void CoordinatorMetrics::ObserveQueueWait(absl::Duration wait) {
  queue_wait_.Observe(absl::ToDoubleSeconds(wait));
}

void CoordinatorMetrics::ObservePlacementRound(absl::Duration took) {
  placement_round_.Observe(absl::ToDoubleSeconds(took));
}

void CoordinatorMetrics::AddHeartbeatsMissed(int64_t n) {
  if (n > 0) heartbeats_missed_.Increment(static_cast<double>(n));
}

void CoordinatorMetrics::AddLeaseExpiration() { lease_expirations_.Increment(); }

std::shared_ptr<prometheus::Collectable> CoordinatorMetrics::StateCollector() {
  return collector_;
}

void CoordinatorMetrics::SetStateSource(std::function<StateCounts()> source) {
  collector_->Set(std::move(source));
}

}  // namespace baton
