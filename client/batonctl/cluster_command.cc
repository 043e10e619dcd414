#include "client/batonctl/cluster_command.h"

#include <cstdio>
#include <memory>
#include <utility>

namespace baton::cli {
namespace {

absl::Status CheckPositional(Positional positional, const Args& args) {
  const std::vector<std::string>& given = args.positional();
  switch (positional) {
    case Positional::kNone:
      if (!given.empty()) {
        return absl::InvalidArgumentError("unexpected argument '" + given[0] + "'");
      }
      return absl::OkStatus();
    case Positional::kOneJob:
      if (given.size() != 1) return absl::InvalidArgumentError("wants one JOB id");
      return absl::OkStatus();
    case Positional::kOwn:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Steps 3 and 4 of RunClusterCommand: what may be refused before connecting.
absl::Status CheckArguments(const ClusterCommand& command, const Args& args) {
  if (absl::Status s = CheckPositional(command.positional, args); !s.ok()) return s;
  if (command.check) return command.check(args);
  return absl::OkStatus();
}

}  // namespace

std::vector<FlagSpec> AllFlags(const ClusterCommand& command) {
  std::vector<FlagSpec> flags = WithClusterFlags(command.flags);
  if (command.output_file_help.empty()) return flags;
  for (FlagSpec& f : flags) {
    if (f.name == "output") f.help = command.output_file_help;
  }
  return flags;
}

int RunClusterCommand(const ClusterCommand& command, const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = AllFlags(command);
  absl::StatusOr<Args> args = Args::Parse(argv, flags);
  if (!args.ok()) return CommandFail(command.name, std::string(args.status().message()), 2);
  if (args->Has("help")) {
    std::printf("%s\n\n%s", command.usage.c_str(), FlagHelp(flags).c_str());
    return 0;
  }
  if (absl::Status s = CheckArguments(command, *args); !s.ok()) {
    return CommandFail(command.name, std::string(s.message()), 2);
  }
  if (command.offline && command.offline(*args)) return command.run_offline(*args);
  absl::StatusOr<std::unique_ptr<ClusterClient>> client =
      ClusterClient::Create(command.name, *args, command.default_timeout,
                            /*output_is_format=*/command.output_file_help.empty());
  if (!client.ok()) return CommandFail(command.name, std::string(client.status().message()), 2);
  return command.run(*args, **client);
}

}  // namespace baton::cli
