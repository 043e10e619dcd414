#include "worker/worker_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics/metrics.h"

namespace baton {
namespace {

double Seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : device_info_(prometheus::BuildGauge()
                       .Name("baton_worker_device_info")
                       .Help("The device the worker runs on (value 1).")
                       .Register(registry)),
      busy_(prometheus::BuildGauge()
                .Name("baton_worker_busy")
                .Help("1 while the worker runs a job.")
                .Register(registry)
                .Add({})),
      steps_(prometheus::BuildCounter()
                 .Name("baton_worker_steps_total")
                 .Help("Training steps finished by this rank.")
                 .Register(registry)),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("baton_worker_step_duration_seconds")
                        .Help("Wall time of one step on this rank, clock start to last send "
                              "done.")
                        .Register(registry)),
      action_seconds_(prometheus::BuildHistogram()
                          .Name("baton_worker_action_duration_seconds")
                          .Help("Time of one clock action by stage and kind (F, B, I, W, "
                                "send, recv_wait, send_wait, optimizer).")
                          .Register(registry)),
      action_device_seconds_(
          prometheus::BuildHistogram()
              .Name("baton_worker_action_device_seconds")
              .Help("Device (GPU kernel) time of one compute action or optimizer step by stage "
                    "and kind, from stream events; GPU workers only (on the CPU the action "
                    "duration is the compute time).")
              .Register(registry)),
      bubble_(prometheus::BuildGauge()
                  .Name("baton_worker_bubble_ratio")
                  .Help("Idle share of the last step on this rank: 1 - compute / step time.")
                  .Register(registry)),
      sent_bytes_(prometheus::BuildCounter()
                      .Name("baton_worker_sent_bytes_total")
                      .Help("Tensor payload bytes sent from stage to peer_stage.")
                      .Register(registry)),
      received_bytes_(prometheus::BuildCounter()
                          .Name("baton_worker_received_bytes_total")
                          .Help("Tensor payload bytes stage received from peer_stage.")
                          .Register(registry)),
      inflight_(prometheus::BuildGauge()
                    .Name("baton_worker_inflight_activations")
                    .Help("Micro-batches whose activations this rank holds now.")
                    .Register(registry)),
      inflight_peak_(prometheus::BuildGauge()
                         .Name("baton_worker_inflight_activations_peak")
                         .Help("Peak of baton_worker_inflight_activations during the last "
                               "step.")
                         .Register(registry)),
      samples_(prometheus::BuildCounter()
                   .Name("baton_worker_samples_total")
                   .Help("Samples through this rank.")
                   .Register(registry)),
      tokens_(
          prometheus::BuildCounter()
              .Name("baton_worker_tokens_total")
              .Help("Tokens through this rank (gpt: sequences x context; an mlp row is one token).")
              .Register(registry)),
      loss_(prometheus::BuildGauge()
                .Name("baton_worker_loss")
                .Help("Mean loss of the last step (the rank owning the last stage).")
                .Register(registry)),
      val_loss_(prometheus::BuildGauge()
                    .Name("baton_worker_val_loss")
                    .Help("Validation loss of the last evaluation (JobSpec.eval; the rank "
                          "owning the last stage).")
                    .Register(registry)),
      learning_rate_(prometheus::BuildGauge()
                         .Name("baton_worker_learning_rate")
                         .Help("Learning rate of the last step (optimizer.lr_schedule).")
                         .Register(registry)),
      grad_norm_(prometheus::BuildGauge()
                     .Name("baton_worker_grad_norm")
                     .Help("Global gradient norm of the last step, before clipping (jobs "
                           "with optimizer.clip_grad_norm).")
                     .Register(registry)),
      model_flops_(prometheus::BuildCounter()
                       .Name("baton_worker_model_flops_total")
                       .Help("Model FLOPs of this rank's blocks (3 x forward FLOPs per "
                             "sample x samples), the numerator of MFU.")
                       .Register(registry)),
      peak_flops_(prometheus::BuildGauge()
                      .Name("baton_worker_peak_flops")
                      .Help("Peak FLOP/s of this rank's device in the job's precision (a "
                            "GPU's datasheet, a CPU's measured at start), the denominator "
                            "of MFU; absent when unknown.")
                      .Register(registry)),
      memory_(prometheus::BuildGauge()
                  .Name("baton_worker_device_memory_bytes")
                  .Help("Memory of the worker's device held by its allocator: in_use by "
                        "tensors, cached for reuse, peak in_use since the worker started.")
                  .Register(registry)),
      optimizer_state_(prometheus::BuildGauge()
                           .Name("baton_worker_optimizer_state_bytes")
                           .Help("Optimizer state this rank holds (AdamW's moments, SGD's "
                                 "momentum): its share with optimizer.shard, else all of its "
                                 "parameters'.")
                           .Register(registry)),
      checkpoint_seconds_(prometheus::BuildHistogram()
                              .Name("baton_worker_checkpoint_write_seconds")
                              .Help("Time a step waited for this rank's checkpoint write "
                                    "(block files, fsync, manifest).")
                              .Register(registry)),
      checkpoint_bytes_(prometheus::BuildCounter()
                            .Name("baton_worker_checkpoint_bytes_total")
                            .Help("Bytes of checkpoint block files this rank wrote.")
                            .Register(registry)),
      allreduce_seconds_(prometheus::BuildHistogram()
                             .Name("baton_worker_allreduce_seconds")
                             .Help("Time of one gradient all-reduce (one REDUCE_GRAD's "
                                   "buckets; with a sharded optimizer its reduce-scatters, "
                                   "and STEP's weights all-gather) on this rank's "
                                   "communication thread.")
                             .Register(registry)),
      allreduce_bytes_(prometheus::BuildCounter()
                           .Name("baton_worker_allreduce_bytes_total")
                           .Help("Gradient bytes this rank summed with its replicas.")
                           .Register(registry)),
      allreduce_wait_(prometheus::BuildCounter()
                          .Name("baton_worker_allreduce_wait_seconds_total")
                          .Help("Time this rank waited for its all-reduces (at TIE_GRAD, "
                                "CLIP_GRAD and STEP, and for a sharded optimizer's weights "
                                "all-gather): the part not hidden under compute.")
                          .Register(registry)),
      allreduce_overlap_(prometheus::BuildGauge()
                             .Name("baton_worker_allreduce_overlap_ratio")
                             .Help("Share of the last step's all-reduce time hidden under "
                                   "the clock: 1 - wait / all-reduce time.")
                             .Register(registry)),
      memory_in_use_(memory_.Add({{"state", "in_use"}})),
      memory_cached_(memory_.Add({{"state", "cached"}})),
      memory_peak_(memory_.Add({{"state", "peak"}})) {}

void WorkerMetrics::UpdateMemory() {
  const Allocator* a = AllocatorFor(device_);
  if (a == nullptr) return;
  const AllocatorStats st = a->Stats();
  memory_in_use_.Set(static_cast<double>(st.bytes_in_use));
  memory_cached_.Set(static_cast<double>(st.bytes_cached));
  memory_peak_.Set(static_cast<double>(st.peak_bytes_in_use));
}

void WorkerMetrics::SetDevice(const std::string& worker_id,
                              const baton::v1::DeviceInfo& device) {
  device_info_
      .Add({{"worker_id", worker_id},
            {"kind", device.kind()},
            {"name", device.name()},
            {"uuid", device.uuid()},
            {"kernels", device.kernels()},
            {"threads", device.threads() > 0 ? absl::StrCat(device.threads()) : ""}})
      .Set(1);
  device_ = device.kind() == "cuda" ? Device::kCuda : Device::kCpu;
  UpdateMemory();
}

void WorkerMetrics::SetBusy(bool busy) { busy_.Set(busy ? 1 : 0); }

template <typename T>
T& WorkerMetrics::Track(prometheus::Family<T>& family, const prometheus::Labels& labels) {
  T& metric = family.Add(labels);
  removers_.push_back([&family, &metric] { family.Remove(&metric); });
  return metric;
}

template <typename T, typename... Args>
T& WorkerMetrics::TrackWith(prometheus::Family<T>& family, const prometheus::Labels& labels,
                            Args&&... args) {
  T& metric = family.Add(labels, std::forward<Args>(args)...);
  removers_.push_back([&family, &metric] { family.Remove(&metric); });
  return metric;
}

StepObserver* WorkerMetrics::BeginJob(const JobMetricsInfo& info) {
  for (auto& remove : removers_) remove();
  removers_.clear();
  actions_now_.clear();
  bytes_now_.clear();
  loss_now_ = nullptr;
  val_loss_now_ = nullptr;
  grad_norm_now_ = nullptr;
  job_ = info;
  const prometheus::Labels rank = {{"job_id", info.job_id}, {"rank", absl::StrCat(info.rank)}};
  steps_now_ = &Track(steps_, rank);
  step_seconds_now_ = &TrackWith(step_seconds_, rank, StepSecondsBuckets());
  bubble_now_ = &Track(bubble_, rank);
  inflight_now_ = &Track(inflight_, rank);
  inflight_peak_now_ = &Track(inflight_peak_, rank);
  optimizer_state_now_ = &Track(optimizer_state_, rank);
  samples_now_ = &Track(samples_, rank);
  tokens_now_ = &Track(tokens_, rank);
  learning_rate_now_ = &Track(learning_rate_, {{"job_id", info.job_id}});
  model_flops_now_ = &Track(model_flops_, rank);
  if (info.peak_flops > 0) Track(peak_flops_, rank).Set(info.peak_flops);
  checkpoint_seconds_now_ = nullptr;
  checkpoint_bytes_now_ = nullptr;
  allreduce_seconds_now_ = nullptr;
  allreduce_bytes_now_ = nullptr;
  allreduce_wait_now_ = nullptr;
  allreduce_overlap_now_ = nullptr;
  if (!info.collective.empty()) {
    const prometheus::Labels engine = {{"job_id", info.job_id},
                                       {"rank", absl::StrCat(info.rank)},
                                       {"engine", info.collective}};
    allreduce_seconds_now_ = &TrackWith(allreduce_seconds_, engine, ActionSecondsBuckets());
    allreduce_bytes_now_ = &Track(allreduce_bytes_, engine);
    allreduce_wait_now_ = &Track(allreduce_wait_, rank);
    allreduce_overlap_now_ = &Track(allreduce_overlap_, rank);
  }
  return this;
}

void WorkerMetrics::RecordCheckpoint(absl::Duration took, int64_t bytes) {
  const prometheus::Labels rank = {{"job_id", job_.job_id}, {"rank", absl::StrCat(job_.rank)}};
  if (checkpoint_seconds_now_ == nullptr) {
    checkpoint_seconds_now_ = &TrackWith(checkpoint_seconds_, rank, StepSecondsBuckets());
    checkpoint_bytes_now_ = &Track(checkpoint_bytes_, rank);
  }
  checkpoint_seconds_now_->Observe(absl::ToDoubleSeconds(took));
  checkpoint_bytes_now_->Increment(static_cast<double>(bytes));
}

prometheus::Histogram& WorkerMetrics::ActionHistogram(const std::string& stage,
                                                      const std::string& kind, bool device) {
  prometheus::Histogram*& h = actions_now_[{stage, kind, device}];
  if (h == nullptr) {
    h = &TrackWith(device ? action_device_seconds_ : action_seconds_,
                   {{"job_id", job_.job_id}, {"stage", stage}, {"kind", kind}},
                   ActionSecondsBuckets());
  }
  return *h;
}

prometheus::Counter& WorkerMetrics::Bytes(bool sent, int stage, int peer_stage,
                                          bool activation) {
  prometheus::Counter*& c = bytes_now_[{sent, stage, peer_stage, activation}];
  if (c == nullptr) {
    const auto link = job_.transport_by_stage.find(peer_stage);
    const std::string& transport =
        link != job_.transport_by_stage.end() ? link->second : job_.transport;
    c = &Track(sent ? sent_bytes_ : received_bytes_,
               {{"job_id", job_.job_id},
                {"transport", transport},
                {"stage", absl::StrCat(stage)},
                {"peer_stage", absl::StrCat(peer_stage)},
                {"kind", activation ? "activation" : "gradient"}});
  }
  return *c;
}

void WorkerMetrics::OnAction(const ActionTiming&, int inflight) {
  if (inflight_now_ != nullptr) inflight_now_->Set(inflight);
}

void WorkerMetrics::RecordStep(const RankStepResult& step, std::optional<float> loss) {
  UpdateMemory();
  if (steps_now_ == nullptr) return;  // no BeginJob
  // The optimizer update belongs to the rank, not to one stage: label it with all of them.
  const std::string rank_stages = absl::StrJoin(job_.stages, "+");
  int64_t compute_ns = 0;
  for (const ActionTiming& t : step.timeline) {
    const int64_t ns = t.end_ns - t.start_ns;
    const Action& a = t.action;
    // On a GPU the wall time of a compute action is its issue time; its device time is
    // what it computed.
    if (IsCompute(a.kind) || a.kind == ActionKind::kStep) {
      compute_ns += t.device_ns >= 0 ? t.device_ns : ns;
    }
    const std::string stage =
        a.kind == ActionKind::kStep ? rank_stages : absl::StrCat(a.stage);
    ActionHistogram(stage, NamesOf(a.kind).metric).Observe(Seconds(ns));
    if (t.device_ns >= 0) {
      ActionHistogram(stage, NamesOf(a.kind).metric, /*device=*/true).Observe(Seconds(t.device_ns));
    }
    if (IsComm(a.kind)) {
      const bool sent = a.kind == ActionKind::kSendF || a.kind == ActionKind::kSendB;
      Bytes(sent, a.stage, PeerStage(a), CarriesActivation(a.kind)).Increment(t.bytes);
    }
  }
  for (const ActionTiming& t : step.send_waits) {
    ActionHistogram(absl::StrCat(t.action.stage), "send_wait")
        .Observe(Seconds(t.end_ns - t.start_ns));
  }
  steps_now_->Increment();
  step_seconds_now_->Observe(Seconds(step.end_ns));
  bubble_now_->Set(step.end_ns > 0
                       ? std::max(0.0, 1.0 - static_cast<double>(compute_ns) /
                                                 static_cast<double>(step.end_ns))
                       : 0.0);
  inflight_peak_now_->Set(step.peak_inflight);
  optimizer_state_now_->Set(static_cast<double>(step.optimizer_state_bytes));
  samples_now_->Increment(static_cast<double>(job_.samples_per_step));
  model_flops_now_->Increment(job_.model_flops_per_step);
  learning_rate_now_->Set(step.learning_rate);
  if (step.grad_norm.has_value()) {
    if (grad_norm_now_ == nullptr) grad_norm_now_ = &Track(grad_norm_, {{"job_id", job_.job_id}});
    grad_norm_now_->Set(*step.grad_norm);
  }
  if (step.val_loss.has_value()) {
    if (val_loss_now_ == nullptr) val_loss_now_ = &Track(val_loss_, {{"job_id", job_.job_id}});
    val_loss_now_->Set(*step.val_loss);
  }
  tokens_now_->Increment(static_cast<double>(job_.tokens_per_step));
  if (allreduce_seconds_now_ != nullptr && !step.reductions.empty()) {
    int64_t reduce_ns = 0;
    for (const ActionTiming& t : step.reductions) {
      reduce_ns += t.end_ns - t.start_ns;
      allreduce_seconds_now_->Observe(Seconds(t.end_ns - t.start_ns));
      allreduce_bytes_now_->Increment(static_cast<double>(t.bytes));
    }
    allreduce_wait_now_->Increment(Seconds(step.reduce_wait_ns));
    allreduce_overlap_now_->Set(
        reduce_ns > 0 ? std::clamp(1.0 - static_cast<double>(step.reduce_wait_ns) /
                                             static_cast<double>(reduce_ns),
                                   0.0, 1.0)
                      : 1.0);
  }
  if (loss.has_value()) {
    if (loss_now_ == nullptr) loss_now_ = &Track(loss_, {{"job_id", job_.job_id}});
    loss_now_->Set(*loss);
  }
}

}  // namespace baton
