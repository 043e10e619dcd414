// The skeleton of batonctl's cluster commands (submit, get, list, watch, cancel, workers,
// history, trace, export). A command describes itself with a ClusterCommand (its name,
// usage text, own flags, what it takes as arguments, checks, and what it does with a
// connected client); RunClusterCommand does what they all share, in this order:
//
//   1. parses the arguments against the command's flags followed by the common ones
//      (cluster_client.h: --coordinator, --timeout, --output, --token_file, --tls_*, -h);
//   2. --help: prints the usage text, a blank line and the flag list; exits 0;
//   3. checks the positional arguments, then runs `check`;
//   4. runs `run_offline` instead when `offline` says the command needs no coordinator;
//   5. makes the ClusterClient from the common flags and runs `run` with it.
//
// Steps 1, 3 and 5 print "batonctl NAME: message" and exit 2 on a mistake in the command
// line; `run` returns the command's own exit code (ClusterClient::Fail prints RPC errors
// and returns 1).
#ifndef BATON_CLIENT_BATONCTL_CLUSTER_COMMAND_H_
#define BATON_CLIENT_BATONCTL_CLUSTER_COMMAND_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/batonctl/args.h"
#include "client/batonctl/cluster_client.h"

namespace baton::cli {

// What a command takes besides flags.
enum class Positional {
  kNone,    // nothing: "unexpected argument 'X'"
  kOneJob,  // one JOB id: "wants one JOB id"
  kOwn,     // the command's `check` decides
};

struct ClusterCommand {
  std::string name;             // "get": in messages ("batonctl get: ...") and ClusterClient
  std::string usage;            // --help's text before the flag list, without the final newline
  std::vector<FlagSpec> flags;  // the command's own; the common ones follow them
  Positional positional = Positional::kOneJob;
  absl::Duration default_timeout = absl::Seconds(10);  // --timeout's default
  // Empty: --output is the format, text or json (ClusterClient::json()). Otherwise the
  // command reads --output itself (a file name) and this is its help.
  std::string output_file_help;
  // Checks of the flags and arguments before connecting; an error exits 2 with its
  // message. May be empty.
  std::function<absl::Status(const Args&)> check;
  // When set and true for the arguments, the command runs `run_offline` and connects to
  // nothing (batonctl export --from DIR).
  std::function<bool(const Args&)> offline;
  std::function<int(const Args&)> run_offline;
  // The command itself; returns the exit code.
  std::function<int(const Args&, const ClusterClient&)> run;
};

// The command's flags followed by the common ones, --output's help replaced when the
// command gives one.
std::vector<FlagSpec> AllFlags(const ClusterCommand& command);

// Runs `command` on `argv` (the arguments after its name) as above; returns the exit code.
int RunClusterCommand(const ClusterCommand& command, const std::vector<std::string>& argv);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_CLUSTER_COMMAND_H_
