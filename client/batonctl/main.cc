// batonctl: the baton command-line client. This file only dispatches to subcommands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/batonctl/commands.h"

namespace {
constexpr char kUsage[] =
    "usage: batonctl COMMAND [flags]\n"
    "\n"
    "commands:\n"
    "  train-local   train a job spec in this process with the reference trainer\n"
    "  plan          build, validate and simulate a pipeline schedule (no cluster)\n"
    "\n"
    "Run 'batonctl COMMAND --help' for a command's flags.\n";
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "train-local") return baton::cli::TrainLocal(rest);
  if (command == "plan") return baton::cli::Plan(rest);
  std::fprintf(stderr, "batonctl: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
