// The baton worker: serves WorkerService and TensorService, registers with the
// coordinator, and runs the jobs it is given. Only wiring here; see worker_agent.h.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/blas_kernels.h"
#include "common/core/host_info.h"
#include "common/core/paths.h"
#include "common/rpc/rpc.h"
#include "common/service/security_flags.h"
#include "common/service/server_startup.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"
#include "worker/service.h"
#include "worker/worker_agent.h"
#include "worker/worker_device.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "coordinator host:port");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0: any free port)");
ABSL_FLAG(std::string, advertise, "",
          "host:port the coordinator and peers reach this worker on (default: --listen with "
          "the bound port)");
ABSL_FLAG(std::string, worker_id, "", "stable worker name (default: assigned)");
ABSL_FLAG(std::string, port_file, "", "write the bound host:port to this file once serving");
ABSL_FLAG(int64_t, inbox_mb, 512, "bound on received tensors not yet consumed, in MiB");
ABSL_FLAG(std::string, data_root, "",
          "comma-separated directories jobs' text files may be read from (default: data/ "
          "beside this binary, and /usr/share/common-licenses)");
ABSL_FLAG(int64_t, data_max_mb, 1024, "bound on one job text file, in MiB");
ABSL_FLAG(int64_t, memory_mb, 0,
          "the memory this worker offers jobs, in MiB (default: what its limits allow: the "
          "host's RAM, or less under an address-space, data or cgroup limit; a GPU's memory)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "the directory jobs may write checkpoints under and resume from (default: "
          "checkpoints/ beside this binary)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "host:port serving Prometheus metrics at /metrics (port 0: any free port; empty: "
          "no metrics)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "write the bound metrics host:port to this file once serving");
ABSL_FLAG(std::string, join_token_file, "",
          "file holding the cluster's join token, sent when registering with the coordinator");
ABSL_FLAG(std::string, health_listen, "",
          "if set, host:port of a plaintext server answering grpc.health.v1 only (probes)");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads a job's matrix products use (0: the cores this process may run on, "
          "its affinity mask); results do not depend on it");
ABSL_FLAG(std::string, device, "",
          "the device this worker owns: cpu, cuda or cuda:N (default: the first visible GPU, "
          "else the CPU)");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "worker: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  baton::ChooseBlasKernels(argv);  // may re-execute this process: before anything else
  absl::ParseCommandLine(argc, argv);
  baton::ShutdownSignals signals;  // before any thread starts
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0) return Fail(absl::StrCat("--threads: ", threads, " is negative"));
  baton::SetBlasThreads(threads > 0 ? threads : baton::UsableCores());  // starts them
  std::fprintf(stderr, "worker: matrix kernels: %s; %d threads\n",
               baton::CurrentBlasKernels().Describe().c_str(), baton::BlasThreads());

  const baton::TlsConfig tls = baton::TlsConfigFromFlags();
  // The TLS config is also the one of the channels to the coordinator and to peers.
  if (absl::Status s = baton::ApplyServerSecurity(tls, absl::GetFlag(FLAGS_listen)); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  baton::TensorInbox inbox;
  baton::RendezvousBox rendezvous;  // peers' NCCL ids and verdicts, until a job takes them
  baton::TensorServiceImpl::Options tensor_options;
  tensor_options.rendezvous = &rendezvous;
  baton::TensorServiceImpl tensors(&inbox, tensor_options);
  baton::WorkerOptions options;
  options.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.inbox_bytes = absl::GetFlag(FLAGS_inbox_mb) << 20;
  options.data.roots = baton::DataRootsFromFlag(absl::GetFlag(FLAGS_data_root));
  options.checkpoint_root = baton::CheckpointRootFromFlag(absl::GetFlag(FLAGS_checkpoint_root));
  options.data.max_file_bytes = absl::GetFlag(FLAGS_data_max_mb) << 20;
  if (const std::string f = absl::GetFlag(FLAGS_join_token_file); !f.empty()) {
    absl::StatusOr<std::string> token = baton::ReadSecretFile(f, "--join_token_file");
    if (!token.ok()) return Fail(std::string(token.status().message()));
    options.join_token = *std::move(token);
  }
  absl::StatusOr<baton::v1::DeviceInfo> device = baton::ClaimDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Fail(absl::StrCat("--device: ", device.status().message()));
  options.device = *std::move(device);
  // The denominator of the jobs' MFU, said once.
  if (options.device.peak_flops() > 0) {
    std::fprintf(
        stderr, "worker: %s peak %.1f GFLOP/s fp32, %.1f bf16 (%s)\n",
        options.device.name().c_str(), options.device.peak_flops() / 1e9,
        options.device.peak_flops_bf16() / 1e9,
        options.device.kind() == "cpu" ? "measured by 384^3 products at start" : "datasheet");
  } else {
    std::fprintf(stderr, "worker: %s: peak unknown, jobs report no MFU for it\n",
                 options.device.name().c_str());
  }
  if (const int64_t mb = absl::GetFlag(FLAGS_memory_mb); mb > 0) {
    options.device.set_memory_bytes(mb << 20);
  }
  options.rendezvous = &rendezvous;

  options.advertise_address = absl::GetFlag(FLAGS_advertise);

  baton::ServiceMetrics service_metrics("worker");
  baton::WorkerMetrics metrics(service_metrics.registry());
  if (absl::Status s = service_metrics.Serve(absl::GetFlag(FLAGS_metrics_listen)); !s.ok()) {
    return Fail(s.ToString());
  }
  if (service_metrics.serving()) options.metrics = &metrics;

  // A broken GPU context ends this process (exit status 3): its supervisor starts a new one.
  static std::atomic<bool> device_fault{false};
  options.on_device_fault = [](const absl::Status&) {
    device_fault = true;
    kill(getpid(), SIGTERM);  // main's signals.Wait below shuts down as on a signal
  };
  baton::WorkerAgent agent(options, &inbox);
  baton::WorkerServiceImpl service(&agent);
  baton::ServiceStartup startup;
  startup.name = "worker";
  startup.server.address = absl::GetFlag(FLAGS_listen);
  startup.server.services = {&service, &tensors};
  startup.server.tls = tls;
  // Only cluster members call a worker: with a CA, a certificate it signed is required.
  startup.server.client_certs = baton::ClientCerts::kRequire;
  startup.port_file = absl::GetFlag(FLAGS_port_file);
  startup.health_listen = absl::GetFlag(FLAGS_health_listen);
  startup.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  absl::StatusOr<std::unique_ptr<baton::RunningService>> running =
      baton::RunningService::Start(std::move(startup), &service_metrics);
  if (!running.ok()) return Fail(running.status().ToString());
  // With port 0 the address to advertise is known only now.
  if (options.advertise_address.empty()) agent.SetAdvertiseAddress((*running)->address());
  agent.Start();

  const int sig = signals.Wait([&tls] {
    std::fprintf(stderr,
                 "worker: SIGHUP: nothing to reload (certificate files are re-read every %s)\n",
                 absl::FormatDuration(tls.reload_interval).c_str());
  });
  std::fprintf(stderr, "worker: signal %d, shutting down\n", sig);
  // Readiness probes see NOT_SERVING at once; the job is aborted and reported.
  (*running)->StopServing();
  agent.Stop();
  (*running)->Shutdown(absl::Seconds(3));
  inbox.Close();
  return device_fault ? 3 : 0;
}
