// How much of the gradient all-reduce hides under the pipeline's own work: a real
// data-parallel job in process (the example GPT by default, S = 2, D = 2, the Gloo engine
// over loopback TCP), and per rank, over the measured steps:
//   reduce   the time its reductions took on the communication thread (start of the first
//            to end of the last, per step),
//   waited   the time STEP waited for them (the part not hidden),
//   hidden   1 - waited / reduce.
// A driver, not a test: nothing is asserted. Prints the machine-independent facts (bytes
// reduced per step) next to the timings.
//
//   build/bin/dp_overlap_bench [--spec client/examples/gpt.json] [--steps 20]
//                              [--stages 2] [--replicas 2] [--engine gloo|inproc]
//                              [--bucket-bytes N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/core/blas_kernels.h"
#include "common/pipeline/local_pipeline.h"
#include "common/spec/spec.h"

int main(int argc, char** argv) {
  baton::ChooseBlasKernels(argv);  // the kernels a worker runs (may re-execute)
  std::string spec_path = std::string(BATON_SOURCE_DIR) + "/client/examples/gpt.json";
  int steps = 20, stages = 2, replicas = 2;
  long long bucket_bytes = 0;  // 0: the spec's (25 MiB by default)
  std::string engine = "gloo";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--spec") spec_path = value;
    else if (flag == "--steps") steps = std::max(3, std::atoi(value.c_str()));
    else if (flag == "--stages") stages = std::atoi(value.c_str());
    else if (flag == "--replicas") replicas = std::atoi(value.c_str());
    else if (flag == "--engine") engine = value;
    else if (flag == "--bucket-bytes") bucket_bytes = std::atoll(value.c_str());
    else {
      std::fprintf(stderr, "dp_overlap_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  absl::StatusOr<baton::v1::JobSpec> spec = baton::LoadJobSpecFile(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  spec->mutable_pipeline()->set_stages(stages);
  spec->mutable_pipeline()->set_data_parallel(replicas);
  spec->set_steps(steps);
  if (bucket_bytes > 0) spec->mutable_pipeline()->set_reduce_bucket_bytes(bucket_bytes);
  baton::LocalPipelineOptions opts;
  opts.engine = engine == "inproc" ? baton::LocalPipelineOptions::Engine::kInProcess
                                   : baton::LocalPipelineOptions::Engine::kGloo;
  auto t = baton::LocalPipelineTrainer::Create(*spec, opts);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    return 1;
  }
  const int ranks = stages * replicas;
  std::vector<double> reduce_ms(ranks, 0), wait_ms(ranks, 0), step_ms;
  std::vector<int64_t> bytes(ranks, 0);
  const int warmup = 2;
  for (int i = 0; i < steps; ++i) {
    auto s = (*t)->Step();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
      return 1;
    }
    if (i < warmup) continue;
    step_ms.push_back(s->seconds * 1e3);
    for (int r = 0; r < ranks; ++r) {
      const baton::RankStepResult& rr = s->ranks[r];
      if (rr.reductions.empty()) continue;
      int64_t first = rr.reductions.front().start_ns, last = 0, b = 0;
      for (const baton::ActionTiming& a : rr.reductions) {
        first = std::min(first, a.start_ns);
        last = std::max(last, a.end_ns);
        b += a.bytes;
      }
      reduce_ms[r] += (last - first) * 1e-6;
      wait_ms[r] += rr.reduce_wait_ns * 1e-6;
      bytes[r] = b;
    }
  }
  const double n = steps - warmup;
  std::sort(step_ms.begin(), step_ms.end());
  std::printf("dp_overlap_bench: %s, S=%d, D=%d, M=%d, engine %s, buckets of %lld bytes, %d "
              "measured steps; median step %.1f ms\n",
              spec_path.c_str(), stages, replicas, spec->pipeline().microbatches(),
              engine.c_str(), static_cast<long long>((*t)->spec().pipeline().reduce_bucket_bytes()),
              static_cast<int>(n), step_ms[step_ms.size() / 2]);
  std::printf("replica rank | bytes/step | reduce ms/step | waited ms/step | hidden\n");
  for (int g = 0; g < ranks; ++g) {
    const double red = reduce_ms[g] / n, wait = wait_ms[g] / n;
    std::printf("%7d %4d | %10lld | %14.2f | %14.2f | %5.1f%%\n", g / stages, g % stages,
                static_cast<long long>(bytes[g]), red, wait,
                red > 0 ? 100.0 * std::max(0.0, 1.0 - wait / red) : 0.0);
  }
  return 0;
}
