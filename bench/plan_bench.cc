// Planning speed: generate + lower + validate (BuildSchedule), and simulate, for large
// pipelines. The bar: S=64, V=2, M=512 (131072 compute actions, ~390k after
// lowering) well under a second, with cost about linear in the number of actions (the
// *_Scaling runs fit O(N) over N = lowered actions).
//
//   ninja -C build plan_bench && build/bin/plan_bench
#include <cstdint>
#include <string>

#include "benchmark/benchmark.h"
#include "common/plan/planner.h"
#include "common/schedule/generators.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"

namespace baton {
namespace {

int64_t CountActions(const Schedule& s) {
  int64_t n = 0;
  for (const auto& clock : s.ranks) n += static_cast<int64_t>(clock.size());
  return n;
}

ScheduleOptions Options(const benchmark::State& state) {
  ScheduleOptions o;
  o.kind = static_cast<ScheduleKind>(state.range(0));
  o.num_ranks = static_cast<int>(state.range(1));
  o.virtual_stages = static_cast<int>(state.range(2));
  o.num_microbatches = static_cast<int>(state.range(3));
  return o;
}

// Generate + Lower + Validate (with its deadlock simulation).
void BM_BuildSchedule(benchmark::State& state) {
  const ScheduleOptions o = Options(state);
  int64_t actions = 0;
  for (auto _ : state) {
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.status().message()).c_str());
      return;
    }
    actions = CountActions(*s);
    benchmark::DoNotOptimize(s);
  }
  state.counters["actions"] = static_cast<double>(actions);
  state.SetItemsProcessed(state.iterations() * actions);
  state.SetComplexityN(actions);
}

// What `batonctl plan` does before rendering: build, then Simulate (validates again and
// records the timeline).
void BM_PlanAndSimulate(benchmark::State& state) {
  const ScheduleOptions o = Options(state);
  int64_t actions = 0;
  for (auto _ : state) {
    absl::StatusOr<Schedule> s = BuildSchedule(o);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.status().message()).c_str());
      return;
    }
    absl::StatusOr<SimResult> r = Simulate(*s);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    actions = CountActions(*s);
    benchmark::DoNotOptimize(r);
  }
  state.counters["actions"] = static_cast<double>(actions);
  state.SetItemsProcessed(state.iterations() * actions);
}

// Validate alone on a prebuilt clock.
void BM_Validate(benchmark::State& state) {
  absl::StatusOr<Schedule> s = BuildSchedule(Options(state));
  if (!s.ok()) {
    state.SkipWithError(std::string(s.status().message()).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(Validate(*s));
  state.SetItemsProcessed(state.iterations() * CountActions(*s));
  state.SetComplexityN(CountActions(*s));
}

constexpr int64_t kInterleaved = static_cast<int64_t>(ScheduleKind::kInterleaved1F1B);
constexpr int64_t kZbH1 = static_cast<int64_t>(ScheduleKind::kZbH1);
constexpr int64_t k1F1B = static_cast<int64_t>(ScheduleKind::k1F1B);

// The size, per generator.
BENCHMARK(BM_BuildSchedule)
    ->ArgNames({"kind", "S", "V", "M"})
    ->Args({kInterleaved, 64, 2, 512})
    ->Args({k1F1B, 64, 1, 512})
    ->Args({kZbH1, 64, 1, 512})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanAndSimulate)
    ->ArgNames({"kind", "S", "V", "M"})
    ->Args({kInterleaved, 64, 2, 512})
    ->Unit(benchmark::kMillisecond);

// Scaling in M (and so in actions) at S=64, V=2: expect O(N).
BENCHMARK(BM_BuildSchedule)
    ->Name("BM_BuildSchedule_Scaling")
    ->ArgNames({"kind", "S", "V", "M"})
    ->Args({kInterleaved, 64, 2, 64})
    ->Args({kInterleaved, 64, 2, 128})
    ->Args({kInterleaved, 64, 2, 256})
    ->Args({kInterleaved, 64, 2, 512})
    ->Args({kInterleaved, 64, 2, 1024})
    ->Complexity(benchmark::oN)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Validate)
    ->Name("BM_Validate_Scaling")
    ->ArgNames({"kind", "S", "V", "M"})
    ->Args({kInterleaved, 64, 2, 64})
    ->Args({kInterleaved, 64, 2, 128})
    ->Args({kInterleaved, 64, 2, 256})
    ->Args({kInterleaved, 64, 2, 512})
    ->Args({kInterleaved, 64, 2, 1024})
    ->Complexity(benchmark::oN)
    ->Unit(benchmark::kMillisecond);

// The auto-planner's whole search (planner.h) for a GPT of 48 blocks (46 layers, the
// embedding and the head), batch 512, on S ranks: every schedule x V x M it considers,
// built, validated and simulated. The bound: well under a second at S = 16.
PlannerInput BigGptInput(int stages) {
  baton::v1::JobSpec spec;
  auto* g = spec.mutable_model()->mutable_gpt();
  g->set_vocab_size(256);
  g->set_context(128);
  g->set_d_model(512);
  g->set_heads(8);
  g->set_layers(46);
  spec.mutable_data()->set_batch_size(512);
  spec.mutable_optimizer()->mutable_adamw()->set_learning_rate(1e-3f);
  spec.mutable_pipeline()->set_schedule(baton::v1::SCHEDULE_AUTO);
  return PlannerInputFor(spec, stages);
}

void BM_AutoPlan(benchmark::State& state) {
  const int stages = static_cast<int>(state.range(0));
  PlannerInput in = BigGptInput(stages);
  int considered = 0;
  for (auto _ : state) {
    absl::StatusOr<Plan> plan = PlanPipeline(in);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    considered = plan->considered;
    benchmark::DoNotOptimize(plan->ranked.front().step_time);
  }
  state.counters["candidates"] = considered;
}
BENCHMARK(BM_AutoPlan)->ArgName("S")->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond);

// The same under a memory budget one byte below what the least hungry candidate needs on
// its balanced split: every candidate is over it, so every one also runs the split search.
void BM_AutoPlanTightBudget(benchmark::State& state) {
  const int stages = static_cast<int>(state.range(0));
  PlannerInput in = BigGptInput(stages);
  in.keep = 1000;  // every candidate, to find the least hungry
  absl::StatusOr<Plan> free = PlanPipeline(in);
  if (!free.ok()) {
    state.SkipWithError(std::string(free.status().message()).c_str());
    return;
  }
  int64_t least = free->ranked.front().max_peak_bytes;
  for (const PlanCandidate& c : free->ranked) least = std::min(least, c.max_peak_bytes);
  in.memory_budget_bytes = least - 1;
  in.keep = 8;
  int moved = 0, fits = 0;
  for (auto _ : state) {
    absl::StatusOr<Plan> plan = PlanPipeline(in);
    fits = plan.ok() ? 1 : 0;
    moved = plan.ok() && plan->ranked.front().split_moved ? 1 : 0;
    benchmark::DoNotOptimize(plan.ok());
  }
  // Whether anything fits after the search, and whether the pick's split was moved.
  state.counters["fits"] = fits;
  state.counters["pick_moved"] = moved;
}
BENCHMARK(BM_AutoPlanTightBudget)
    ->ArgName("S")
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace baton

BENCHMARK_MAIN();
