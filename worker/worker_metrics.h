// The worker's Prometheus metrics (the contract, names and labels, is
// docs/observability.md).
//
// Per-job series carry job_id. BeginJob drops the previous job's series, so a worker
// exposes one job at a time; Prometheus keeps the history. Per-action histograms and byte
// counters are created when their (stage, kind) first occurs, so a schedule without split
// backward (no I/W actions) exposes no empty I/W series.
//
// Threading: SetDevice and SetBusy from any thread; BeginJob, RecordStep and the observer
// BeginJob returns only from the thread running the job (one job at a time). Scrapes read
// concurrently through prometheus-cpp's own locking.
#ifndef BATON_WORKER_WORKER_METRICS_H_
#define BATON_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "baton/v1/cluster.pb.h"
#include "common/pipeline/stage_executor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton {

struct JobMetricsInfo {
  std::string job_id;
  int rank = 0;
  std::vector<int> stages;       // global stages this rank owns, ascending
  std::string transport;         // the transport backend: "grpc", "inproc", "nccl"
  // The backend of the link to each stage's rank, by global stage (its `transport` label
  // on the byte counters); stages not in it get `transport`.
  std::map<int, std::string> transport_by_stage;
  int64_t samples_per_step = 0;  // the global batch
  int64_t tokens_per_step = 0;   // TokensPerStep (spec.h): batch x context for gpt
  // The data-parallel group's engine ("gloo", "nccl"); empty without replicas.
  std::string collective;
  // The model FLOPs of this rank's blocks per step (3 x their forward FLOPs x the samples
  // its replica trains on), and its device's peak FLOP/s (0: unknown): the dashboard's MFU
  // is the job's rate of the first over the sum of the second.
  double model_flops_per_step = 0;
  double peak_flops = 0;
};

class WorkerMetrics : private StepObserver {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void SetDevice(const std::string& worker_id, const baton::v1::DeviceInfo& device);
  void SetBusy(bool busy);

  // Starts the job's series (dropping the previous job's) and returns the observer its
  // executor reports live in-flight counts to; valid until the next BeginJob.
  StepObserver* BeginJob(const JobMetricsInfo& info);
  // Records one finished step of the current job. `loss` only on the last stage's rank.
  void RecordStep(const RankStepResult& step, std::optional<float> loss);
  // Records one checkpoint write of the current job: how long the step waited for it and
  // the bytes of the block files.
  void RecordCheckpoint(absl::Duration took, int64_t bytes);

 private:
  void OnAction(const ActionTiming& timing, int inflight) override;
  // Reads the device allocator's stats into baton_worker_device_memory_bytes.
  void UpdateMemory();
  // The action-time histogram of (stage, kind): wall time, or with `device` device time.
  prometheus::Histogram& ActionHistogram(const std::string& stage, const std::string& kind,
                                         bool device = false);
  prometheus::Counter& Bytes(bool sent, int stage, int peer_stage, bool activation);
  template <typename T>
  T& Track(prometheus::Family<T>& family, const prometheus::Labels& labels);
  template <typename T, typename... Args>
  T& TrackWith(prometheus::Family<T>& family, const prometheus::Labels& labels, Args&&... args);

  prometheus::Family<prometheus::Gauge>& device_info_;
  prometheus::Gauge& busy_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Histogram>& action_seconds_;
  prometheus::Family<prometheus::Histogram>& action_device_seconds_;
  prometheus::Family<prometheus::Gauge>& bubble_;
  prometheus::Family<prometheus::Counter>& sent_bytes_;
  prometheus::Family<prometheus::Counter>& received_bytes_;
  prometheus::Family<prometheus::Gauge>& inflight_;
  prometheus::Family<prometheus::Gauge>& inflight_peak_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& val_loss_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Counter>& model_flops_;
  prometheus::Family<prometheus::Gauge>& peak_flops_;
  prometheus::Family<prometheus::Gauge>& memory_;
  prometheus::Family<prometheus::Gauge>& optimizer_state_;
  prometheus::Family<prometheus::Histogram>& checkpoint_seconds_;
  prometheus::Family<prometheus::Counter>& checkpoint_bytes_;
  prometheus::Family<prometheus::Histogram>& allreduce_seconds_;
  prometheus::Family<prometheus::Counter>& allreduce_bytes_;
  prometheus::Family<prometheus::Counter>& allreduce_wait_;
  prometheus::Family<prometheus::Gauge>& allreduce_overlap_;
  prometheus::Gauge& memory_in_use_;
  prometheus::Gauge& memory_cached_;
  prometheus::Gauge& memory_peak_;
  Device device_ = Device::kCpu;  // the worker's device (SetDevice)

  // The current job's series (job thread only).
  JobMetricsInfo job_;
  std::vector<std::function<void()>> removers_;  // drop the current job's series
  prometheus::Counter* steps_now_ = nullptr;
  prometheus::Histogram* step_seconds_now_ = nullptr;
  prometheus::Gauge* bubble_now_ = nullptr;
  prometheus::Gauge* inflight_now_ = nullptr;
  prometheus::Gauge* inflight_peak_now_ = nullptr;
  prometheus::Gauge* optimizer_state_now_ = nullptr;
  prometheus::Counter* samples_now_ = nullptr;
  prometheus::Counter* tokens_now_ = nullptr;
  prometheus::Gauge* loss_now_ = nullptr;
  prometheus::Gauge* val_loss_now_ = nullptr;
  prometheus::Gauge* learning_rate_now_ = nullptr;
  prometheus::Gauge* grad_norm_now_ = nullptr;
  prometheus::Counter* model_flops_now_ = nullptr;
  prometheus::Histogram* checkpoint_seconds_now_ = nullptr;
  prometheus::Counter* checkpoint_bytes_now_ = nullptr;
  // Data-parallel jobs only (job_.collective set).
  prometheus::Histogram* allreduce_seconds_now_ = nullptr;
  prometheus::Counter* allreduce_bytes_now_ = nullptr;
  prometheus::Counter* allreduce_wait_now_ = nullptr;
  prometheus::Gauge* allreduce_overlap_now_ = nullptr;
  // (stage, kind, device time) -> histogram
  std::map<std::tuple<std::string, std::string, bool>, prometheus::Histogram*> actions_now_;
  std::map<std::tuple<bool, int, int, bool>, prometheus::Counter*> bytes_now_;
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_METRICS_H_
