// Does the auto-planner choose well? (docs/benchmarks.md, "The auto-planner against
// measurement".) A driver, not a timed test.
//
// For each model shape: two calibration runs (1f1b at M = --calib-m, zb-h1 at --calib-m2;
// 0 for one run only) give the measured costs of their last step (CostsFromTrace, as
// `batonctl plan --costs-from JOB1,JOB2` reads jobs); the planner ranks every candidate (schedule x V x M) with them; then every
// candidate is trained for real with LocalPipelineTrainer (S executor threads), --warmup
// steps, then --steps measured steps, in --rounds rounds over all candidates; the median of
// its round medians is reported next to the prediction, with the spread between rounds. The summary gives the pick's rank among the measured and its gap to the
// fastest measured candidate (the goal: first, or within 3%).
//
//   planner_bench [--spec=PATH] [--S=2] [--steps=5] [--warmup=2] [--calib-m=4] [--calib-m2=16]
//                 [--rounds=3]
//                 [--shapes=base,deep] [--blas-threads=1]
//
// Shapes, both from the spec (default client/examples/gpt.json): "base" as written; "deep"
// with 6 layers of half the width (more, cheaper blocks: the partition and V matter more).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/core/backend.h"
#include "common/core/blas_kernels.h"
#include "common/pipeline/local_pipeline.h"
#include "common/pipeline/step_trace.h"
#include "common/plan/measured_run.h"
#include "common/plan/planner.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"

#ifndef BATON_SOURCE_DIR
#define BATON_SOURCE_DIR "."
#endif

namespace baton {
namespace {

struct Flags {
  std::string spec = std::string(BATON_SOURCE_DIR) + "/client/examples/gpt.json";
  int stages = 2;
  int steps = 5;
  int warmup = 2;
  int calib_m = 4;
  int calib_m2 = 16;
  int rounds = 3;
  int blas_threads = 1;
  std::vector<std::string> shapes = {"base", "deep"};
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "planner_bench: %s\n", what.c_str());
  std::exit(1);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) Die("bad argument " + a);
    const std::string key = a.substr(2, eq - 2), value = a.substr(eq + 1);
    auto num = [&](int* out) {
      if (!absl::SimpleAtoi(value, out) || *out < 1) Die("--" + key + " wants a positive integer");
    };
    if (key == "spec") f.spec = value;
    else if (key == "S") num(&f.stages);
    else if (key == "steps") num(&f.steps);
    else if (key == "rounds") num(&f.rounds);
    else if (key == "warmup") num(&f.warmup);
    else if (key == "calib-m") num(&f.calib_m);
    else if (key == "calib-m2") {
      if (!absl::SimpleAtoi(value, &f.calib_m2) || f.calib_m2 < 0) Die("--calib-m2 wants an integer >= 0");
    }
    else if (key == "blas-threads") num(&f.blas_threads);
    else if (key == "shapes") f.shapes = absl::StrSplit(value, ',');
    else Die("unknown flag --" + key);
  }
  return f;
}

// Trains `spec` for warmup + steps steps; the median measured step's wall time in ms, and
// (with trace != nullptr) that median step as a JobTrace.
double Run(const baton::v1::JobSpec& spec, const Flags& f, baton::v1::JobTrace* trace,
           std::vector<BlockRange>* blocks) {
  absl::StatusOr<std::unique_ptr<LocalPipelineTrainer>> t = LocalPipelineTrainer::Create(spec);
  if (!t.ok()) Die(std::string(t.status().message()));
  std::vector<std::pair<double, baton::v1::JobTrace>> measured;
  for (int i = 0; i < f.warmup + f.steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<PipelineStepStats> s = (*t)->Step();
    const double took =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    if (!s.ok()) Die(std::string(s.status().message()));
    if (i < f.warmup) continue;
    baton::v1::JobTrace tr;
    if (trace != nullptr) {
      const Schedule& sc = (*t)->schedule();
      tr.set_job_id("calibration");
      tr.set_step(i + 1);
      tr.set_num_stages(sc.num_stages());
      tr.set_schedule(ScheduleKindName(sc.kind));
      for (int r = 0; r < sc.num_ranks; ++r) *tr.add_ranks() = RankTraceFromStep(s->ranks[r]);
    }
    measured.push_back({took, std::move(tr)});
  }
  if (blocks != nullptr) *blocks = (*t)->stage_blocks();
  std::sort(measured.begin(), measured.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const auto& median = measured[measured.size() / 2];
  if (trace != nullptr) *trace = median.second;
  return median.first;
}

void RunShape(const std::string& shape, baton::v1::JobSpec spec, const Flags& f) {
  if (shape == "deep") {
    auto* g = spec.mutable_model()->mutable_gpt();
    g->set_layers(6);
    g->set_d_model(g->d_model() / 2);
    g->set_heads(std::max(1, g->heads() / 2));
  } else if (shape != "base") {
    Die("unknown shape " + shape + " (base, deep)");
  }
  spec.set_device(baton::v1::DEVICE_KIND_CPU);
  auto* p = spec.mutable_pipeline();
  p->set_stages(f.stages);
  p->set_schedule(baton::v1::SCHEDULE_1F1B);
  p->set_virtual_stages(1);
  p->set_microbatches(f.calib_m);
  if (absl::Status st = ValidateAndDefaultJobSpec(&spec); !st.ok()) Die(std::string(st.message()));

  // Calibrate from real runs, as --costs-from does: 1f1b at --calib-m and zb-h1 at
  // --calib-m2 micro-batches (two sizes give the compute rate per micro-batch size; the
  // split run gives I and W their own rates).
  std::vector<MeasuredRun> runs;
  std::string calib;
  // The machine warms up first (the first runs of a process measure slow): one discarded
  // run of the first calibration job.
  Run(spec, f, nullptr, nullptr);
  for (const auto& [kind, m] : {std::pair{baton::v1::SCHEDULE_1F1B, f.calib_m},
                                std::pair{baton::v1::SCHEDULE_ZB_H1, f.calib_m2}}) {
    baton::v1::JobSpec c = spec;
    c.mutable_pipeline()->set_schedule(kind);
    c.mutable_pipeline()->set_microbatches(m);
    baton::v1::JobTrace trace;
    MeasuredRun run;
    const double ms = Run(c, f, &trace, &run.stage_blocks);
    absl::StatusOr<Costs> costs = CostsFromTrace(trace);
    if (!costs.ok()) Die(std::string(costs.status().message()));
    run.costs = *costs;
    run.rows = spec.data().batch_size() / m;
    run.source = absl::StrCat(trace.schedule(), " M=", m);
    absl::StrAppend(&calib, calib.empty() ? "" : ", ", run.source, " ", absl::StrFormat("%.1f", ms),
                    " ms/step");
    runs.push_back(std::move(run));
    if (f.calib_m2 == 0) break;
  }
  PlannerInput in = PlannerInputFor(spec, f.stages);
  in.schedule.reset();
  in.virtual_stages = 0;
  in.microbatches = 0;
  in.keep = 100000;
  in.measured = runs;
  absl::StatusOr<Plan> plan = PlanPipeline(in);
  if (!plan.ok()) Die(std::string(plan.status().message()));

  std::printf("\ncalibrated: %s\n", plan->calibration.c_str());
  const auto& g = spec.model().gpt();
  std::printf("\n== shape %s: gpt layers %d d_model %d heads %d context %d, batch %d, S=%d; "
              "%zu blocks; calibration: %s; compute rate %s\n",
              shape.c_str(), g.layers(), g.d_model(), g.heads(), g.context(),
              static_cast<int>(spec.data().batch_size()), f.stages, in.blocks.size(), calib.c_str(),
              DescribeEfficiency(plan->efficiency).c_str());
  struct Row {
    const PlanCandidate* c;
    double measured;  // ms
    double spread;    // (max - min) / median of the round medians
    std::vector<double> rounds;
  };
  // Every candidate once per round, the rounds one after another; each candidate's
  // measurement is the median of its round medians (a disturbance of the machine hits one
  // round of a few candidates, not one candidate's every measurement), its spread the
  // largest minus the smallest round median over that: the noise to read the ranks by.
  std::vector<Row> rows;
  for (const PlanCandidate& c : plan->ranked) rows.push_back({&c, 0, 0, {}});
  for (int round = 0; round < f.rounds; ++round) {
    for (Row& row : rows) {
      baton::v1::JobSpec s = spec;
      s.mutable_pipeline()->set_schedule(
          static_cast<baton::v1::Schedule>(ScheduleEntryOf(row.c->kind).spec_value));
      s.mutable_pipeline()->set_virtual_stages(row.c->virtual_stages);
      s.mutable_pipeline()->set_microbatches(row.c->microbatches);
      row.rounds.push_back(Run(s, f, nullptr, nullptr));
    }
  }
  double spread_sum = 0;
  for (Row& row : rows) {
    std::sort(row.rounds.begin(), row.rounds.end());
    row.measured = row.rounds[row.rounds.size() / 2];
    row.spread = (row.rounds.back() - row.rounds.front()) / row.measured;
    spread_sum += row.spread;
  }
  std::vector<double> sorted;
  for (const Row& r : rows) sorted.push_back(r.measured);
  std::sort(sorted.begin(), sorted.end());
  auto measured_rank = [&](double m) {
    return static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), m) - sorted.begin()) + 1;
  };
  std::printf("%4s  %-16s %2s %4s %10s %10s %7s %7s %8s\n", "pred", "schedule", "V", "M",
              "predicted", "measured", "spread", "error", "measured");
  std::printf("%4s  %-16s %2s %4s %10s %10s %7s %7s %8s\n", "rank", "", "", "", "ms", "ms", "",
              "", "rank");
  for (size_t k = 0; k < rows.size(); ++k) {
    const Row& r = rows[k];
    std::printf("%4zu  %-16s %2d %4d %10.1f %10.1f %6.1f%% %+6.1f%% %8d\n", k + 1,
                ScheduleKindName(r.c->kind), r.c->virtual_stages, r.c->microbatches,
                r.c->step_time, r.measured, 100 * r.spread,
                100 * (r.c->step_time / r.measured - 1), measured_rank(r.measured));
  }
  const double best = sorted.front();
  const double pick = rows.front().measured;
  // How well the predicted order matches the measured one: Spearman's rank correlation.
  double d2 = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const double d = static_cast<double>(k + 1) - measured_rank(rows[k].measured);
    d2 += d * d;
  }
  const double n = static_cast<double>(rows.size());
  std::printf("pick %s: measured rank %d of %zu, %.1f ms vs the fastest %.1f ms (%+.1f%%); "
              "mean spread between rounds %.1f%%; rank correlation predicted/measured %.2f\n",
              rows.front().c->Describe().c_str(), measured_rank(pick), rows.size(), pick, best,
              100 * (pick / best - 1), 100 * spread_sum / n, 1 - 6 * d2 / (n * (n * n - 1)));
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  baton::ChooseBlasKernels(argv);  // the kernels a worker runs (may re-execute)
  const baton::Flags f = baton::ParseFlags(argc, argv);
  baton::SetBlasThreads(f.blas_threads);
  absl::StatusOr<baton::v1::JobSpec> spec = baton::LoadJobSpecFile(f.spec);
  if (!spec.ok()) baton::Die(std::string(spec.status().message()));
  if (!spec->model().has_gpt()) baton::Die("the spec's model must be a gpt");
  for (const std::string& shape : f.shapes) baton::RunShape(shape, *spec, f);
  return 0;
}
