// batonctl subcommands. Each takes the arguments after its name and returns the process
// exit code; errors are printed to stderr with what was wrong.
#ifndef BATON_CLIENT_BATONCTL_COMMANDS_H_
#define BATON_CLIENT_BATONCTL_COMMANDS_H_

#include <string>
#include <vector>

namespace baton::cli {

// batonctl train-local -f SPEC.json [--steps N] [--seed S] [--blas-threads T]
//                      [--output text|json]
int TrainLocal(const std::vector<std::string>& argv);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_COMMANDS_H_
