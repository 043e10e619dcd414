// control_plane_bench: the coordinator under a large simulated cluster, in one process.
//
// A real Coordinator (SQLite store on disk) serves ClusterService and JobService over gRPC
// on loopback. N simulated workers are real gRPC clients: they register, heartbeat every
// second with their session, and answer plans: the coordinator's StartJob calls go to an
// in-process WorkerClient that accepts them, and each rank reports a successful result
// (ReportResult over gRPC, with a digest per block) after --job_seconds. The coordinator
// runs its own loop; every placement round is timed (CoordinatorOptions::round_observer).
//
// Phases, each printed with its measurements:
//   1. history: --history terminal job records written to the store, then the coordinator
//      started on it (the restart-recovery time with that much history);
//   2. register N workers; heartbeats for --heartbeat_seconds (p50/p99 latency, idle);
//   3. --queued jobs submitted over gRPC (submit rate) with every worker busy on
//      long jobs: placement rounds over a deep queue that can start nothing (p50/p99/max),
//      heartbeat latency meanwhile;
//   4. the long jobs cancelled: rounds that start jobs on every freed worker, until the
//      queue drains (jobs finish at once): time and job throughput;
//   5. ListJobs pages (first page, 1000 jobs) over the whole store;
//   6. a coordinator restart on the same store (recovery time), and resident memory and
//      CPU seconds of the process after each phase.
//
//   build/bin/control_plane_bench --workers=1000 --queued=10000 --history=100000
//
// Goals (docs/benchmarks.md, "The control plane at scale"): heartbeat p99 under 10 ms,
// placement under 50 ms, memory linear in jobs and workers, restart under 10 s.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "baton/v1/cluster.grpc.pb.h"
#include "baton/v1/jobs.grpc.pb.h"
#include "common/core/status.h"
#include "common/rpc/security.h"
#include "common/spec/spec.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_store.h"
#include "coordinator/service.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(int, workers, 1000, "simulated workers");
ABSL_FLAG(int, queued, 10000, "jobs queued at once in phase 3");
ABSL_FLAG(int, history, 100000, "terminal job records in the store before the start");
ABSL_FLAG(int, heartbeat_seconds, 10, "seconds of heartbeats measured in phase 2");
ABSL_FLAG(int, threads, 8, "client threads sending the heartbeats");
ABSL_FLAG(double, job_seconds, 0.0, "how long a simulated rank runs before it reports");
ABSL_FLAG(std::string, dir, "", "where the SQLite store goes (default: a temporary directory)");

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
  size_t n = 0;
};
Percentiles Of(std::vector<double> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  p.max = v.back();
  return p;
}
std::string Show(const Percentiles& p) {
  return absl::StrFormat("p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu)", p.p50, p.p99, p.max, p.n);
}

// Resident memory (MiB) and CPU seconds of this process.
std::string Usage() {
  std::ifstream status("/proc/self/status");
  std::string line;
  double rss_mib = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss_mib = std::stod(line.substr(6)) / 1024.0;
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const double cpu = u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
                     u.ru_stime.tv_usec / 1e6;
  return absl::StrFormat("resident %.0f MiB, CPU %.1f s", rss_mib, cpu);
}

baton::v1::JobSpec TinySpec(int steps) {
  absl::StatusOr<baton::v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(R"({
    "name": "sim", "model": {"mlp": {"inputDim": 4, "width": 8, "depth": 1, "outputDim": 2}},
    "data": {"synthetic": {}, "batchSize": 8},
    "optimizer": {"sgd": {"learningRate": 0.1}}, "steps": )", steps, "}"));
  if (!spec.ok()) {
    std::fprintf(stderr, "bad spec: %s\n", spec.status().ToString().c_str());
    std::exit(1);
  }
  return *spec;
}

// The simulated workers' side of the coordinator's calls: StartJob is accepted and queued
// for the reporter, which sends each rank's successful result (after --job_seconds) over
// gRPC as the worker would; AbortJob is accepted. It also tracks which job each worker
// runs, for its heartbeats.
class SimWorkers final : public WorkerClient {
 public:
  absl::Status StartJob(const WorkerEndpoint& worker, const baton::v1::JobPlan& plan,
                        absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string id = plan.peers(plan.rank()).worker_id();
    running_[id] = plan.job_id();
    pending_.push_back({Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(job_seconds)),
                        plan});
    cv_.notify_one();
    return absl::OkStatus();
  }
  absl::StatusOr<AbortAnswer> AbortJob(const WorkerEndpoint& worker, const std::string& job_id,
                                       const std::string& reason,
                                       absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.insert(job_id);
    for (auto& [w, j] : running_) {
      if (j == job_id) j.clear();
    }
    cv_.notify_all();
    return AbortAnswer::kStopped;
  }
  std::string JobOf(const std::string& worker) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(worker);
    return it == running_.end() ? "" : it->second;
  }
  // Reports results until Stop.
  void Run(baton::v1::ClusterService::Stub* stub, const std::map<std::string, std::string>* sessions) {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        if (stop_) return;
        if (aborted_.count(pending_.front().plan.job_id()) > 0) {
          pending_.pop_front();
          continue;
        }
        const Clock::time_point due = pending_.front().due;
        if (Clock::now() < due) {  // an abort or Stop wakes it early
          cv_.wait_until(lock, due);
          continue;
        }
        p = pending_.front();
        pending_.pop_front();
      }
      const baton::v1::JobPlan& plan = p.plan;
      const std::string worker = plan.peers(plan.rank()).worker_id();
      baton::v1::ReportResultRequest r;
      r.set_worker_id(worker);
      r.set_job_id(plan.job_id());
      r.set_rank(plan.rank());
      r.set_attempt(plan.attempt());
      for (const baton::v1::StagePlan& s : plan.stages()) {
        if (plan.stage_to_rank(s.stage()) != plan.rank() % plan.num_ranks()) continue;
        for (int b = s.first_block(); b < s.last_block(); ++b) {
          baton::v1::IndexedBlockDigest* d = r.add_block_digests();
          d->set_index(b);
          d->mutable_digest()->set_sha256(std::string(64, '0'));
        }
      }
      grpc::ClientContext ctx;
      ctx.AddMetadata(kSessionMetadata, sessions->at(worker));
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      baton::v1::ReportResultResponse resp;
      stub->ReportResult(&ctx, r, &resp);
      std::lock_guard<std::mutex> lock(mu_);
      if (running_[worker] == plan.job_id()) running_[worker].clear();
      ++reported_;
    }
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  double job_seconds = 0;

 private:
  struct Pending {
    Clock::time_point due;
    baton::v1::JobPlan plan;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::map<std::string, std::string> running_;
  std::set<std::string> aborted_;
  bool stop_ = false;
  int64_t reported_ = 0;
};

// Every placement round's duration (ms), from the coordinator's own loop.
std::mutex& RoundsMu() {
  static std::mutex mu;
  return mu;
}
std::vector<double>& Rounds() {
  static std::vector<double> rounds;
  return rounds;
}

struct Server {
  std::unique_ptr<Coordinator> core;
  std::unique_ptr<JobServiceImpl> jobs;
  std::unique_ptr<ClusterServiceImpl> cluster;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

absl::StatusOr<Server> StartServer(const std::string& db, SimWorkers* sim, int port) {
  CoordinatorOptions o;
  o.db_path = db;
  o.worker_client = std::shared_ptr<WorkerClient>(sim, [](WorkerClient*) {});
  o.round_observer = [](absl::Duration d, size_t) {
    std::lock_guard<std::mutex> lock(RoundsMu());
    Rounds().push_back(absl::ToDoubleMilliseconds(d));
  };
  o.log = false;
  o.heartbeat_interval = absl::Seconds(1);
  o.lease_ttl = absl::Seconds(30);  // generous: the bench's own threads share two cores
  Server s;
  BATON_ASSIGN_OR_RETURN(s.core, Coordinator::Create(o));
  s.jobs = std::make_unique<JobServiceImpl>(s.core.get());
  s.cluster = std::make_unique<ClusterServiceImpl>(s.core.get());
  grpc::ServerBuilder b;
  int bound = 0;
  b.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(), &bound);
  b.RegisterService(s.jobs.get());
  b.RegisterService(s.cluster.get());
  s.server = b.BuildAndStart();
  if (s.server == nullptr || bound == 0) return absl::UnavailableError("cannot listen");
  s.address = absl::StrCat("127.0.0.1:", bound);
  return s;
}

int Main() {
  const int N = absl::GetFlag(FLAGS_workers);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    char tmpl[] = "/tmp/baton-control-plane.XXXXXX";
    dir = mkdtemp(tmpl);
  }
  const std::string db = dir + "/coordinator.db";
  std::filesystem::remove(db);
  std::printf("control_plane_bench: %d workers, %d queued jobs, %d history records, store %s\n",
              N, absl::GetFlag(FLAGS_queued), absl::GetFlag(FLAGS_history), db.c_str());
  std::printf("machine: %d cores (hardware_concurrency)\n", std::thread::hardware_concurrency());

  // ---- 1. history
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
    if (!store.ok()) return std::fprintf(stderr, "%s\n", store.status().ToString().c_str()), 1;
    baton::v1::JobSpec spec = TinySpec(1);
    const auto t0 = Clock::now();
    for (int i = 0; i < absl::GetFlag(FLAGS_history); ++i) {
      const int64_t seq = (*store)->NextSequence();
      baton::v1::Job j;
      j.set_id(absl::StrFormat("job-%06d", seq));
      *j.mutable_spec() = spec;
      j.set_state(baton::v1::JOB_STATE_SUCCEEDED);
      j.set_submitted_by("history");
      j.add_history()->set_reason("succeeded");
      j.set_weights_digest(std::string(64, 'a'));
      if (absl::Status s = (*store)->Insert(seq, j); !s.ok()) {
        return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
      }
    }
    std::printf("1. history: %d records written in %.1f s\n", absl::GetFlag(FLAGS_history),
                Ms(Clock::now() - t0) / 1e3);
  }
  SimWorkers sim;
  sim.job_seconds = absl::GetFlag(FLAGS_job_seconds);
  auto t_start = Clock::now();
  absl::StatusOr<Server> srv = StartServer(db, &sim, 0);
  if (!srv.ok()) return std::fprintf(stderr, "%s\n", srv.status().ToString().c_str()), 1;
  std::printf("   coordinator started on it in %.2f s; %s\n", Ms(Clock::now() - t_start) / 1e3,
              Usage().c_str());
  const int port = std::stoi(srv->address.substr(srv->address.rfind(':') + 1));

  // Placement rounds: timed in the coordinator's own loop (round_observer).
  auto take_rounds = [&] {
    std::lock_guard<std::mutex> lock(RoundsMu());
    std::vector<double> out;
    out.swap(Rounds());
    return out;
  };

  // ---- 2. workers
  auto channel = grpc::CreateChannel(srv->address, grpc::InsecureChannelCredentials());
  auto cluster = baton::v1::ClusterService::NewStub(channel);
  auto jobs = baton::v1::JobService::NewStub(channel);
  std::map<std::string, std::string> sessions;
  std::vector<std::string> ids;
  t_start = Clock::now();
  for (int i = 0; i < N; ++i) {
    baton::v1::RegisterWorkerRequest r;
    const std::string id = absl::StrFormat("sim-%04d", i);
    r.set_worker_id(id);
    r.set_address(absl::StrCat("127.0.0.1:", 20000 + i));  // one per worker (never dialled)
    r.mutable_device()->set_kind("cpu");
    r.set_session_token(absl::StrCat("session-of-", id, "-0123456789"));
    grpc::ClientContext ctx;
    baton::v1::RegisterWorkerResponse resp;
    if (grpc::Status st = cluster->RegisterWorker(&ctx, r, &resp); !st.ok()) {
      std::fprintf(stderr, "register %s: %s\n", id.c_str(), st.error_message().c_str());
      return 1;
    }
    sessions[id] = r.session_token();
    ids.push_back(id);
  }
  std::printf("2. %d workers registered in %.2f s\n", N, Ms(Clock::now() - t_start) / 1e3);
  std::thread reporter([&] { sim.Run(cluster.get(), &sessions); });

  std::atomic<bool> stop_beats{false};
  std::mutex beats_mu;
  std::vector<double> beats;
  std::vector<std::thread> beaters;
  const int T = absl::GetFlag(FLAGS_threads);
  for (int t = 0; t < T; ++t) {
    beaters.emplace_back([&, t] {
      auto stub = baton::v1::ClusterService::NewStub(
          grpc::CreateChannel(srv->address, grpc::InsecureChannelCredentials()));
      std::vector<double> mine;
      while (!stop_beats.load()) {
        const auto second = Clock::now();
        for (int i = t; i < N && !stop_beats.load(); i += T) {
          baton::v1::HeartbeatRequest r;
          r.set_worker_id(ids[i]);
          r.set_job_id(sim.JobOf(ids[i]));
          grpc::ClientContext ctx;
          ctx.AddMetadata(kSessionMetadata, sessions.at(ids[i]));
          baton::v1::HeartbeatResponse resp;
          const auto t0 = Clock::now();
          stub->Heartbeat(&ctx, r, &resp);
          mine.push_back(Ms(Clock::now() - t0));
        }
        {
          std::lock_guard<std::mutex> lock(beats_mu);
          beats.insert(beats.end(), mine.begin(), mine.end());
        }
        mine.clear();
        std::this_thread::sleep_until(second + std::chrono::seconds(1));
      }
    });
  }
  auto take_beats = [&] {
    std::lock_guard<std::mutex> lock(beats_mu);
    std::vector<double> out;
    out.swap(beats);
    return out;
  };
  std::this_thread::sleep_for(std::chrono::seconds(absl::GetFlag(FLAGS_heartbeat_seconds)));
  std::printf("   heartbeats, idle cluster: %s\n", Show(Of(take_beats())).c_str());
  std::printf("   placement rounds, empty queue: %s; %s\n", Show(Of(take_rounds())).c_str(),
              Usage().c_str());

  // ---- 3. a deep queue behind a busy cluster
  auto submit = [&](int steps) {
    baton::v1::SubmitJobRequest r;
    *r.mutable_spec() = TinySpec(steps);
    grpc::ClientContext ctx;
    baton::v1::Job job;
    grpc::Status st = jobs->SubmitJob(&ctx, r, &job);
    if (!st.ok()) std::fprintf(stderr, "submit: %s\n", st.error_message().c_str());
    return job.id();
  };
  std::vector<std::string> long_jobs;
  sim.job_seconds = 3600;  // the first N jobs hold every worker
  for (int i = 0; i < N; ++i) long_jobs.push_back(submit(1));
  while (true) {  // every worker busy
    baton::v1::ListWorkersRequest lr;
    baton::v1::ListWorkersResponse lw;
    grpc::ClientContext ctx;
    jobs->ListWorkers(&ctx, lr, &lw);
    int busy = 0;
    for (const auto& w : lw.workers()) busy += w.state() == baton::v1::WORKER_STATE_BUSY;
    if (busy == N) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  sim.job_seconds = absl::GetFlag(FLAGS_job_seconds);
  take_rounds();
  take_beats();
  const int Q = absl::GetFlag(FLAGS_queued);
  t_start = Clock::now();
  for (int i = 0; i < Q; ++i) submit(1);
  const double submit_s = Ms(Clock::now() - t_start) / 1e3;
  std::printf("3. %d jobs submitted in %.1f s (%.0f/s) while %d run\n", Q, submit_s, Q / submit_s,
              N);
  std::this_thread::sleep_for(std::chrono::seconds(absl::GetFlag(FLAGS_heartbeat_seconds)));
  std::printf("   placement rounds with %d queued (none can start): %s\n", Q,
              Show(Of(take_rounds())).c_str());
  std::printf("   heartbeats meanwhile: %s; %s\n", Show(Of(take_beats())).c_str(),
              Usage().c_str());

  // ---- 4. drain
  t_start = Clock::now();
  for (const std::string& id : long_jobs) {
    baton::v1::CancelJobRequest r;
    r.set_job_id(id);
    grpc::ClientContext ctx;
    baton::v1::Job job;
    jobs->CancelJob(&ctx, r, &job);
  }
  const double cancel_s = Ms(Clock::now() - t_start) / 1e3;
  t_start = Clock::now();
  for (;;) {
    baton::v1::ListJobsRequest lr;
    lr.set_page_size(1);
    baton::v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    jobs->ListJobs(&ctx, lr, &resp);
    if (!resp.jobs().empty() && resp.jobs(0).state() == baton::v1::JOB_STATE_SUCCEEDED) break;
    if (Clock::now() - t_start > std::chrono::minutes(10)) {
      std::printf("   the queue did not drain in 10 minutes\n");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const double drain_s = Ms(Clock::now() - t_start) / 1e3;
  std::printf("4. %d running jobs cancelled in %.1f s; the %d queued ran in %.1f s (%.0f jobs/s)\n",
              N, cancel_s, Q, drain_s, Q / drain_s);
  std::printf("   placement rounds while draining: %s\n", Show(Of(take_rounds())).c_str());
  std::printf("   heartbeats meanwhile: %s; %s\n", Show(Of(take_beats())).c_str(),
              Usage().c_str());

  // ---- 5. ListJobs over the store
  std::vector<double> pages;
  std::string token;
  for (int i = 0; i < 20; ++i) {
    baton::v1::ListJobsRequest lr;
    lr.set_page_size(1000);
    lr.set_page_token(token);
    baton::v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    const auto t0 = Clock::now();
    jobs->ListJobs(&ctx, lr, &resp);
    pages.push_back(Ms(Clock::now() - t0));
    token = resp.next_page_token();
    if (token.empty()) break;
  }
  std::printf("5. ListJobs, pages of 1000 over %d+ records: %s\n",
              absl::GetFlag(FLAGS_history) + Q + N, Show(Of(pages)).c_str());

  // ---- 6. restart
  stop_beats = true;
  for (auto& t : beaters) t.join();
  sim.Stop();
  reporter.join();
  srv->server->Shutdown();
  srv->core->Stop();
  srv->core.reset();
  t_start = Clock::now();
  absl::StatusOr<Server> again = StartServer(db, &sim, port);
  if (!again.ok()) return std::fprintf(stderr, "%s\n", again.status().ToString().c_str()), 1;
  std::printf("6. coordinator restarted on the store in %.2f s; %s\n",
              Ms(Clock::now() - t_start) / 1e3, Usage().c_str());
  again->server->Shutdown();
  again->core->Stop();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return baton::Main();
}
