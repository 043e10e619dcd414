// A small command-line parser for batonctl's subcommands: `--name value`, `--name=value`,
// `-f value`, and boolean `--name`. Unknown flags and missing values are errors naming the
// flag.
#ifndef BATON_CLIENT_BATONCTL_ARGS_H_
#define BATON_CLIENT_BATONCTL_ARGS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::cli {

struct FlagSpec {
  std::string name;        // without dashes, e.g. "output"
  std::string short_name;  // e.g. "f", or empty
  bool boolean = false;    // takes no value
  std::string help;
};

class Args {
 public:
  // Parses `argv` (without the program and subcommand names) against `flags`.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<FlagSpec>& flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// "  -f, --file VALUE   help" lines for a usage message.
std::string FlagHelp(const std::vector<FlagSpec>& flags);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_ARGS_H_
