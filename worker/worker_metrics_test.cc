#include "worker/worker_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "prometheus/text_serializer.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ActionTiming At(const std::string& action, int64_t start, int64_t end, int64_t bytes = 0) {
  absl::StatusOr<Action> a = Action::Parse(action);
  EXPECT_TRUE(a.ok()) << action;
  return ActionTiming{*a, start, end, bytes};
}

// Rank 1 of 3 stages: 1 us of forward, 1 us of backward, 0.5 us optimizer in a 5 us step.
RankStepResult Step() {
  RankStepResult r;
  r.rank = 1;
  r.timeline = {At("1RECV_F0", 0, 1000, 256), At("1F0", 1000, 2000),
                At("1SEND_F0", 2000, 2100, 256), At("1RECV_B0", 2100, 3000, 256),
                At("1B0", 3000, 4000), At("1SEND_B0", 4000, 4100, 256),
                At("STEP", 4100, 4600)};
  r.send_waits = {At("1SEND_B0", 4600, 5000)};
  r.end_ns = 5000;
  r.peak_inflight = 1;
  r.optimizer_state_bytes = 4096;
  return r;
}

std::string Text(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

JobMetricsInfo Info(const std::string& job) {
  JobMetricsInfo info;
  info.job_id = job;
  info.rank = 1;
  info.stages = {1};
  info.transport = "grpc";
  info.samples_per_step = 8;
  info.tokens_per_step = 256;
  return info;
}

// Reads `metric{labels}`'s value from the text format; -1 when absent.
double Value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(WorkerMetrics, DeviceMemoryFollowsTheAllocator) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  baton::v1::DeviceInfo device;
  device.set_kind("cpu");
  m.SetDevice("w-1", device);
  const double before = Value(Text(registry), "baton_worker_device_memory_bytes{state=\"in_use\"}");
  ASSERT_GE(before, 0);
  Tensor big = Tensor::Empty({1 << 20});  // 4 MiB held while the step is recorded
  m.BeginJob(Info("job-000001"));
  m.RecordStep(Step(), std::nullopt);
  const std::string text = Text(registry);
  EXPECT_GE(Value(text, "baton_worker_device_memory_bytes{state=\"in_use\"}"), before + (4 << 20));
  EXPECT_GE(Value(text, "baton_worker_device_memory_bytes{state=\"peak\"}"), before + (4 << 20));
  EXPECT_GE(Value(text, "baton_worker_device_memory_bytes{state=\"cached\"}"), 0);
}

TEST(WorkerMetrics, RecordsAStepAsTheContractSays) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  baton::v1::DeviceInfo device;
  device.set_kind("cpu");
  device.set_name("test cpu");
  device.set_kernels("OpenBLAS 0.3.21, SkylakeX kernels (chosen by the library)");
  device.set_threads(2);
  m.SetDevice("w-1", device);
  m.SetBusy(true);
  StepObserver* observer = m.BeginJob(Info("job-000001"));
  ASSERT_NE(observer, nullptr);
  observer->OnAction(At("1F0", 0, 1), 3);
  EXPECT_THAT(Text(registry),
              HasSubstr("baton_worker_inflight_activations{job_id=\"job-000001\",rank=\"1\"} 3"));
  m.RecordStep(Step(), 2.5f);
  m.RecordStep(Step(), std::nullopt);
  const std::string t = Text(registry);
  EXPECT_THAT(t, HasSubstr("baton_worker_device_info{kernels=\"OpenBLAS 0.3.21, SkylakeX kernels "
                           "(chosen by the library)\",kind=\"cpu\",name=\"test "
                           "cpu\",threads=\"2\",uuid=\"\",worker_id=\"w-1\"} 1"));
  EXPECT_THAT(t, HasSubstr("baton_worker_busy 1"));
  EXPECT_THAT(t, HasSubstr("baton_worker_steps_total{job_id=\"job-000001\",rank=\"1\"} 2"));
  EXPECT_THAT(t, HasSubstr("baton_worker_step_duration_seconds_count{job_id=\"job-000001\",rank=\"1\"} 2"));
  EXPECT_THAT(t, HasSubstr("baton_worker_step_duration_seconds_sum{job_id=\"job-000001\",rank=\"1\"} 1e-05"));
  // Compute is F + B + optimizer = 2.5 us of 5 us.
  EXPECT_THAT(t, HasSubstr("baton_worker_bubble_ratio{job_id=\"job-000001\",rank=\"1\"} 0.5"));
  EXPECT_THAT(t, HasSubstr("baton_worker_inflight_activations_peak{job_id=\"job-000001\",rank=\"1\"} 1"));
  EXPECT_THAT(
      t, HasSubstr("baton_worker_optimizer_state_bytes{job_id=\"job-000001\",rank=\"1\"} 4096"));
  EXPECT_THAT(t, HasSubstr("baton_worker_samples_total{job_id=\"job-000001\",rank=\"1\"} 16"));
  EXPECT_THAT(t, HasSubstr("baton_worker_tokens_total{job_id=\"job-000001\",rank=\"1\"} 512"));
  EXPECT_THAT(t, HasSubstr("baton_worker_loss{job_id=\"job-000001\"} 2.5"));
  EXPECT_THAT(t, HasSubstr("baton_worker_sent_bytes_total{job_id=\"job-000001\",kind=\"activation\","
                           "peer_stage=\"2\",stage=\"1\",transport=\"grpc\"} 512"));
  EXPECT_THAT(t, HasSubstr("baton_worker_sent_bytes_total{job_id=\"job-000001\",kind=\"gradient\","
                           "peer_stage=\"0\",stage=\"1\",transport=\"grpc\"} 512"));
  EXPECT_THAT(t, HasSubstr("baton_worker_received_bytes_total{job_id=\"job-000001\",kind=\"activation\","
                           "peer_stage=\"0\",stage=\"1\",transport=\"grpc\"} 512"));
  EXPECT_THAT(t, HasSubstr("baton_worker_received_bytes_total{job_id=\"job-000001\",kind=\"gradient\","
                           "peer_stage=\"2\",stage=\"1\",transport=\"grpc\"} 512"));
  for (const char* kind : {"F", "B", "send", "recv_wait", "optimizer", "send_wait"}) {
    EXPECT_THAT(t, HasSubstr(absl::StrCat("baton_worker_action_duration_seconds_count{job_id=\"job-000001\",kind=\"",
                                          kind, "\",stage=\"1\"} ")))
        << kind;
  }
  EXPECT_THAT(t, HasSubstr("baton_worker_action_duration_seconds_count{job_id=\"job-000001\",kind=\"recv_wait\",stage=\"1\"} 4"));
  // No split backward in this clock: no empty I and W series.
  EXPECT_THAT(t, Not(HasSubstr("kind=\"I\"")));
  EXPECT_THAT(t, Not(HasSubstr("kind=\"W\"")));
  // A CPU rank has no device times.
  EXPECT_THAT(t, Not(HasSubstr("baton_worker_action_device_seconds_count")));
}

// A data-parallel rank: each all-reduce's time and bytes, the optimizer's wait for them, and
// the share hidden under the clock; a rank without replicas exports none of these.
TEST(WorkerMetrics, DataParallelRanksExportTheirAllReduces) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  JobMetricsInfo info = Info("job-000002");
  info.collective = "gloo";
  m.BeginJob(info);
  RankStepResult r = Step();
  r.reductions = {At("1REDUCE_GRAD", 3500, 4500, 1 << 20)};  // 1 us, of which STEP waited
  r.reduce_wait_ns = 250;                                      // 0.25 us: 75% hidden
  m.RecordStep(r, std::nullopt);
  m.RecordStep(r, std::nullopt);
  const std::string t = Text(registry);
  EXPECT_THAT(t, HasSubstr("baton_worker_allreduce_seconds_count{engine=\"gloo\",job_id=\"job-000002\","
                           "rank=\"1\"} 2"));
  EXPECT_THAT(t, HasSubstr("baton_worker_allreduce_seconds_sum{engine=\"gloo\",job_id=\"job-000002\","
                           "rank=\"1\"} 2e-06"));
  EXPECT_THAT(t, HasSubstr("baton_worker_allreduce_bytes_total{engine=\"gloo\",job_id=\"job-000002\","
                           "rank=\"1\"} 2097152"));
  EXPECT_NEAR(Value(t, "baton_worker_allreduce_wait_seconds_total{job_id=\"job-000002\",rank=\"1\"}"),
              5e-07, 1e-15);
  EXPECT_THAT(t, HasSubstr("baton_worker_allreduce_overlap_ratio{job_id=\"job-000002\",rank=\"1\"} 0.75"));
  m.BeginJob(Info("job-000003"));  // no replicas
  m.RecordStep(Step(), std::nullopt);
  EXPECT_THAT(Text(registry), Not(HasSubstr("job_id=\"job-000002\"")));
  EXPECT_THAT(Text(registry), Not(HasSubstr("baton_worker_allreduce_bytes_total{")));
}

// On a GPU rank the compute actions' wall times are issue times: the device times the
// executor measured are exported, and the bubble is computed from them.
TEST(WorkerMetrics, GpuRanksExportDeviceTimeAndComputeTheBubbleFromIt) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  m.BeginJob(Info("job-000001"));
  RankStepResult step = Step();
  for (ActionTiming& t : step.timeline) {
    // F and B took 2 us each on the device, the optimizer 0.5 us: 4.5 us of the 5 us step.
    if (t.action.kind == ActionKind::kForward || t.action.kind == ActionKind::kBackward) {
      t.device_ns = 2000;
    } else if (t.action.kind == ActionKind::kStep) {
      t.device_ns = 500;
    }
  }
  m.RecordStep(step, std::nullopt);
  const std::string t = Text(registry);
  EXPECT_NEAR(Value(t, "baton_worker_bubble_ratio{job_id=\"job-000001\",rank=\"1\"}"), 0.1,
              1e-12);
  EXPECT_NEAR(Value(t, "baton_worker_action_device_seconds_sum{job_id=\"job-000001\","
                       "kind=\"F\",stage=\"1\"}"),
              2e-6, 1e-15);
  EXPECT_NEAR(Value(t, "baton_worker_action_device_seconds_sum{job_id=\"job-000001\","
                       "kind=\"optimizer\",stage=\"1\"}"),
              5e-7, 1e-15);
  // Wall times are still there, and communication has no device series.
  EXPECT_NEAR(Value(t, "baton_worker_action_duration_seconds_sum{job_id=\"job-000001\","
                       "kind=\"F\",stage=\"1\"}"),
              1e-6, 1e-15);
  EXPECT_FALSE(absl::StrContains(t, "baton_worker_action_device_seconds_count{job_id=\"job-000001\","
                                    "kind=\"send\""));
}

TEST(WorkerMetrics, TheNextJobDropsThePreviousJobsSeries) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  m.BeginJob(Info("job-000001"));
  m.RecordStep(Step(), 1.0f);
  ASSERT_THAT(Text(registry), HasSubstr("job-000001"));
  m.BeginJob(Info("job-000002"));
  m.RecordStep(Step(), std::nullopt);
  const std::string t = Text(registry);
  EXPECT_THAT(t, Not(HasSubstr("job-000001")));
  EXPECT_THAT(t, HasSubstr("baton_worker_steps_total{job_id=\"job-000002\",rank=\"1\"} 1"));
  EXPECT_THAT(t, Not(HasSubstr("baton_worker_loss{")));  // not the last stage this time
}

TEST(WorkerMetrics, InterleavedRanksLabelTheOptimizerWithAllTheirStages) {
  prometheus::Registry registry;
  WorkerMetrics m(registry);
  JobMetricsInfo info = Info("job-000003");
  info.stages = {1, 3};
  m.BeginJob(info);
  m.RecordStep(Step(), std::nullopt);
  EXPECT_THAT(Text(registry), HasSubstr("kind=\"optimizer\",stage=\"1+3\""));
}

}  // namespace
}  // namespace baton
