// batonctl plan: generate (or import), validate and simulate a pipeline schedule, without a
// cluster. See docs/schedules.md.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/job.pb.h"
#include "client/batonctl/args.h"
#include "client/batonctl/commands.h"
#include "common/schedule/generators.h"
#include "common/schedule/render.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"
#include "common/spec/spec.h"
#include "common/schedule/vocabulary.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/measured_costs.h"
#include "common/core/status.h"

namespace baton::cli {
namespace {

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>([] {
  std::vector<FlagSpec> own{
      {"schedule", "s", false,
       "gpipe, 1f1b (default), interleaved-1f1b, zb-h1, zb-v, v-half, or custom (with --csv)"},
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
       "the coordinator) or a trace file (batonctl trace -o, train-local --trace); ms"},
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
    "\n"
    "Builds the schedule, lowers it (inserts sends and receives), validates it (every\n"
    "micro-batch's forward and backward, send/receive order per rank pair, no deadlock) and\n"
    "simulates it. A refused schedule exits 1 with the rank x position grid and the offending\n"
    "action marked >like this<.\n\n";

int Fail(const std::string& what) {
  std::fprintf(stderr, "batonctl plan: %s\n", what.c_str());
  return 1;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --costs-from: a trace file if one is there, else a job id asked of the coordinator.
absl::StatusOr<Costs> MeasuredCosts(const Args& args, std::string* source) {
  const std::string from = args.Get("costs-from");
  baton::v1::JobTrace trace;
  if (std::ifstream probe(from); probe.good()) {
    absl::StatusOr<std::string> text = ReadFile(from);
    if (!text.ok()) return text.status();
    BATON_ASSIGN_OR_RETURN(trace, JobTraceFromChromeJson(*text, from));
  } else {
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<ClusterClient> client,
                           ClusterClient::Create("plan", args, absl::Seconds(10),
                                                 /*output_is_format=*/false));
    baton::v1::GetJobTraceRequest req;
    req.set_job_id(from);
    std::unique_ptr<grpc::ClientContext> ctx = client->Context();
    if (const grpc::Status st = client->stub().GetJobTrace(ctx.get(), req, &trace); !st.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                          absl::StrCat("--costs-from ", from, ": ", st.error_message()));
    }
  }
  *source = absl::StrCat(trace.job_id().empty() ? from : trace.job_id(), " step ", trace.step(),
                         " (", trace.schedule(), ", ", trace.num_stages(), " stages)");
  BATON_ASSIGN_OR_RETURN(Costs costs, CostsFromTrace(trace));
  return costs;
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
      return Fail(path + ": the spec's model has no architecture (mlp or gpt)");
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
    absl::StatusOr<std::string> text = ReadFile(path);
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

  if (data_parallel > 1 && !schedule.reduces_grads()) {
    absl::StatusOr<Schedule> dp = AddGradReductions(schedule);
    if (!dp.ok()) return Fail(std::string(dp.status().message()));
    schedule = *std::move(dp);
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
  return 0;
}

}  // namespace baton::cli
