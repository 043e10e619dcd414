// batonctl plan: generate (or import), validate and simulate a pipeline schedule, without a
// cluster. See docs/schedules.md.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "baton/v1/job.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/commands.h"
#include "client/batonctl/measured_costs.h"
#include "common/core/file.h"
#include "common/core/status.h"
#include "common/plan/partition.h"
#include "common/plan/planner.h"
#include "common/schedule/generators.h"
#include "common/schedule/render.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/schedule_spec.h"
#include "common/spec/spec.h"

namespace baton::cli {
namespace {

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>([] {
  std::vector<FlagSpec> own{
      {"schedule", "s", false,
       absl::StrCat(ScheduleNames(), " (default 1f1b), or custom (with --csv)")},
      {"stages", "", false, "pipeline stages = ranks (S)"},
      {"virtual", "", false, "model chunks per rank (V; interleaved-1f1b needs >= 2)"},
      {"microbatches", "m", false, "micro-batches per step (M)"},
      {"data-parallel", "", false,
       "replicas of the pipeline (D); above 1 the clock reduces each stage's gradients "
       "(REDUCE_GRAD) after its last backward"},
      {"costs", "", false,
       "action costs, e.g. F=1,I=1,W=1 (B defaults to I+W; also SEND, RECV, STEP)"},
      {"output", "o", false, "table (default), json, svg or csv"},
      {"blocks", "", false, "the model's block count: refuses S*V above it"},
      {"file", "f", false,
       "job spec: its pipeline section gives the defaults, its model the blocks"},
      {"csv", "", false,
       "import a schedule (PyTorch's one-row-per-rank CSV) to validate and simulate"},
      {"costs-from", "", false,
       "the per-stage costs a run measured instead: a JOB id (its latest traced step, from "
       "the coordinator) or a trace file (batonctl trace -o, train-local --trace); ms. "
       "With --auto, several, comma-separated (runs of different M also measure how the "
       "compute rate depends on the micro-batch size)"},
      {"auto", "", true,
       "search schedule x V x M for -f SPEC on --workers and rank the candidates "
       "(with --costs-from: calibrated by what that run measured)"},
      {"workers", "", false, "with --auto: the workers to plan for (stages = workers / D)"},
      {"memory-gib", "", false, "with --auto: each worker's memory budget, GiB"},
      {"top", "", false, "with --auto: candidates to print (default 10)"},
      {"help", "h", true, "show this help"},
  };
  // The coordinator's flags, for --costs-from JOB (plan has its own --output and --help).
  for (FlagSpec& f : WithClusterFlags({})) {
    if (f.name != "output" && f.name != "help") own.push_back(f);
  }
  return own;
  }());
  return *flags;
}


constexpr char kUsage[] =
    "usage: batonctl plan --schedule 1f1b --stages 4 --microbatches 8 [--virtual V]\n"
    "                     [--data-parallel D]\n"
    "                     [--costs F=1,I=1,W=1] [--output table|json|svg|csv] [--blocks N]\n"
    "       batonctl plan -f SPEC.json [flags overriding its pipeline section]\n"
    "       batonctl plan --schedule custom --csv FILE [--costs ...] [--output ...]\n"
    "       batonctl plan -f SPEC.json --costs-from JOB|TRACE.json\n"
    "       batonctl plan --auto -f SPEC.json --workers N [--memory-gib G]\n"
    "                     [--costs-from JOB|TRACE.json[,JOB2...]] [--output table|json]\n"
    "\n"
    "Builds the schedule, lowers it (inserts sends and receives), validates it (every\n"
    "micro-batch's forward and backward, send/receive order per rank pair, no deadlock) and\n"
    "simulates it. A refused schedule exits 1 with the rank x position grid and the offending\n"
    "action marked >like this<.\n"
    "\n"
    "--auto searches every schedule, V and M (a divisor of the batch per replica) that can\n"
    "run the spec's model on the workers, simulates each on the FLOP-balanced block split\n"
    "(or, when that misses --memory-gib, the least-imbalanced split that fits: marked *),\n"
    "and prints the fastest first with predicted step time, bubble, peak memory per rank\n"
    "and why each lost to the pick (docs/schedules.md, \"The auto-planner\"). Flags\n"
    "--schedule, --virtual and --microbatches fix those choices.\n\n";

// Per stage, the spec's blocks and parameters; per rank, the planner's peak memory
// (parameters, gradients, optimizer state and the activations the schedule keeps in flight).
// What a spec's stages hold and each rank's peak memory, as the planner counts them for
// the partition this schedule runs.
struct Footprint {
  std::string model;  // DescribeModel
  struct Stage {
    std::vector<std::string> blocks;  // names, in order
    int64_t parameters = 0;
  };
  std::vector<Stage> stages;
  std::vector<int64_t> peak_bytes;  // per rank: weights, gradients, optimizer state, activations
  // With data-parallel replicas (D > 1): the same with and without optimizer.shard.
  int replicas = 1;
  std::vector<int64_t> peak_bytes_sharded, peak_bytes_unsharded;
};

// nullopt when the planner cannot place the spec on this schedule (or the spec leaves the
// schedule to it: then there is no one partition to show).
std::optional<Footprint> FootprintOf(baton::v1::JobSpec spec, const Schedule& schedule) {
  baton::v1::PipelineSpec* p = spec.mutable_pipeline();
  p->set_stages(schedule.num_ranks);
  p->set_virtual_stages(schedule.virtual_stages);
  p->set_microbatches(schedule.num_microbatches);
  if (schedule.kind != ScheduleKind::kCustom && p->schedule() == baton::v1::SCHEDULE_AUTO) {
    return std::nullopt;
  }
  PlannerInput in = PlannerInputFor(spec, schedule.num_ranks);
  if (schedule.kind != ScheduleKind::kCustom) in.schedule = schedule.kind;
  in.keep = 1;
  absl::StatusOr<baton::Plan> plan = PlanPipeline(in);
  if (!plan.ok() || plan->ranked.empty()) return std::nullopt;
  const PlanCandidate& pick = plan->ranked[0];
  Footprint f;
  f.model = DescribeModel(spec.model());
  for (const BlockRange& r : pick.stage_blocks) {
    Footprint::Stage& stage = f.stages.emplace_back();
    for (int b = r.first; b < r.last; ++b) {
      stage.blocks.push_back(in.blocks[b].name);
      stage.parameters += in.blocks[b].parameters;
    }
  }
  f.peak_bytes = pick.peak_bytes;
  f.replicas = in.data_parallel;
  if (in.data_parallel > 1) {
    // The spec's own setting is the pick's; the other is planned on the same choices.
    (in.shard_optimizer ? f.peak_bytes_sharded : f.peak_bytes_unsharded) = pick.peak_bytes;
    PlannerInput other = in;
    other.shard_optimizer = !in.shard_optimizer;
    other.schedule = pick.kind;
    other.virtual_stages = pick.virtual_stages;
    other.microbatches = pick.microbatches;
    absl::StatusOr<baton::Plan> p2 = PlanPipeline(other);
    if (p2.ok() && !p2->ranked.empty()) {
      (other.shard_optimizer ? f.peak_bytes_sharded : f.peak_bytes_unsharded) =
          p2->ranked[0].peak_bytes;
    }
  }
  return f;
}

void PrintFootprint(const Footprint& f) {
  std::printf("%s\n", f.model.c_str());
  for (size_t s = 0; s < f.stages.size(); ++s) {
    const std::vector<std::string>& b = f.stages[s].blocks;
    const std::string blocks =
        b.size() == 1 ? b[0]
                      : absl::StrCat(b.front(), " .. ", b.back(), " (", b.size(), " blocks)");
    std::printf("stage %zu: %s, %.2fM parameters\n", s, blocks.c_str(),
                f.stages[s].parameters / 1e6);
  }
  for (size_t r = 0; r < f.peak_bytes.size(); ++r) {
    std::printf(
        "rank %zu: peak memory %s (weights, gradients, optimizer state, activations "
        "in flight)\n",
        r, HumanBytes(static_cast<double>(f.peak_bytes[r])).c_str());
    if (r < f.peak_bytes_sharded.size() && r < f.peak_bytes_unsharded.size()) {
      std::printf("  %d replicas: %s with the optimizer sharded (optimizer.shard), %s without\n",
                  f.replicas, HumanBytes(static_cast<double>(f.peak_bytes_sharded[r])).c_str(),
                  HumanBytes(static_cast<double>(f.peak_bytes_unsharded[r])).c_str());
    }
  }
}

std::string Quoted(absl::string_view s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// The footprint as a JSON object: {"model", "stages": [{"stage", "blocks", "parameters"}],
// "ranks": [{"rank", "peak_bytes"}]}; with replicas each rank also has
// "peak_bytes_sharded" and "peak_bytes_unsharded" (with and without optimizer.shard).
std::string FootprintJson(const Footprint& f) {
  std::string out = absl::StrCat("{\"model\": ", Quoted(f.model), ", \"stages\": [");
  for (size_t s = 0; s < f.stages.size(); ++s) {
    std::vector<std::string> names;
    for (const std::string& b : f.stages[s].blocks) names.push_back(Quoted(b));
    absl::StrAppend(&out, s ? ",\n    " : "\n    ", "{\"stage\": ", s, ", \"blocks\": [",
                    absl::StrJoin(names, ", "), "], \"parameters\": ", f.stages[s].parameters, "}");
  }
  out += "],\n   \"ranks\": [";
  for (size_t r = 0; r < f.peak_bytes.size(); ++r) {
    absl::StrAppend(&out, r ? ", " : "", "{\"rank\": ", r, ", \"peak_bytes\": ", f.peak_bytes[r]);
    if (r < f.peak_bytes_sharded.size() && r < f.peak_bytes_unsharded.size()) {
      absl::StrAppend(&out, ", \"peak_bytes_sharded\": ", f.peak_bytes_sharded[r],
                      ", \"peak_bytes_unsharded\": ", f.peak_bytes_unsharded[r]);
    }
    out += "}";
  }
  return out + "]}";
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "batonctl plan: %s\n", what.c_str());
  return 1;
}

// --costs-from: a trace file if one is there, else a job id asked of the coordinator (then
// *job gets the job too: its partition and micro-batch size, for --auto).
absl::Status LoadTrace(const Args& args, const std::string& from, baton::v1::JobTrace* trace,
                       std::optional<baton::v1::Job>* job) {
  if (std::ifstream probe(from); probe.good()) {
    absl::StatusOr<std::string> text = ReadFile(from, {.what = "trace"});
    if (!text.ok()) return text.status();
    BATON_ASSIGN_OR_RETURN(*trace, JobTraceFromChromeJson(*text, from));
    return absl::OkStatus();
  }
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<ClusterClient> client,
                         ClusterClient::Create("plan", args, absl::Seconds(10),
                                               /*output_is_format=*/false));
  auto rpc_error = [&](const grpc::Status& st) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("--costs-from ", from, ": ", st.error_message()));
  };
  baton::v1::GetJobTraceRequest req;
  req.set_job_id(from);
  std::unique_ptr<grpc::ClientContext> ctx = client->Context();
  if (const grpc::Status st = client->stub().GetJobTrace(ctx.get(), req, trace); !st.ok()) {
    return rpc_error(st);
  }
  baton::v1::GetJobRequest get;
  get.set_job_id(from);
  baton::v1::Job j;
  ctx = client->Context();
  if (const grpc::Status st = client->stub().GetJob(ctx.get(), get, &j); !st.ok()) {
    return rpc_error(st);
  }
  *job = std::move(j);
  return absl::OkStatus();
}

std::string TraceSource(const baton::v1::JobTrace& trace, const std::string& from) {
  return absl::StrCat(trace.job_id().empty() ? from : trace.job_id(), " step ", trace.step(),
                      " (", trace.schedule(), ", ", trace.num_stages(), " stages)");
}

absl::StatusOr<Costs> MeasuredCosts(const Args& args, std::string* source) {
  baton::v1::JobTrace trace;
  std::optional<baton::v1::Job> job;
  BATON_RETURN_IF_ERROR(LoadTrace(args, args.Get("costs-from"), &trace, &job));
  *source = TraceSource(trace, args.Get("costs-from"));
  return CostsFromTrace(trace);
}

// An int flag within [lo, hi] (the generators refuse values below 1 with their own message,
// so lo may be below that).
absl::Status IntFlag(const Args& args, const std::string& name, int64_t lo, int64_t hi, int* out) {
  absl::StatusOr<int64_t> v = args.GetInt(name, *out);
  if (!v.ok()) return v.status();
  if (*v < lo || *v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", lo, ", ", hi, "], got ", *v));
  }
  *out = static_cast<int>(*v);
  return absl::OkStatus();
}


// batonctl plan --auto: the planner's ranking for -f SPEC on --workers.
int PlanAuto(const Args& args, const std::string& output) {
  if (output != "table" && output != "json") return Fail("--auto prints a table or json");
  for (const char* flag : {"csv", "costs", "blocks"}) {
    if (args.Has(flag)) return Fail(absl::StrCat("--", flag, " does not apply to --auto"));
  }
  if (!args.Has("file")) return Fail("--auto needs -f SPEC.json: the model and batch to plan for");
  const std::string path = args.Get("file");
  absl::StatusOr<baton::v1::JobSpec> spec = LoadJobSpecFile(path);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  if (const absl::Status st = ValidateAndDefaultJobSpec(&*spec); !st.ok()) {
    return Fail(absl::StrCat(path, ": ", st.message()));
  }
  baton::v1::PipelineSpec* p = spec->mutable_pipeline();
  int data_parallel = p->data_parallel();
  if (const absl::Status st = IntFlag(args, "data-parallel", 1, 1024, &data_parallel); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  p->set_data_parallel(data_parallel);
  int stages = p->stages();
  if (args.Has("workers") && args.Has("stages")) {
    return Fail("--workers and --stages both give the stages: pick one");
  }
  if (args.Has("workers")) {
    int workers = 0;
    if (const absl::Status st = IntFlag(args, "workers", 1, 1 << 20, &workers); !st.ok()) {
      return Fail(std::string(st.message()));
    }
    if (workers % data_parallel != 0) {
      return Fail(absl::StrCat("--workers ", workers, " does not split into ", data_parallel,
                               " data-parallel replicas (pipeline.data_parallel)"));
    }
    stages = workers / data_parallel;
  } else if (const absl::Status st = IntFlag(args, "stages", 1, 1 << 20, &stages); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  // What the planner may choose: everything but what flags (or an auto spec) fix.
  const bool spec_auto = p->schedule() == baton::v1::SCHEDULE_AUTO;
  PlannerInput in = PlannerInputFor(*spec, stages);
  if (!spec_auto) {
    in.schedule.reset();
    in.virtual_stages = 0;
    in.microbatches = 0;
  }
  if (args.Has("schedule")) {
    absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(args.Get("schedule"));
    if (!kind.ok()) return Fail(std::string(kind.status().message()));
    if (*kind == ScheduleKind::kCustom) return Fail("--auto plans generated schedules, not custom");
    in.schedule = *kind;
  }
  for (const auto& [flag, field] : {std::pair<const char*, int*>{"virtual", &in.virtual_stages},
                                    {"microbatches", &in.microbatches}}) {
    if (!args.Has(flag)) continue;
    if (const absl::Status st = IntFlag(args, flag, 1, 1 << 20, field); !st.ok()) {
      return Fail(std::string(st.message()));
    }
  }
  if (args.Has("memory-gib")) {
    double gib = 0;
    if (!absl::SimpleAtod(args.Get("memory-gib"), &gib) || !std::isfinite(gib) || gib <= 0) {
      return Fail(absl::StrCat("--memory-gib must be a positive number of GiB, got '",
                               args.Get("memory-gib"), "'"));
    }
    in.memory_budget_bytes = static_cast<int64_t>(gib * double{1 << 30});
  }
  int top = 10;
  if (const absl::Status st = IntFlag(args, "top", 1, 10000, &top); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  in.keep = top;
  // --costs-from: one run or several, comma-separated (different micro-batch sizes let the
  // planner see how the compute rate depends on the size).
  for (absl::string_view from : absl::StrSplit(args.Get("costs-from"), ',', absl::SkipEmpty())) {
    baton::v1::JobTrace trace;
    std::optional<baton::v1::Job> job;
    if (const absl::Status st = LoadTrace(args, std::string(from), &trace, &job); !st.ok()) {
      return Fail(std::string(st.message()));
    }
    absl::StatusOr<MeasuredRun> run;
    if (job.has_value()) {
      run = MeasuredRunFromJob(*job, trace);
    } else {
      // A trace file says nothing of its run's layout: it is taken to be this spec's
      // pipeline as written, on the trace's stages.
      const baton::v1::PipelineSpec& sp = spec->pipeline();
      if (spec_auto && sp.microbatches() == 0) {
        return Fail(absl::StrCat("--costs-from ", from,
                                 ": a trace file does not say its micro-batch size; give the "
                                 "traced run's pipeline.microbatches in ", path));
      }
      MeasuredRun m;
      absl::StatusOr<Costs> costs = CostsFromTrace(trace);
      if (!costs.ok()) return Fail(std::string(costs.status().message()));
      m.costs = *std::move(costs);
      absl::StatusOr<std::vector<BlockRange>> part =
          PartitionBlocks(in.blocks, trace.num_stages());
      if (!part.ok()) return Fail(std::string(part.status().message()));
      m.stage_blocks = *std::move(part);
      m.rows = spec->data().batch_size() /
               (static_cast<int64_t>(sp.data_parallel()) * std::max(1, sp.microbatches()));
      m.source = TraceSource(trace, std::string(from));
      run = std::move(m);
    }
    if (!run.ok()) return Fail(std::string(run.status().message()));
    in.measured.push_back(*std::move(run));
  }
  absl::StatusOr<baton::Plan> plan = PlanPipeline(in);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));

  auto time = [&](double t) {
    return plan->measured ? absl::StrFormat("%.1f ms", t) : absl::StrFormat("%.4g", t);
  };
  auto blocks = [](const PlanCandidate& c) {
    std::vector<std::string> out;
    for (const BlockRange& r : c.stage_blocks) out.push_back(absl::StrCat(r.first, "-", r.last - 1));
    return absl::StrJoin(out, " ");
  };
  if (output == "json") {
    std::string out = absl::StrFormat(
        "{\"stages\": %d, \"data_parallel\": %d, \"measured\": %s, \"cost_source\": \"%s\", "
        "\"considered\": %d, \"over_budget\": %d, \"candidates\": [",
        stages, data_parallel, plan->measured ? "true" : "false",
        absl::StrReplaceAll(plan->cost_source, {{"\"", "'"}}), plan->considered,
        plan->over_budget);
    for (size_t k = 0; k < plan->ranked.size(); ++k) {
      const PlanCandidate& c = plan->ranked[k];
      absl::StrAppendFormat(
          &out,
          "%s\n  {\"rank\": %d, \"schedule\": \"%s\", \"virtual_stages\": %d, "
          "\"microbatches\": %d, \"step_time\": %.6g, \"bubble\": %.6g, \"busiest\": %.6g, "
          "\"peak_bytes\": %d, \"fits\": %s, \"stage_blocks\": \"%s\", \"split_moved\": %s, "
          "\"lost\": \"%s\"}",
          k == 0 ? "" : ",", k + 1, ScheduleKindName(c.kind), c.virtual_stages, c.microbatches,
          c.step_time, c.bubble, c.busiest, c.max_peak_bytes, c.fits ? "true" : "false",
          blocks(c), c.split_moved ? "true" : "false", c.lost);
    }
    absl::StrAppend(&out, "\n]}\n");
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  std::printf("auto-plan: %s, %d stage%s x %d replica%s, batch %lld, %zu blocks; costs: %s\n",
              path.c_str(), stages, stages == 1 ? "" : "s", data_parallel,
              data_parallel == 1 ? "" : "s", static_cast<long long>(spec->data().batch_size()),
              in.blocks.size(), plan->cost_source.c_str());
  if (in.memory_budget_bytes > 0) {
    std::printf("memory budget: %s per worker\n", HumanBytes(in.memory_budget_bytes).c_str());
  }
  std::printf("\n%4s  %-16s %2s %5s %12s %7s %11s  %s\n", "#", "schedule", "V", "M",
              plan->measured ? "step" : "step (FLOPs)", "bubble", "peak/rank", "why not the pick");
  for (size_t k = 0; k < plan->ranked.size(); ++k) {
    const PlanCandidate& c = plan->ranked[k];
    std::printf("%4zu  %-16s %2d %5d %12s %7.3f %11s  %s\n", k + 1,
                absl::StrCat(ScheduleKindName(c.kind), c.split_moved ? "*" : "").c_str(),
                c.virtual_stages, c.microbatches, time(c.step_time).c_str(), c.bubble,
                HumanBytes(c.max_peak_bytes).c_str(), k == 0 ? "(the pick)" : c.lost.c_str());
  }
  const PlanCandidate& pick = plan->ranked.front();
  if (plan->measured) {
    std::printf("compute rate by micro-batch size: %s%s\n",
                DescribeEfficiency(plan->efficiency).c_str(),
                plan->efficiency.size() < 2
                    ? " (one size measured: give runs of different M to see smaller ones slow)"
                    : "");
  }
  std::printf("\n%d candidates considered", plan->considered);
  if (plan->over_budget > 0) std::printf(", %d over the memory budget", plan->over_budget);
  if (plan->considered > static_cast<int>(plan->ranked.size())) {
    std::printf("; %zu shown (--top)", plan->ranked.size());
  }
  std::printf(".\n");
  for (const PlanCandidate& c : plan->ranked) {
    if (!c.split_moved) continue;
    std::printf("* blocks moved off the rank that needed the most, to fit the budget\n");
    break;
  }
  std::printf("the pick's blocks per stage: %s\n", blocks(pick).c_str());
  std::string extra;
  if (pick.virtual_stages > 1 && ScheduleEntryOf(pick.kind).placement == ChunkPlacement::kLooped) {
    absl::StrAppend(&extra, " --virtual ", pick.virtual_stages);
  }
  if (pick.split_moved) {
    absl::StrAppend(&extra, " --partition ", absl::StrJoin(PartitionSizes(pick.stage_blocks), ","));
  }
  std::printf("to run it: batonctl submit -f %s --schedule %s --stages %d --microbatches %d%s\n",
              path.c_str(), ScheduleKindName(pick.kind), stages, pick.microbatches,
              extra.c_str());
  return 0;
}

}  // namespace

int Plan(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(argv, Flags());
  if (!args.ok()) return Fail(std::string(args.status().message()));
  if (args->Has("help")) {
    std::printf("%s%s", kUsage, FlagHelp(Flags()).c_str());
    return 0;
  }
  if (!args->positional().empty()) {
    return Fail("unexpected argument '" + args->positional()[0] + "'");
  }
  const std::string output = args->Get("output", "table");
  if (output != "table" && output != "json" && output != "svg" && output != "csv") {
    return Fail("--output must be table, json, svg or csv, got '" + output + "'");
  }
  if (args->Has("auto")) return PlanAuto(*args, output);
  for (const char* flag : {"workers", "memory-gib", "top"}) {
    if (args->Has(flag)) return Fail(absl::StrCat("--", flag, " needs --auto"));
  }
  if (args->Has("costs") && args->Has("costs-from")) {
    return Fail("--costs and --costs-from both give the costs: pick one");
  }
  std::string measured_from;
  absl::StatusOr<Costs> costs = args->Has("costs-from") ? MeasuredCosts(*args, &measured_from)
                                                        : ParseCosts(args->Get("costs", ""));
  if (!costs.ok()) return Fail(std::string(costs.status().message()));

  // Defaults: the spec's pipeline section, if any; flags override.
  ScheduleOptions o;
  o.kind = ScheduleKind::k1F1B;
  int data_parallel = 1;
  bool tied = false;  // the spec's model ties its embeddings: the clock sums them
  std::optional<baton::v1::JobSpec> file_spec;  // -f, validated: its stages are described
  bool have_stages = false;
  bool have_microbatches = false;
  if (args->Has("file")) {
    const std::string path = args->Get("file");
    absl::StatusOr<baton::v1::JobSpec> spec = LoadJobSpecFile(path);
    if (!spec.ok()) return Fail(std::string(spec.status().message()));
    const baton::v1::PipelineSpec& p = spec->pipeline();
    absl::StatusOr<const ScheduleEntry*> entry =
        ScheduleEntryForSpecValue(static_cast<int>(p.schedule()));
    if (!entry.ok()) return Fail(absl::StrCat(path, ": ", entry.status().message()));
    o.kind = (*entry)->kind;
    o.num_ranks = p.stages() == 0 ? 1 : p.stages();
    o.virtual_stages = p.virtual_stages() == 0 ? 1 : p.virtual_stages();
    o.num_microbatches = p.microbatches() == 0 ? 1 : p.microbatches();
    data_parallel = p.data_parallel() == 0 ? 1 : p.data_parallel();
    o.num_blocks = ModelBlockCount(spec->model());
    if (o.num_blocks == 0)
      return Fail(path + ": the spec's model has no architecture (mlp, gpt or llama)");
    const std::optional<TokenModel> token_model = TokenModelOf(spec->model());
    tied = token_model && token_model->tie_embeddings;
    baton::v1::JobSpec valid = *spec;
    if (ValidateAndDefaultJobSpec(&valid).ok()) file_spec = std::move(valid);
    have_stages = have_microbatches = true;
  }
  if (args->Has("blocks")) {
    absl::StatusOr<int64_t> blocks = args->GetInt("blocks", 0);
    if (!blocks.ok()) return Fail(std::string(blocks.status().message()));
    if (*blocks < 1) return Fail(absl::StrCat("--blocks must be at least 1, got ", *blocks));
    o.num_blocks = *blocks;
  }
  if (args->Has("schedule")) {
    absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(args->Get("schedule"));
    if (!kind.ok()) return Fail(std::string(kind.status().message()));
    o.kind = *kind;
  } else if (args->Has("csv")) {
    o.kind = ScheduleKind::kCustom;
  }
  for (const auto& [flag, field] : {std::pair<const char*, int*>{"stages", &o.num_ranks},
                                    {"virtual", &o.virtual_stages},
                                    {"microbatches", &o.num_microbatches}}) {
    const absl::Status st = IntFlag(*args, flag, -1'000'000'000, 1'000'000'000, field);
    if (!st.ok()) return Fail(std::string(st.message()));
  }
  if (const absl::Status st = IntFlag(*args, "data-parallel", 1, 1024, &data_parallel);
      !st.ok()) {
    return Fail(std::string(st.message()));
  }
  have_stages = have_stages || args->Has("stages");
  have_microbatches = have_microbatches || args->Has("microbatches");

  Schedule schedule;
  if (o.kind == ScheduleKind::kCustom) {
    if (!args->Has("csv")) return Fail("--schedule custom needs --csv FILE");
    for (const char* flag : {"stages", "virtual", "microbatches"}) {
      if (args->Has(flag)) {
        return Fail(absl::StrCat("--", flag,
                                 " does not apply to --schedule custom: the CSV "
                                 "gives the ranks, stages and micro-batches"));
      }
    }
    const std::string path = args->Get("csv");
    absl::StatusOr<std::string> text = ReadFile(path, {.what = "schedule CSV"});
    if (!text.ok()) return Fail(std::string(text.status().message()));
    absl::StatusOr<Schedule> imported = FromCsv(*text);
    if (!imported.ok()) return Fail(absl::StrCat(path, ": ", imported.status().message()));
    schedule = *std::move(imported);
    if (o.num_blocks > 0 && schedule.num_stages() > o.num_blocks) {
      return Fail(absl::StrCat(path, ": ", schedule.num_stages(),
                               " pipeline stages, but the model has only ", o.num_blocks,
                               " blocks; every stage needs at least one block"));
    }
  } else {
    if (args->Has("csv")) return Fail("--csv needs --schedule custom (or no --schedule)");
    if (!have_stages) return Fail("missing --stages (or -f SPEC.json)");
    if (!have_microbatches) return Fail("missing --microbatches (or -f SPEC.json)");
    absl::StatusOr<Schedule> built = BuildSchedule(o);
    if (!built.ok()) return Fail(std::string(built.status().message()));
    schedule = *std::move(built);
  }

  if (data_parallel > 1 || tied || (file_spec && file_spec->optimizer().clip_grad_norm() > 0)) {
    // The job's own actions, as the coordinator adds them (AddJobActions): the spec's
    // (tied embeddings, clipping), with the replicas the flags say.
    baton::v1::JobSpec job;
    if (file_spec) {
      job = *file_spec;
    } else if (tied) {
      job.mutable_model()->mutable_gpt();  // a gpt ties unless told not to
    }
    job.mutable_pipeline()->set_data_parallel(data_parallel);
    absl::StatusOr<Schedule> with = AddJobActions(schedule, job);
    if (!with.ok()) return Fail(std::string(with.status().message()));
    schedule = *std::move(with);
  }
  if (!costs->per_stage.empty() &&
      static_cast<int>(costs->per_stage.size()) != schedule.num_stages()) {
    return Fail(absl::StrCat("--costs-from ", measured_from, " measured ", costs->per_stage.size(),
                             " stages but this plan has ", schedule.num_stages(),
                             ": costs are per stage, so plan the partition that ran"));
  }
  if (!measured_from.empty() && output == "table") {
    std::printf("costs measured by %s, in ms\n", measured_from.c_str());
  }
  // Simulate validates first: a refused clock stops here.
  absl::StatusOr<SimResult> sim = Simulate(schedule, *costs);
  if (!sim.ok()) {
    return Fail(absl::StrCat("schedule refused: ", sim.status().message()));
  }
  std::string out;
  if (output == "table") {
    out = RenderTable(schedule, &*sim);
  } else if (output == "json") {
    out = RenderJson(schedule, &*sim, &*costs);
    // With a spec, what the table's footer says too: {..., "footprint": {...}}.
    if (const std::optional<Footprint> f =
            file_spec ? FootprintOf(*file_spec, schedule) : std::nullopt;
        f.has_value() && absl::EndsWith(out, "\n}\n")) {
      out.resize(out.size() - 3);
      absl::StrAppend(&out, ",\n  \"footprint\": ", FootprintJson(*f), "\n}\n");
    }
  } else if (output == "svg") {
    out = RenderSvg(schedule, *sim);
  } else {
    out = ToCsv(schedule);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (output == "table" && schedule.kind != ScheduleKind::kCustom) {
    // The schedule's rules, beside what this simulation found.
    const ScheduleEntry& e = ScheduleEntryOf(schedule.kind);
    std::printf("%s with unit costs: bubble %s; activations held: %s\n", e.name, e.bubble,
                e.memory);
  }
  if (output == "table" && file_spec) {
    if (const std::optional<Footprint> f = FootprintOf(*file_spec, schedule)) PrintFootprint(*f);
  }
  return 0;
}

}  // namespace baton::cli
