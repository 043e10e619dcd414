// The baton coordinator: serves JobService (clients) and ClusterService (workers) on one
// port, keeps job records in SQLite. Wiring only; the logic is in coordinator.h.
//
//   coordinator --listen=127.0.0.1:7070 --db=baton-coordinator.db
//               --heartbeat_interval=1s --lease_ttl=5s --recv_timeout=60s [--port_file=F]
//               [--tls_cert=F --tls_key=F --tls_ca=F] [--auth_tokens=F] [--join_token_file=F]
//               [--health_listen=HOST:PORT] [--quotas=F] [--reserve_after=5m]
//               [--preempt=true] [--preempt_min_run=1m] [--preempt_min_steps=1]
//               [--preempt_penalty=10m] [--max_exports=4] [--max_exports_per_caller=2]
//
// Prints "coordinator listening on HOST:PORT" (the bound port, also with --listen
// HOST:0) on stdout once it serves. SIGTERM or SIGINT shut it down gracefully; SIGHUP
// re-reads --auth_tokens and --quotas (certificates are re-read by themselves, security.h).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/rpc/rpc.h"
#include "common/service/security_flags.h"
#include "common/service/server_startup.h"
#include "common/data/dataset.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service.h"
#include "common/core/paths.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port to serve JobService and ClusterService on (port 0 picks a free one)");
ABSL_FLAG(std::string, db, "baton-coordinator.db", "SQLite file holding the job records");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "how often workers are told to heartbeat");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(5),
          "a worker whose lease is not renewed for this long is dead (its job fails)");
ABSL_FLAG(absl::Duration, recv_timeout, absl::Seconds(60),
          "deadline of every tensor receive on the workers: the least; a job whose planned "
          "step is long gets more (docs/cluster.md)");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound host:port is also written to this file once serving");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9470",
          "host:port serving Prometheus metrics at /metrics (port 0: any free port; empty: "
          "no metrics)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics host:port is written to this file once serving");
ABSL_FLAG(std::string, data_root, "",
          "comma-separated directories jobs' text files may name (default: data/ beside this "
          "binary, and /usr/share/common-licenses); the workers check again with theirs");
ABSL_FLAG(int64_t, data_max_mb, 1024,
          "bound on one job text file, in MiB, as the workers' --data_max_mb: a larger file "
          "(or one that is not a regular file) this host sees under the data roots is refused "
          "at submit");
ABSL_FLAG(std::string, checkpoint_root, "",
          "the directory jobs' checkpoint.dir must lie under (a relative one is taken under "
          "it; default: checkpoints/ beside this binary); the workers check again with theirs");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of client tokens, one 'TOKEN NAME ROLE' per line (roles viewer, submitter, "
          "admin); JobService then needs 'authorization: Bearer TOKEN' (empty: anyone is admin)");
ABSL_FLAG(std::string, join_token_file, "",
          "file holding the cluster's join token: workers must send it to register");
ABSL_FLAG(std::string, worker_uri_prefix, baton::kWorkerUriPrefix,
          "with mutual TLS, a worker's certificate must carry a URI SAN starting with this "
          "(what tells it from a user's certificate of the same CA; docs/security.md)");
ABSL_FLAG(std::string, health_listen, "",
          "if set, host:port of a plaintext server answering grpc.health.v1 only (probes)");
ABSL_FLAG(std::string, quotas, "",
          "quota file: per-user and per-role max workers held, max jobs queued and max "
          "priority (coordinator/quotas.h); re-read on SIGHUP; empty: no limits but priority");
ABSL_FLAG(absl::Duration, reserve_after, absl::Minutes(5),
          "how long the first job in line that does not fit may be passed by smaller jobs "
          "before it holds the idle workers it can use (docs/cluster.md, \"Scheduling\")");
ABSL_FLAG(bool, preempt, true,
          "whether the first job in line may preempt running jobs of lower priority that write "
          "checkpoints (they stop at a step with its checkpoint and resume later; "
          "docs/cluster.md, \"Preemption\")");
ABSL_FLAG(absl::Duration, stop_grace, absl::Seconds(30),
          "a recovering or preempted job waits this long at most for its previous workers "
          "still stopping after their abort, before it is placed on fewer stages");
ABSL_FLAG(absl::Duration, preempt_min_run, absl::Minutes(1),
          "a job is not preempted before its attempt has run this long since it started or "
          "resumed (0: no bound), so preemptions cannot churn it");
ABSL_FLAG(int64_t, preempt_min_steps, 1,
          "nor before it trained this many steps since it started or resumed");
ABSL_FLAG(absl::Duration, preempt_penalty, absl::Minutes(10),
          "when a job that preempted others ends without training a step (it failed to start, "
          "or was cancelled first), its user's jobs may not preempt for this long");
ABSL_FLAG(int64_t, trace_steps, 200,
          "action timelines (batonctl trace) are kept for each job's latest this many steps");
ABSL_FLAG(int32_t, max_exports, 4,
          "ExportJob streams at once, in all; one more is refused with RESOURCE_EXHAUSTED "
          "(docs/checkpoints.md, \"Exporting\")");
ABSL_FLAG(int32_t, max_exports_per_caller, 2,
          "ExportJob streams at once per caller (token name; client host without tokens)");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "coordinator: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("baton coordinator: jobs, workers, placement (see coordinator.h)");
  absl::ParseCommandLine(argc, argv);
  baton::ShutdownSignals signals;  // before any thread starts

  const baton::TlsConfig tls = baton::TlsConfigFromFlags();
  // The TLS config is also the coordinator's for its calls to workers.
  if (absl::Status s = baton::ApplyServerSecurity(tls, absl::GetFlag(FLAGS_listen)); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  std::unique_ptr<baton::Authenticator> auth;
  if (const std::string f = absl::GetFlag(FLAGS_auth_tokens); !f.empty()) {
    auto loaded = baton::Authenticator::FromFile(f);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    auth = *std::move(loaded);
  }

  std::unique_ptr<baton::QuotaBook> quotas;
  if (const std::string f = absl::GetFlag(FLAGS_quotas); !f.empty()) {
    auto loaded = baton::QuotaBook::FromFile(f);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    quotas = *std::move(loaded);
  }

  baton::CoordinatorOptions options;
  options.quotas = quotas.get();
  options.reserve_after = absl::GetFlag(FLAGS_reserve_after);
  options.preempt = absl::GetFlag(FLAGS_preempt);
  options.preempt_min_run = absl::GetFlag(FLAGS_preempt_min_run);
  options.stop_grace = absl::GetFlag(FLAGS_stop_grace);
  options.preempt_min_steps = absl::GetFlag(FLAGS_preempt_min_steps);
  options.preempt_penalty = absl::GetFlag(FLAGS_preempt_penalty);
  options.db_path = absl::GetFlag(FLAGS_db);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  options.recv_timeout = absl::GetFlag(FLAGS_recv_timeout);
  options.trace_steps = absl::GetFlag(FLAGS_trace_steps);
  options.max_exports = absl::GetFlag(FLAGS_max_exports);
  options.max_exports_per_caller = absl::GetFlag(FLAGS_max_exports_per_caller);
  options.data_roots = baton::DataRootsFromFlag(absl::GetFlag(FLAGS_data_root));
  options.max_data_file_bytes = absl::GetFlag(FLAGS_data_max_mb) << 20;
  options.checkpoint_root = baton::CheckpointRootFromFlag(absl::GetFlag(FLAGS_checkpoint_root));
  options.require_worker_certificate = tls.mutual();
  options.worker_uri_prefix = absl::GetFlag(FLAGS_worker_uri_prefix);
  if (options.worker_uri_prefix.empty()) {
    return Fail("--worker_uri_prefix must not be empty: it is what tells workers' certificates "
                "from users'");
  }
  if (const std::string f = absl::GetFlag(FLAGS_join_token_file); !f.empty()) {
    absl::StatusOr<std::string> token = baton::ReadSecretFile(f, "--join_token_file");
    if (!token.ok()) return Fail(std::string(token.status().message()));
    options.join_token = *std::move(token);
  }

  baton::ServiceMetrics service_metrics("coordinator");
  baton::CoordinatorMetrics metrics(service_metrics.registry());
  if (absl::Status s =
          service_metrics.Serve(absl::GetFlag(FLAGS_metrics_listen), {metrics.StateCollector()});
      !s.ok()) {
    return Fail(s.ToString());
  }
  if (service_metrics.serving()) options.metrics = &metrics;

  const baton::AccessSetup access{tls.tls(), tls.mutual(), auth != nullptr,
                                  !options.join_token.empty()};
  absl::StatusOr<std::unique_ptr<baton::Coordinator>> core =
      baton::Coordinator::Create(std::move(options));
  if (!core.ok()) return Fail(core.status().ToString());

  baton::JobServiceImpl jobs(core->get(), baton::WatchLimits(), auth.get());
  baton::ClusterServiceImpl cluster(core->get());
  baton::ServiceStartup startup;
  startup.name = "coordinator";
  startup.server.address = absl::GetFlag(FLAGS_listen);
  startup.server.tls = tls;
  // People call JobService with tokens and no certificate; workers present theirs, and
  // ClusterService requires it (options.require_worker_certificate).
  startup.server.client_certs = baton::ClientCerts::kVerifyIfPresent;
  startup.server.services = {&jobs, &cluster};
  startup.port_file = absl::GetFlag(FLAGS_port_file);
  startup.health_listen = absl::GetFlag(FLAGS_health_listen);
  startup.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  startup.listening_note =
      tls.mutual() ? " (mutual TLS)" : tls.tls() ? " (TLS)" : " (plaintext)";
  startup.warnings = baton::OpenAccessWarnings(access);
  absl::StatusOr<std::unique_ptr<baton::RunningService>> running =
      baton::RunningService::Start(std::move(startup), &service_metrics);
  if (!running.ok()) return Fail(running.status().ToString());

  const int sig = signals.Wait([&auth, &quotas] {
    if (auth == nullptr) {
      std::fprintf(stderr, "coordinator: SIGHUP: no --auth_tokens to re-read\n");
    } else if (absl::Status s = auth->Reload(); !s.ok()) {
      std::fprintf(stderr, "coordinator: SIGHUP: keeping the old tokens: %s\n",
                   std::string(s.message()).c_str());
    } else {
      std::fprintf(stderr, "coordinator: SIGHUP: re-read %s\n",
                   absl::GetFlag(FLAGS_auth_tokens).c_str());
    }
    if (quotas == nullptr) return;
    if (absl::Status s = quotas->Reload(); !s.ok()) {
      std::fprintf(stderr, "coordinator: SIGHUP: keeping the old quotas: %s\n",
                   std::string(s.message()).c_str());
    } else {
      std::fprintf(stderr, "coordinator: SIGHUP: re-read %s\n", quotas->path().c_str());
    }
  });
  std::fprintf(stderr, "coordinator: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  // Readiness probes see NOT_SERVING at once.
  (*running)->StopServing();
  // End watches and the loop first, so streaming handlers return promptly; then let the
  // server finish what is in flight.
  (*core)->Stop();
  (*running)->Shutdown(absl::Seconds(5));
  core->reset();  // closes the job store
  return 0;
}
