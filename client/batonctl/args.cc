#include "client/batonctl/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/log_text.h"

namespace baton::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<FlagSpec>& flags) {
  Args args;
  bool only_positional = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (only_positional || a.size() < 2 || a[0] != '-') {
      args.positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positional = true;
      continue;
    }
    std::string body = a.substr(a[1] == '-' ? 2 : 1);
    std::string value;
    bool has_value = false;
    if (const size_t eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
      has_value = true;
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : flags) {
      if (body == f.name || (!f.short_name.empty() && body == f.short_name)) spec = &f;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", EchoInput(a)));
    }
    if (spec->boolean) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", spec->name, " takes true or false, got '", EchoInput(value),
                         "'"));
      }
      args.values_[spec->name] = has_value ? value : "true";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", spec->name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values_[spec->name] = value;
  }
  return args;
}

std::string Args::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, " wants an integer, got '", EchoInput(it->second), "'"));
  }
  return v;
}

std::string FlagHelp(const std::vector<FlagSpec>& flags) {
  std::string out;
  for (const FlagSpec& f : flags) {
    std::string lhs = f.short_name.empty() ? "    " : absl::StrCat("-", f.short_name, ", ");
    absl::StrAppend(&lhs, "--", f.name, f.boolean ? "" : " VALUE");
    absl::StrAppend(&out, absl::StrFormat("  %-26s %s\n", lhs, f.help));
  }
  return out;
}

}  // namespace baton::cli
