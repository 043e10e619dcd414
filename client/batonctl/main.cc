// batonctl: the baton command-line client. This file only dispatches to subcommands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/batonctl/commands.h"
#include "common/core/blas_kernels.h"

namespace {
constexpr char kUsage[] =
    "usage: batonctl COMMAND [flags]\n"
    "\n"
    "commands:\n"
    "  train-local   train a job spec in this process with the reference trainer\n"
    "  plan          build, validate and simulate a pipeline schedule (no cluster)\n"
    "  sample        generate text from a checkpoint or a Hugging Face model directory\n"
    "\n"
    "cluster commands (--coordinator HOST:PORT, default $BATON_COORDINATOR or 127.0.0.1:7070;\n"
    "--output json for scripts):\n"
    "  submit        submit a job spec (-f SPEC.json; flags override its fields)\n"
    "  get           show a job: state and history, progress, workers, digest\n"
    "  list          list jobs, newest first\n"
    "  watch         follow a job to its end (exit 0 only if it succeeded)\n"
    "  cancel        cancel a queued or running job\n"
    "  priority      change a waiting job's priority (admins)\n"
    "  workers       list the workers and what they run\n"
    "  history       show a job's loss and throughput, one row per step (--csv)\n"
    "  trace         write one step's action timeline as Chrome trace-event JSON\n"
    "  export        write a job's weights from a checkpoint (safetensors, or --format hf)\n"
    "\n"
    "Run 'batonctl COMMAND --help' for a command's flags.\n";
}  // namespace

int main(int argc, char** argv) {
  // train-local computes, and its digests are compared with the workers': the same kernels
  // (may re-execute this process, before anything else).
  if (argc >= 2 &&
      (std::strcmp(argv[1], "train-local") == 0 || std::strcmp(argv[1], "sample") == 0)) {
    baton::ChooseBlasKernels(argv);
  }
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "train-local") return baton::cli::TrainLocal(rest);
  if (command == "plan") return baton::cli::Plan(rest);
  if (command == "sample") return baton::cli::Sample(rest);
  if (command == "submit") return baton::cli::Submit(rest);
  if (command == "get") return baton::cli::Get(rest);
  if (command == "list") return baton::cli::List(rest);
  if (command == "watch") return baton::cli::Watch(rest);
  if (command == "cancel") return baton::cli::Cancel(rest);
  if (command == "priority") return baton::cli::Priority(rest);
  if (command == "workers") return baton::cli::Workers(rest);
  if (command == "history") return baton::cli::History(rest);
  if (command == "trace") return baton::cli::Trace(rest);
  if (command == "export") return baton::cli::Export(rest);
  std::fprintf(stderr, "batonctl: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
