// Measured against predicted pipeline bubble (docs/benchmarks.md, "Measured against
// predicted bubble").
//
// A driver, not a timed test: for each schedule it trains a real pipeline job with
// LocalPipelineTrainer (S executor threads, the in-process transport), takes `warmup`
// steps, then `steps` measured steps, and reads the per-rank action timelines. From them:
//
//   busy_r      time rank r spends in F, B, I, W and STEP actions (SEND/RECV excluded);
//   span_r      rank r's last action end, from its own step start (RankStepResult times
//               are relative to each rank's start, taken after its ZeroGrad);
//   makespan    the pipeline's: from the first rank's start to the last rank's end, on a
//               common clock (alignment below);
//   bubble (own span)  1 - busy_r / span_r;
//   bubble (makespan)  1 - busy_r / makespan; over the pipeline 1 - sum busy / (S makespan),
//               the simulator's definition (idle rank-time over S x makespan), so this is
//               the one compared.
//
// Alignment. Each rank's times start at its own t0, and the threads do not start at the
// same instant (thread creation, ZeroGrad, and with S above the core count, scheduling).
// Messages bound the offset between two ranks: a receive cannot end before its send began,
// so for ranks a, b with offsets o_a, o_b:  o_b - o_a >= send_start(a->b) - recv_end(a->b)
// and  o_b - o_a <= recv_end(b->a) - send_start(b->a). The bench takes the middle of the
// tightest interval over all messages of the step (as NTP does; exact when the delivery
// latency is the same both ways) and reports the half-width, the most it can be off.
//
// Prediction. Costs for Simulate come from the measured steps, per stage: the mean F, B,
// I, W and SEND durations of that stage's actions, and as RECV the mean duration of the
// receives whose message was already in the mailbox when they began (the simulator's
// recv cost is what a receive costs after its message was sent; waiting is the simulator's
// job, and a receive that had to wait measures the wait plus the wake-up, not the cost).
// Costs.step is one number for every rank, but STEP is each rank's last action and nothing
// waits for it, so the bench simulates with step = 0 and adds each rank's own mean STEP to
// its finish, which is what a per-rank step cost would give. Predicted busy and bubble are
// computed from the simulated timeline exactly as the measured ones (F/B/I/W/STEP busy).
//
// Where a gap comes from:
//  - replay: each measured step run again through the simulator's rules with that step's
//    own action durations (not the means) and no hand-over latency. Replay minus predicted
//    is what the durations' variability costs; measured minus replay is what hand-overs,
//    late starts and time between actions cost. "lat" is the wake-up latency per waiting
//    receive that stretches the replay to the measured makespan;
//  - per rank and step (means): the measured idle against the makespan split into receive
//    time beyond the receive cost (waiting + wake-up), send and receive cost, time between
//    actions, the late start, and the tail after the rank's end; the same split of the
//    predicted idle; the receives that surely waited and their mean send end to receive
//    end (only as good as the alignment);
//  - process CPU time and context switches over the measured steps, and the CPU time of
//    every other process on the machine (/proc/stat), which flags a disturbed run;
//  - the in-process hand-over alone: a ping-pong with an activation-sized tensor (one-way =
//    round trip / 2), and send start to receive end when the receiver has been blocked for
//    2 ms while the sender computed, as pipeline ranks wait.
//
//   bubble_bench [--spec=PATH] [--steps=50] [--warmup=5]
//                [--schedules=gpipe,1f1b,interleaved-1f1b,zb-h1] [--S=2[,4]] [--M=8]
//                [--V=2] [--layers=8] [--mb-seqs=1] [--blas-threads=1] [--json]
//                [--timelines=FILE.csv]
//
// The spec (default client/examples/gpt.json) is overridden with the flags: layers,
// batch_size = M x mb-seqs, pipeline stages S, microbatches M, the schedule, and V for
// interleaved-1f1b (1 otherwise). --timelines writes every measured action on the common
// clock (schedule,S,step,rank,action,start_us,end_us) for a closer look.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/comm/inproc_transport.h"
#include "common/core/backend.h"
#include "common/core/blas_kernels.h"
#include "common/core/host_info.h"
#include "common/core/tensor.h"
#include "common/pipeline/local_pipeline.h"
#include "common/schedule/action.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"

#ifndef BATON_SOURCE_DIR
#define BATON_SOURCE_DIR "."
#endif

namespace baton {
namespace {

struct Flags {
  std::string spec = std::string(BATON_SOURCE_DIR) + "/client/examples/gpt.json";
  int steps = 50;
  int warmup = 5;
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"};
  std::vector<int> stages = {2};
  int microbatches = 8;
  int virtual_stages = 2;  // interleaved-1f1b only
  int layers = 8;
  int mb_seqs = 1;
  int blas_threads = 1;
  bool json = false;
  std::string timelines;  // CSV of every measured action, aligned; empty: none
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bubble_bench: %s\n", what.c_str());
  std::exit(1);
}

int ParseInt(const std::string& flag, const std::string& v, int lo) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > 1 << 20) {
    Die(absl::StrCat(flag, ": want an integer >= ", lo, ", got '", v, "'"));
  }
  return static_cast<int>(x);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      f.json = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      std::printf(
          "bubble_bench [--spec=PATH] [--steps=N] [--warmup=N] [--schedules=a,b,...] "
          "[--S=2[,4]] [--M=8] [--V=2] [--layers=8] [--mb-seqs=1] [--blas-threads=1] "
          "[--json] [--timelines=CSV]\n");
      std::exit(0);
    }
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) Die("unknown argument " + a);
    const std::string k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    if (k == "spec") {
      f.spec = v;
    } else if (k == "steps") {
      f.steps = ParseInt(a, v, 1);
    } else if (k == "warmup") {
      f.warmup = ParseInt(a, v, 0);
    } else if (k == "schedules") {
      f.schedules = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else if (k == "S" || k == "stages") {
      f.stages.clear();
      for (const auto& s : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        f.stages.push_back(ParseInt(a, std::string(s), 1));
      }
    } else if (k == "M" || k == "microbatches") {
      f.microbatches = ParseInt(a, v, 1);
    } else if (k == "V" || k == "virtual") {
      f.virtual_stages = ParseInt(a, v, 2);
    } else if (k == "layers") {
      f.layers = ParseInt(a, v, 1);
    } else if (k == "mb-seqs") {
      f.mb_seqs = ParseInt(a, v, 1);
    } else if (k == "timelines") {
      f.timelines = v;
    } else if (k == "blas-threads") {
      f.blas_threads = ParseInt(a, v, 1);
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.schedules.empty() || f.stages.empty()) Die("--schedules and --S need a value");
  return f;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double Stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

bool IsBusy(ActionKind k) { return IsCompute(k) || k == ActionKind::kStep; }
bool IsRecv(ActionKind k) { return k == ActionKind::kRecvF || k == ActionKind::kRecvB; }
bool IsSend(ActionKind k) { return k == ActionKind::kSendF || k == ActionKind::kSendB; }

// A message's key: (0 = activation / 1 = gradient, sending stage, micro-batch).
using MsgKey = std::tuple<int, int, int>;
MsgKey SendKey(const Action& a) {
  return {CarriesActivation(a.kind) ? 0 : 1, a.stage, a.microbatch};
}
MsgKey RecvKey(const Action& a) {
  return {CarriesActivation(a.kind) ? 0 : 1, PeerStage(a), a.microbatch};
}

// One action on the common clock (ns since the earliest rank's start).
struct Span {
  Action action;
  double start = 0;
  double end = 0;
};

// One measured step, aligned.
struct StepView {
  int S = 0;
  std::vector<std::vector<Span>> ranks;  // aligned timelines
  std::vector<double> offset;            // rank start on the common clock (min 0)
  double uncertainty = 0;  // the largest half-width of an offset's interval over the links, ns
  double makespan = 0;     // ns
  double wall = 0;         // LocalPipelineTrainer::Step wall time, ns
};

// Aligns the ranks of one step (see the header comment). Links are the pairs (r, r+1),
// chained from rank 0; every pair of neighbours exchanges messages both ways.
StepView Align(const PipelineStepStats& st) {
  StepView v;
  v.S = static_cast<int>(st.ranks.size());
  struct Where {
    int rank;
    const ActionTiming* t;
  };
  std::map<MsgKey, Where> sends, recvs;
  for (int r = 0; r < v.S; ++r) {
    for (const ActionTiming& t : st.ranks[r].timeline) {
      if (IsSend(t.action.kind)) sends[SendKey(t.action)] = {r, &t};
      if (IsRecv(t.action.kind)) recvs[RecvKey(t.action)] = {r, &t};
    }
  }
  // lo[r] <= o_{r+1} - o_r <= hi[r]
  constexpr double kNone = 1e300;
  std::vector<double> lo(v.S, -kNone), hi(v.S, kNone);
  for (const auto& [key, s] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end()) continue;
    const Where& rc = it->second;
    const double bound = static_cast<double>(s.t->start_ns) - static_cast<double>(rc.t->end_ns);
    // o_rc - o_s >= bound
    if (rc.rank == s.rank + 1) lo[s.rank] = std::max(lo[s.rank], bound);
    if (s.rank == rc.rank + 1) hi[rc.rank] = std::min(hi[rc.rank], -bound);
  }
  v.offset.assign(v.S, 0.0);
  for (int r = 0; r + 1 < v.S; ++r) {
    double d = 0;
    if (lo[r] > -kNone && hi[r] < kNone) {
      d = 0.5 * (lo[r] + hi[r]);
      v.uncertainty = std::max(v.uncertainty, 0.5 * (hi[r] - lo[r]));
    }
    v.offset[r + 1] = v.offset[r] + d;
  }
  const double base = *std::min_element(v.offset.begin(), v.offset.end());
  for (double& o : v.offset) o -= base;
  v.ranks.resize(v.S);
  double first = 1e300, last = 0;
  for (int r = 0; r < v.S; ++r) {
    for (const ActionTiming& t : st.ranks[r].timeline) {
      v.ranks[r].push_back({t.action, v.offset[r] + static_cast<double>(t.start_ns),
                            v.offset[r] + static_cast<double>(t.end_ns)});
    }
    first = std::min(first, v.offset[r]);
    if (!v.ranks[r].empty()) last = std::max(last, v.ranks[r].back().end);
  }
  v.makespan = last - first;
  v.wall = st.seconds * 1e9;
  return v;
}

// Per-rank accounting of one timeline (measured or simulated), in ns.
struct RankAccount {
  double busy = 0;        // F, B, I, W, STEP
  double span = 0;        // last end - own start
  double recv = 0;        // time inside receive actions
  double send = 0;        // time inside send actions
  double gaps = 0;        // time between consecutive actions
  double late_start = 0;  // own start - pipeline start
  double tail = 0;        // makespan - own end
};

RankAccount Account(const std::vector<Span>& tl, double own_start, double makespan) {
  RankAccount a;
  a.late_start = own_start;
  double prev = own_start;
  for (const Span& s : tl) {
    const double d = s.end - s.start;
    if (IsBusy(s.action.kind)) a.busy += d;
    if (IsRecv(s.action.kind)) a.recv += d;
    if (IsSend(s.action.kind)) a.send += d;
    a.gaps += std::max(0.0, s.start - prev);
    prev = s.end;
  }
  a.span = prev - own_start;
  a.tail = makespan - prev;
  return a;
}

// Replays one measured step through the simulator's rules with that step's own durations:
// every rank starts at 0, an action starts when the previous one on its rank ended, a
// receive not before its send ended, and lasts `recv_ms[stage]`; every other action lasts
// what it measured. So the replay has the step's real duration variability but no
// hand-over latency, no late starts and no gaps between actions. With `latency_ns` > 0 a
// receive that has to wait ends that long after its send instead (a blocked thread's
// wake-up). Returns per-rank end times (ns); the busy time is the measured one.
std::vector<double> Replay(const StepView& v, const std::vector<double>& recv_ms,
                           double latency_ns = 0) {
  std::vector<size_t> pos(v.S, 0);
  std::vector<double> t(v.S, 0.0);
  std::map<MsgKey, double> sent;
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int r = 0; r < v.S; ++r) {
      while (pos[r] < v.ranks[r].size()) {
        const Span& s = v.ranks[r][pos[r]];
        double start = t[r], dur = s.end - s.start;
        if (IsRecv(s.action.kind)) {
          auto it = sent.find(RecvKey(s.action));
          if (it == sent.end()) break;
          dur = recv_ms[s.action.stage] * 1e6;
          if (it->second > start) {
            start = it->second;
            if (latency_ns > 0) dur = latency_ns;
          }
        }
        t[r] = start + dur;
        if (IsSend(s.action.kind)) sent[SendKey(s.action)] = t[r];
        ++pos[r];
        progressed = true;
      }
    }
  }
  return t;
}

// What one schedule's run produced, reduced.
struct RankResult {
  std::vector<int> stages;
  // measured, per step
  std::vector<double> bubble_own, bubble_mk, bubble_replay;
  // measured means (ms per step)
  RankAccount m;
  double recv_excess = 0;  // ms: receive time beyond count x the recv cost
  int recv_count = 0;      // receives per step
  double recv_waited = 0;  // receives per step that began before their send
  double wake_us = 0;      // mean send end -> receive end of those, us
  double step_ms = 0;      // mean STEP
  // predicted
  double pred_bubble_own = 0, pred_bubble_mk = 0;
  RankAccount p;         // ms
  double pred_wait = 0;  // ms: simulated idle before receives
};

struct ScheduleResult {
  std::string name;
  int S = 0, V = 1, M = 0;
  std::vector<RankResult> ranks;
  std::vector<double> bubble_mk, bubble_wall, bubble_replay;  // per step, pipeline
  double replay_makespan_ms = 0, busy_ms = 0, cpu_ms = 0;
  double other_util = 0;  // other processes' CPU over the measured steps, share of cores
  // The wake-up latency per waiting receive that makes the replay's mean makespan equal the
  // measured one (0 when the replay is already as long).
  double implied_latency_us = 0;
  double makespan_ms = 0, makespan_sd = 0, wall_ms = 0, align_halfwidth_us = 0;
  double pred_makespan_ms = 0, pred_bubble = 0, sim_bubble_ratio = 0;
  double cpu_util = 0, invol_csw = 0, vol_csw = 0;
  Costs costs;  // ms, per stage
  std::vector<double> step_cost_ms;
  double recv_cost_fallback_us = 0;
  // Stages whose recv cost is the calibration's (no receive of the run found its message).
  int recv_cost_from_calibration = 0;
};

// Hand-over latency of the in-process transport with a tensor of `floats` elements:
// one-way = round trip / 2, and the cost of a receive whose tensor is already there.
struct Calibration {
  double one_way_us = 0;
  double recv_present_us = 0;
  double send_us = 0;
  // Send start to receive end when the receiver has been blocked for 2 ms while the sender
  // computed (spun) on the other core, as a pipeline rank waits: mean, median, 90th pct.
  double long_wait_mean_us = 0, long_wait_median_us = 0, long_wait_p90_us = 0;
};

Calibration Calibrate(int64_t floats) {
  Calibration c;
  Tensor t = Tensor::Empty({floats});
  std::memset(t.f32(), 0, sizeof(float) * floats);
  const int iters = 2000;
  {
    InProcessHub hub(2);
    auto echo = std::thread([&] {
      for (int i = 0; i < iters; ++i) {
        TensorTag tag{1, i, 0, 0, TensorKind::kActivation};
        auto x = hub.transport(1)->Recv(0, tag, absl::Now() + absl::Seconds(30));
        if (!x.ok()) Die(x.status().ToString());
        TensorTag back{1, i, 0, 1, TensorKind::kGradient};
        hub.transport(1)->Send(0, back, *x)->Wait(absl::InfiniteFuture()).IgnoreError();
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      TensorTag tag{1, i, 0, 0, TensorKind::kActivation};
      hub.transport(0)->Send(1, tag, t)->Wait(absl::InfiniteFuture()).IgnoreError();
      TensorTag back{1, i, 0, 1, TensorKind::kGradient};
      auto x = hub.transport(0)->Recv(1, back, absl::Now() + absl::Seconds(30));
      if (!x.ok()) Die(x.status().ToString());
    }
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    echo.join();
    c.one_way_us = ns / iters / 2 / 1e3;
  }
  {
    InProcessHub hub(2);
    double send_ns = 0, recv_ns = 0;
    for (int i = 0; i < iters; ++i) {
      TensorTag tag{2, i, 0, 0, TensorKind::kActivation};
      const auto a = std::chrono::steady_clock::now();
      hub.transport(0)->Send(1, tag, t)->Wait(absl::InfiniteFuture()).IgnoreError();
      const auto b = std::chrono::steady_clock::now();
      auto x = hub.transport(1)->Recv(0, tag, absl::Now() + absl::Seconds(30));
      const auto e = std::chrono::steady_clock::now();
      if (!x.ok()) Die(x.status().ToString());
      send_ns += std::chrono::duration<double, std::nano>(b - a).count();
      recv_ns += std::chrono::duration<double, std::nano>(e - b).count();
    }
    c.send_us = send_ns / iters / 1e3;
    c.recv_present_us = recv_ns / iters / 1e3;
  }
  {
    InProcessHub hub(2);
    const int n = 200;
    std::vector<std::chrono::steady_clock::time_point> sent(n);
    std::vector<double> lat(n);
    auto sender = std::thread([&] {
      for (int i = 0; i < n; ++i) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
        while (std::chrono::steady_clock::now() < until) {
        }
        TensorTag tag{3, i, 0, 0, TensorKind::kActivation};
        sent[i] = std::chrono::steady_clock::now();
        hub.transport(0)->Send(1, tag, t)->Wait(absl::InfiniteFuture()).IgnoreError();
        // Wait for the receiver to be blocked again before the next round.
        TensorTag ack{3, i, 0, 1, TensorKind::kGradient};
        auto x = hub.transport(0)->Recv(1, ack, absl::Now() + absl::Seconds(30));
        if (!x.ok()) Die(x.status().ToString());
      }
    });
    Tensor one = Tensor::Empty({1});
    one.f32()[0] = 0;
    for (int i = 0; i < n; ++i) {
      TensorTag tag{3, i, 0, 0, TensorKind::kActivation};
      auto x = hub.transport(1)->Recv(0, tag, absl::Now() + absl::Seconds(30));
      const auto got = std::chrono::steady_clock::now();
      if (!x.ok()) Die(x.status().ToString());
      lat[i] = std::chrono::duration<double, std::micro>(got - sent[i]).count();
      TensorTag ack{3, i, 0, 1, TensorKind::kGradient};
      hub.transport(1)->Send(0, ack, one)->Wait(absl::InfiniteFuture()).IgnoreError();
    }
    sender.join();
    c.long_wait_mean_us = Mean(lat);
    std::sort(lat.begin(), lat.end());
    c.long_wait_median_us = lat[n / 2];
    c.long_wait_p90_us = lat[n * 9 / 10];
  }
  return c;
}

absl::StatusOr<baton::v1::JobSpec> MakeSpec(const Flags& f, const std::string& schedule, int S) {
  absl::StatusOr<baton::v1::JobSpec> loaded = LoadJobSpecFile(f.spec);
  if (!loaded.ok()) return loaded.status();
  baton::v1::JobSpec spec = *std::move(loaded);
  if (!spec.model().has_gpt()) return absl::InvalidArgumentError("want a gpt spec");
  spec.mutable_model()->mutable_gpt()->set_layers(f.layers);
  spec.mutable_data()->set_batch_size(f.microbatches * f.mb_seqs);
  auto* p = spec.mutable_pipeline();
  p->set_stages(S);
  p->set_microbatches(f.microbatches);
  p->set_virtual_stages(1);
  absl::StatusOr<const ScheduleEntry*> entry = FindScheduleEntry(schedule);
  if (!entry.ok()) return entry.status();
  if ((*entry)->spec_value == 0) return absl::InvalidArgumentError("bubble_bench: no custom");
  p->set_schedule(static_cast<baton::v1::Schedule>((*entry)->spec_value));
  if ((*entry)->placement == ChunkPlacement::kLooped) p->set_virtual_stages(f.virtual_stages);
  spec.set_steps(f.warmup + f.steps);
  absl::Status s = ValidateAndDefaultJobSpec(&spec);
  if (!s.ok()) return s;
  return spec;
}

double Seconds(const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; }

// CPU seconds the whole machine spent busy (all processes, all cores) since boot, from
// /proc/stat: everything but idle and iowait.
double MachineBusySeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  double total_busy = 0;
  for (int i = 0; i < 8; ++i) {
    double x = 0;
    in >> x;
    if (i != 3 && i != 4) total_busy += x;
  }
  return total_busy / static_cast<double>(sysconf(_SC_CLK_TCK));
}

absl::StatusOr<ScheduleResult> RunSchedule(const Flags& f, const std::string& name, int S,
                                           const Calibration& cal, FILE* timelines) {
  absl::StatusOr<baton::v1::JobSpec> spec = MakeSpec(f, name, S);
  if (!spec.ok()) return spec.status();
  auto trainer = LocalPipelineTrainer::Create(*spec);
  if (!trainer.ok()) return trainer.status();
  LocalPipelineTrainer& tr = **trainer;
  const Schedule& sched = tr.schedule();
  for (int i = 0; i < f.warmup; ++i) {
    auto st = tr.Step();
    if (!st.ok()) return st.status();
  }
  std::vector<PipelineStepStats> steps;
  rusage ru0, ru1;
  const double machine0 = MachineBusySeconds();
  getrusage(RUSAGE_SELF, &ru0);
  for (int i = 0; i < f.steps; ++i) {
    auto st = tr.Step();
    if (!st.ok()) return st.status();
    steps.push_back(*std::move(st));
  }
  getrusage(RUSAGE_SELF, &ru1);
  const double machine1 = MachineBusySeconds();

  ScheduleResult R;
  R.name = name;
  R.S = S;
  R.V = sched.virtual_stages;
  R.M = sched.num_microbatches;
  R.ranks.resize(S);
  for (int s = 0; s < sched.num_stages(); ++s) R.ranks[sched.stage_to_rank[s]].stages.push_back(s);
  const int NS = sched.num_stages();
  const double N = static_cast<double>(f.steps);

  std::vector<StepView> views;
  for (const auto& st : steps) views.push_back(Align(st));
  if (timelines != nullptr) {
    for (size_t k = 0; k < views.size(); ++k) {
      for (int r = 0; r < S; ++r) {
        for (const Span& s : views[k].ranks[r]) {
          std::fprintf(timelines, "%s,%d,%zu,%d,%s,%.3f,%.3f\n", name.c_str(), S, k, r,
                       s.action.ToString().c_str(), s.start / 1e3, s.end / 1e3);
        }
      }
    }
  }

  // Per-stage action means, and the receives' classification.
  struct Acc {
    double sum = 0;
    int n = 0;
    void Add(double x) { sum += x, ++n; }
    double Mean() const { return n ? sum / n : 0; }
  };
  std::vector<Acc> fw(NS), bw(NS), in(NS), wt(NS), snd(NS), rcv_present(NS);
  std::vector<Acc> step_cost(S), wake(S);
  std::vector<double> waited(S, 0);
  for (const StepView& v : views) {
    std::map<MsgKey, const Span*> send_of;
    for (int r = 0; r < S; ++r) {
      for (const Span& s : v.ranks[r]) {
        if (IsSend(s.action.kind)) send_of[SendKey(s.action)] = &s;
      }
    }
    for (int r = 0; r < S; ++r) {
      for (const Span& s : v.ranks[r]) {
        const double d = s.end - s.start;
        const int st = s.action.stage;
        switch (s.action.kind) {
          case ActionKind::kForward:
            fw[st].Add(d);
            break;
          case ActionKind::kBackward:
            bw[st].Add(d);
            break;
          case ActionKind::kBackwardInput:
            in[st].Add(d);
            break;
          case ActionKind::kBackwardWeight:
            wt[st].Add(d);
            break;
          case ActionKind::kSendF:
          case ActionKind::kSendB:
            snd[st].Add(d);
            break;
          case ActionKind::kStep:
            step_cost[r].Add(d);
            break;
          case ActionKind::kReduceGrad:  // not in this benchmark's clocks (one replica)
          case ActionKind::kTieGrad:     // nor this (an untied model)
          case ActionKind::kClipGrad:    // nor this (no clipping)
            break;
          case ActionKind::kRecvF:
          case ActionKind::kRecvB: {
            auto it = send_of.find(RecvKey(s.action));
            if (it == send_of.end()) break;
            const Span& snd_span = *it->second;
            // Present for sure: the send ended before the receive began, even with the
            // alignment off by its half-width.
            if (snd_span.end + v.uncertainty <= s.start) rcv_present[st].Add(d);
            // Waited for sure: the send began after the receive did.
            if (snd_span.start - v.uncertainty >= s.start) {
              waited[r] += 1;
              wake[r].Add(s.end - snd_span.end);
            }
            break;
          }
        }
      }
    }
  }
  // The recv cost: per stage where that stage had receives that found their message; else
  // the pooled mean of all such receives; else the calibration's present-receive cost.
  Acc pooled;
  for (const Acc& a : rcv_present) pooled.sum += a.sum, pooled.n += a.n;
  const double ms = 1e-6;
  R.recv_cost_fallback_us = pooled.n ? pooled.Mean() / 1e3 : cal.recv_present_us;
  Costs costs;
  costs.step = 0;  // added per rank below
  costs.per_stage.resize(NS);
  for (int s = 0; s < NS; ++s) {
    Costs& c = costs.per_stage[s];
    c.f = fw[s].Mean() * ms;
    if (bw[s].n) {
      c.b = bw[s].Mean() * ms;
      // Full backwards only, or (dualpipe-v) mixed with split ones.
      c.i = in[s].n ? in[s].Mean() * ms : 0;
      c.w = wt[s].n ? wt[s].Mean() * ms : 0;
    } else {
      c.i = in[s].Mean() * ms;
      c.w = wt[s].Mean() * ms;
      c.b = -1;
    }
    c.send = snd[s].Mean() * ms;
    const bool have = rcv_present[s].n >= 3;
    if (!have && !pooled.n) ++R.recv_cost_from_calibration;
    c.recv = (have ? rcv_present[s].Mean() * ms : R.recv_cost_fallback_us * 1e-3);
  }
  R.costs = costs;
  for (int r = 0; r < S; ++r) R.step_cost_ms.push_back(step_cost[r].Mean() * ms);

  // Measured accounting.
  std::vector<double> recv_ms(NS);
  for (int s = 0; s < NS; ++s) recv_ms[s] = costs.per_stage[s].recv;
  std::vector<double> mk, ab;
  for (const StepView& v : views) {
    double busy_total = 0;
    const std::vector<double> rend = Replay(v, recv_ms);
    const double rmk = *std::max_element(rend.begin(), rend.end());
    R.replay_makespan_ms += rmk * ms / N;
    for (int r = 0; r < S; ++r) {
      RankAccount a = Account(v.ranks[r], v.offset[r], v.makespan);
      RankResult& rr = R.ranks[r];
      rr.bubble_own.push_back(1 - a.busy / a.span);
      rr.bubble_mk.push_back(1 - a.busy / v.makespan);
      rr.bubble_replay.push_back(1 - a.busy / rmk);
      rr.m.busy += a.busy * ms / N;
      rr.m.span += a.span * ms / N;
      rr.m.recv += a.recv * ms / N;
      rr.m.send += a.send * ms / N;
      rr.m.gaps += a.gaps * ms / N;
      rr.m.late_start += a.late_start * ms / N;
      rr.m.tail += a.tail * ms / N;
      busy_total += a.busy;
    }
    R.bubble_mk.push_back(1 - busy_total / (S * v.makespan));
    R.bubble_wall.push_back(1 - busy_total / (S * v.wall));
    R.bubble_replay.push_back(1 - busy_total / (S * rmk));
    R.busy_ms += busy_total * ms / N;
    mk.push_back(v.makespan * ms);
    ab.push_back(v.uncertainty / 1e3);
    R.wall_ms += v.wall * ms / N;
  }
  R.makespan_ms = Mean(mk);
  {
    auto mean_replay = [&](double lat_ns) {
      double sum = 0;
      for (const StepView& v : views) {
        const std::vector<double> e = Replay(v, recv_ms, lat_ns);
        sum += *std::max_element(e.begin(), e.end());
      }
      return sum * ms / N;
    };
    double lo = 0, hi = 5e6;  // ns
    if (mean_replay(lo) < R.makespan_ms) {
      if (mean_replay(hi) < R.makespan_ms) {
        lo = hi;
      } else {
        for (int it = 0; it < 40; ++it) {
          const double mid = 0.5 * (lo + hi);
          (mean_replay(mid) < R.makespan_ms ? lo : hi) = mid;
        }
      }
    }
    R.implied_latency_us = lo / 1e3;
  }
  R.makespan_sd = Stddev(mk);
  R.align_halfwidth_us = Mean(ab);
  for (int r = 0; r < S; ++r) {
    RankResult& rr = R.ranks[r];
    int recvs = 0;
    double recv_cost_total = 0;
    for (const Action& a : sched.ranks[r]) {
      if (IsRecv(a.kind)) ++recvs, recv_cost_total += costs.per_stage[a.stage].recv;
    }
    rr.recv_count = recvs;
    rr.recv_excess = rr.m.recv - recv_cost_total;
    rr.recv_waited = waited[r] / N;
    rr.wake_us = wake[r].Mean() / 1e3;
    rr.step_ms = R.step_cost_ms[r];
  }

  // Prediction.
  absl::StatusOr<SimResult> sim = Simulate(sched, costs);
  if (!sim.ok()) return sim.status();
  R.sim_bubble_ratio = sim->bubble_ratio;
  std::vector<std::vector<Span>> pred(S);
  for (const SimResult::Span& s : sim->timeline) {
    double end = s.end;
    if (s.action.kind == ActionKind::kStep) end = s.start + R.step_cost_ms[s.rank];
    pred[s.rank].push_back({s.action, s.start, end});
  }
  double pmk = 0;
  for (int r = 0; r < S; ++r) {
    if (!pred[r].empty()) pmk = std::max(pmk, pred[r].back().end);
  }
  R.pred_makespan_ms = pmk;
  double pbusy = 0;
  for (int r = 0; r < S; ++r) {
    RankResult& rr = R.ranks[r];
    rr.p = Account(pred[r], 0, pmk);
    rr.pred_bubble_own = 1 - rr.p.busy / rr.p.span;
    rr.pred_bubble_mk = 1 - rr.p.busy / pmk;
    rr.pred_wait = rr.p.gaps;  // the simulator idles only before receives
    pbusy += rr.p.busy;
  }
  R.pred_bubble = 1 - pbusy / (S * pmk);

  const double cpu =
      Seconds(ru1.ru_utime) - Seconds(ru0.ru_utime) + Seconds(ru1.ru_stime) - Seconds(ru0.ru_stime);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  R.cpu_util = cpu / (R.wall_ms * 1e-3 * N * cores);
  R.cpu_ms = cpu * 1e3 / N;
  R.other_util = std::max(0.0, machine1 - machine0 - cpu) / (R.wall_ms * 1e-3 * N * cores);
  R.invol_csw = (ru1.ru_nivcsw - ru0.ru_nivcsw) / N;
  R.vol_csw = (ru1.ru_nvcsw - ru0.ru_nvcsw) / N;
  return R;
}

std::string StagesText(const std::vector<int>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? "," : "", s[i]);
  return out;
}

std::string LoadAvg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

void PrintTable(const Flags& f, const baton::v1::JobSpec& spec, const Calibration& cal,
                const std::vector<ScheduleResult>& results, const std::string& load0,
                const std::string& load1) {
  const auto& g = spec.model().gpt();
  std::printf("bubble_bench: %s, %u hardware threads, load average %s (start) %s (end)\n",
              CpuModelName().c_str(), std::thread::hardware_concurrency(), load0.c_str(),
              load1.c_str());
  std::printf("matrix kernels: %s\n", CurrentBlasKernels().Describe().c_str());
  std::printf(
      "model gpt vocab=%d context=%d d_model=%d heads=%d layers=%d; micro-batch %d x %d "
      "tokens, M=%d; %d warm-up + %d measured steps; BLAS threads %d\n",
      g.vocab_size(), g.context(), g.d_model(), g.heads(), g.layers(), f.mb_seqs, g.context(),
      f.microbatches, f.warmup, f.steps, f.blas_threads);
  std::printf(
      "in-process hand-over (%lld floats): ping-pong one-way %.1f us; send %.1f us; receive "
      "of a present tensor %.1f us;\nsend start to receive end after a 2 ms blocked wait: "
      "mean %.1f us, median %.1f us, 90th percentile %.1f us\n\n",
      static_cast<long long>(f.mb_seqs) * g.context() * g.d_model(), cal.one_way_us, cal.send_us,
      cal.recv_present_us, cal.long_wait_mean_us, cal.long_wait_median_us, cal.long_wait_p90_us);
  std::printf(
      "bubble = 1 - (F+B+I+W+STEP time) / T. own span: T = the rank's own last end. makespan: "
      "T = the pipeline's\nmakespan (first start to last end), the simulator's definition; "
      "predicted uses the same busy/T on the simulated timeline.\n\n");
  std::printf("%-18s %2s %-5s %-7s %9s %13s %10s %10s %9s %9s\n", "schedule", "S", "rank", "stages",
              "own span", "makespan ±sd", "predicted", "diff (pt)", "replay", "pred own");
  for (const ScheduleResult& R : results) {
    for (int r = 0; r < R.S; ++r) {
      const RankResult& rr = R.ranks[r];
      std::printf("%-18s %2d %-5d %-7s %9.3f %7.3f±%.3f %10.3f %+10.1f %9.3f %9.3f\n",
                  R.name.c_str(), R.S, r, StagesText(rr.stages).c_str(), Mean(rr.bubble_own),
                  Mean(rr.bubble_mk), Stddev(rr.bubble_mk), rr.pred_bubble_mk,
                  100 * (Mean(rr.bubble_mk) - rr.pred_bubble_mk), Mean(rr.bubble_replay),
                  rr.pred_bubble_own);
    }
    std::printf("%-18s %2d %-5s %-7s %9s %7.3f±%.3f %10.3f %+10.1f %9.3f\n", R.name.c_str(), R.S,
                "all", "", "", Mean(R.bubble_mk), Stddev(R.bubble_mk), R.pred_bubble,
                100 * (Mean(R.bubble_mk) - R.pred_bubble), Mean(R.bubble_replay));
  }
  std::printf(
      "\nper step (means): makespan measured, predicted, replayed; lat = the wake-up latency per "
      "waiting receive\nthat stretches the replay to the measured makespan; wall = "
      "LocalPipelineTrainer::Step; busy = sum over ranks;\nCPU = process CPU time; align = "
      "the alignment's half-width; cs = context switches (involuntary / voluntary);\nothers = "
      "other "
      "processes' CPU time over the measured steps, as a share of all cores\n");
  std::printf("%-18s %2s %12s %9s %8s %8s %8s %9s %8s %8s %8s %6s %8s %13s\n", "schedule", "S",
              "makespan ms", "predicted", "replay", "lat us", "wall ms", "bub(wall)", "busy ms",
              "CPU ms", "CPU use", "others", "align us", "cs inv/vol");
  for (const ScheduleResult& R : results) {
    std::printf(
        "%-18s %2d %7.2f±%-4.2f %9.2f %8.2f %8.0f %8.2f %9.3f %8.1f %8.1f %7.0f%% %5.0f%% "
        "%8.1f %6.1f/%-6.1f\n",
        R.name.c_str(), R.S, R.makespan_ms, R.makespan_sd, R.pred_makespan_ms, R.replay_makespan_ms,
        R.implied_latency_us, R.wall_ms, Mean(R.bubble_wall), R.busy_ms, R.cpu_ms, 100 * R.cpu_util,
        100 * R.other_util, R.align_halfwidth_us, R.invol_csw, R.vol_csw);
  }
  std::printf(
      "\nidle against the makespan, ms per step, measured / predicted: recv = receive time "
      "beyond the recv cost\n(measured) or idle before receives (predicted); gaps = between "
      "actions; late = start after the first rank.\n");
  std::printf("%-18s %2s %-4s %8s %8s %15s %13s %11s %11s %13s %8s %8s %9s\n", "schedule", "S",
              "rank", "busy", "pred", "recv wait", "send+recv", "gaps", "late", "tail", "waited",
              "wake us", "STEP ms");
  for (const ScheduleResult& R : results) {
    for (int r = 0; r < R.S; ++r) {
      const RankResult& rr = R.ranks[r];
      const double m_comm = rr.m.send + (rr.m.recv - rr.recv_excess);
      const double p_comm = rr.p.send + rr.p.recv;
      std::printf(
          "%-18s %2d %-4d %8.2f %8.2f %7.2f/%-7.2f %6.2f/%-6.2f %5.2f/%-5.2f %5.2f/%-5.2f "
          "%6.2f/%-6.2f %4.1f/%-3d %8.0f %9.3f\n",
          R.name.c_str(), R.S, r, rr.m.busy, rr.p.busy, rr.recv_excess, rr.pred_wait, m_comm,
          p_comm, rr.m.gaps, 0.0, rr.m.late_start, 0.0, rr.m.tail, rr.p.tail, rr.recv_waited,
          rr.recv_count, rr.wake_us, rr.step_ms);
    }
  }
  std::printf("\ncosts given to Simulate, ms (per stage: F, B and/or I/W, SEND, RECV):\n");
  for (const ScheduleResult& R : results) {
    std::printf("%s S=%d:", R.name.c_str(), R.S);
    for (size_t s = 0; s < R.costs.per_stage.size(); ++s) {
      const Costs& c = R.costs.per_stage[s];
      if (c.b >= 0 && c.i > 0) {
        std::printf("  [%zu] F %.3f B %.3f I %.3f W %.3f", s, c.f, c.b, c.i, c.w);
      } else if (c.b >= 0) {
        std::printf("  [%zu] F %.3f B %.3f", s, c.f, c.b);
      } else {
        std::printf("  [%zu] F %.3f I %.3f W %.3f", s, c.f, c.i, c.w);
      }
      std::printf(" S %.4f R %.4f", c.send, c.recv);
    }
    std::printf("; STEP per rank");
    for (double x : R.step_cost_ms) std::printf(" %.3f", x);
    std::printf("\n");
  }
}

void PrintJson(const Flags& f, const baton::v1::JobSpec& spec, const Calibration& cal,
               const std::vector<ScheduleResult>& results, const std::string& load0,
               const std::string& load1) {
  const auto& g = spec.model().gpt();
  std::ostringstream o;
  o.precision(6);
  o << "{\"cpu\":\"" << CpuModelName() << "\",\"kernels\":\"" << CurrentBlasKernels().Describe()
    << "\",\"hardware_threads\":" << std::thread::hardware_concurrency() << ",\"loadavg_start\":\""
    << load0 << "\",\"loadavg_end\":\"" << load1 << "\",\"model\":{\"vocab\":" << g.vocab_size()
    << ",\"context\":" << g.context() << ",\"d_model\":" << g.d_model()
    << ",\"heads\":" << g.heads() << ",\"layers\":" << g.layers()
    << "},\"microbatch_sequences\":" << f.mb_seqs << ",\"microbatches\":" << f.microbatches
    << ",\"warmup\":" << f.warmup << ",\"steps\":" << f.steps
    << ",\"blas_threads\":" << f.blas_threads << ",\"handover_us\":{\"one_way\":" << cal.one_way_us
    << ",\"send\":" << cal.send_us << ",\"recv_present\":" << cal.recv_present_us
    << ",\"after_2ms_wait_mean\":" << cal.long_wait_mean_us
    << ",\"after_2ms_wait_median\":" << cal.long_wait_median_us
    << ",\"after_2ms_wait_p90\":" << cal.long_wait_p90_us << "},\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const ScheduleResult& R = results[i];
    o << (i ? "," : "") << "{\"schedule\":\"" << R.name << "\",\"S\":" << R.S << ",\"V\":" << R.V
      << ",\"M\":" << R.M << ",\"bubble_makespan\":" << Mean(R.bubble_mk)
      << ",\"bubble_makespan_sd\":" << Stddev(R.bubble_mk)
      << ",\"bubble_wall\":" << Mean(R.bubble_wall)
      << ",\"bubble_replay\":" << Mean(R.bubble_replay)
      << ",\"replay_makespan_ms\":" << R.replay_makespan_ms
      << ",\"implied_wakeup_latency_us\":" << R.implied_latency_us << ",\"busy_ms\":" << R.busy_ms
      << ",\"cpu_ms\":" << R.cpu_ms << ",\"predicted_bubble\":" << R.pred_bubble
      << ",\"simulator_bubble_ratio\":" << R.sim_bubble_ratio
      << ",\"diff_points\":" << 100 * (Mean(R.bubble_mk) - R.pred_bubble)
      << ",\"makespan_ms\":" << R.makespan_ms << ",\"makespan_sd_ms\":" << R.makespan_sd
      << ",\"predicted_makespan_ms\":" << R.pred_makespan_ms << ",\"wall_ms\":" << R.wall_ms
      << ",\"alignment_halfwidth_us\":" << R.align_halfwidth_us
      << ",\"cpu_utilisation\":" << R.cpu_util
      << ",\"other_processes_cpu_utilisation\":" << R.other_util
      << ",\"involuntary_switches_per_step\":" << R.invol_csw
      << ",\"voluntary_switches_per_step\":" << R.vol_csw
      << ",\"recv_cost_stages_from_calibration\":" << R.recv_cost_from_calibration
      << ",\"costs_ms\":[";
    for (size_t s = 0; s < R.costs.per_stage.size(); ++s) {
      const Costs& c = R.costs.per_stage[s];
      o << (s ? "," : "") << "{\"stage\":" << s << ",\"F\":" << c.f;
      if (c.b >= 0) {
        o << ",\"B\":" << c.b;
      } else {
        o << ",\"I\":" << c.i << ",\"W\":" << c.w;
      }
      o << ",\"SEND\":" << c.send << ",\"RECV\":" << c.recv << "}";
    }
    o << "],\"ranks\":[";
    for (int r = 0; r < R.S; ++r) {
      const RankResult& rr = R.ranks[r];
      o << (r ? "," : "") << "{\"rank\":" << r << ",\"stages\":[" << StagesText(rr.stages)
        << "],\"bubble_own_span\":" << Mean(rr.bubble_own)
        << ",\"bubble_makespan\":" << Mean(rr.bubble_mk)
        << ",\"bubble_makespan_sd\":" << Stddev(rr.bubble_mk)
        << ",\"bubble_replay\":" << Mean(rr.bubble_replay)
        << ",\"predicted_bubble_own_span\":" << rr.pred_bubble_own
        << ",\"predicted_bubble_makespan\":" << rr.pred_bubble_mk
        << ",\"diff_points\":" << 100 * (Mean(rr.bubble_mk) - rr.pred_bubble_mk)
        << ",\"ms_per_step\":{\"busy\":" << rr.m.busy << ",\"predicted_busy\":" << rr.p.busy
        << ",\"span\":" << rr.m.span << ",\"predicted_span\":" << rr.p.span
        << ",\"recv\":" << rr.m.recv << ",\"recv_beyond_cost\":" << rr.recv_excess
        << ",\"predicted_wait\":" << rr.pred_wait << ",\"send\":" << rr.m.send
        << ",\"gaps\":" << rr.m.gaps << ",\"late_start\":" << rr.m.late_start
        << ",\"tail\":" << rr.m.tail << ",\"predicted_tail\":" << rr.p.tail
        << ",\"step\":" << rr.step_ms << "},\"receives\":" << rr.recv_count
        << ",\"receives_waited\":" << rr.recv_waited << ",\"wake_us\":" << rr.wake_us << "}";
    }
    o << "]}";
  }
  o << "]}\n";
  std::fputs(o.str().c_str(), stdout);
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  baton::ChooseBlasKernels(argv);  // the kernels a worker runs (may re-execute)
  using namespace baton;
  const Flags f = ParseFlags(argc, argv);
  SetBlasThreads(f.blas_threads);
  absl::StatusOr<baton::v1::JobSpec> spec0 = MakeSpec(f, "1f1b", f.stages.front());
  if (!spec0.ok()) Die(spec0.status().ToString());
  const Calibration cal =
      Calibrate(static_cast<int64_t>(f.mb_seqs) * spec0->model().gpt().context() *
                spec0->model().gpt().d_model());
  const std::string load0 = LoadAvg();
  FILE* timelines = nullptr;
  if (!f.timelines.empty()) {
    timelines = std::fopen(f.timelines.c_str(), "w");
    if (timelines == nullptr) Die("cannot write " + f.timelines);
    std::fprintf(timelines, "schedule,S,step,rank,action,start_us,end_us\n");
  }
  std::vector<ScheduleResult> results;
  for (int S : f.stages) {
    for (const std::string& name : f.schedules) {
      absl::StatusOr<ScheduleResult> r = RunSchedule(f, name, S, cal, timelines);
      if (!r.ok()) Die(absl::StrCat(name, " S=", S, ": ", r.status().ToString()));
      if (!f.json) std::fprintf(stderr, "%s S=%d done\n", name.c_str(), S);
      results.push_back(*std::move(r));
    }
  }
  const std::string load1 = LoadAvg();
  if (timelines != nullptr) std::fclose(timelines);
  if (f.json) {
    PrintJson(f, *spec0, cal, results, load0, load1);
  } else {
    PrintTable(f, *spec0, cal, results, load0, load1);
  }
  return 0;
}
