// batonctl subcommands. Each takes the arguments after its name and returns the process
// exit code; errors are printed to stderr with what was wrong.
#ifndef BATON_CLIENT_BATONCTL_COMMANDS_H_
#define BATON_CLIENT_BATONCTL_COMMANDS_H_

#include <string>
#include <vector>

namespace baton::cli {

// batonctl train-local -f SPEC.json [--pipeline [--schedule-csv FILE]] [--steps N] [--seed S]
//                      [--blas-threads T]
//                      [--output text|json]
int TrainLocal(const std::vector<std::string>& argv);

// batonctl plan --schedule NAME --stages S --microbatches M [--virtual V] [--costs F=1,I=1,W=1]
//               [--output table|json|svg|csv] [--blocks N] [-f SPEC.json]
// batonctl plan --schedule custom --csv FILE [--costs ...] [--output ...]
// Builds (or imports), validates and simulates a pipeline schedule; no cluster needed.
int Plan(const std::vector<std::string>& argv);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_COMMANDS_H_
