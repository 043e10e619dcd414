#include "coordinator/quotas.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/core/status.h"

namespace baton {

QuotaLimits DefaultLimits(const std::string& role) {
  QuotaLimits l;
  if (role == "admin") return l;
  l.max_priority = 0;  // submitters may lower theirs, not raise it; viewers submit nothing
  return l;
}

absl::StatusOr<QuotaRules> ParseQuotaRules(const std::string& text, const std::string& what) {
  QuotaRules out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    const std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(what, ":", number, ": ", why));
    };
    if (f.size() != 5) {
      return bad("want five fields: scope name max_workers max_queued max_priority");
    }
    std::map<std::string, QuotaLimits>* table = nullptr;
    if (f[0] == "role") {
      if (f[1] != "viewer" && f[1] != "submitter" && f[1] != "admin") {
        return bad(absl::StrCat("unknown role \"", f[1], "\" (viewer, submitter or admin)"));
      }
      table = &out.roles;
    } else if (f[0] == "user") {
      table = &out.users;
    } else {
      return bad(absl::StrCat("unknown scope \"", f[0], "\" (role or user)"));
    }
    QuotaLimits l;
    const char* names[] = {"max_workers", "max_queued", "max_priority"};
    std::optional<int>* slots[] = {&l.max_workers, &l.max_queued, &l.max_priority};
    for (int k = 0; k < 3; ++k) {
      const absl::string_view v = f[2 + k];
      if (v == "-") continue;
      int n = 0;
      if (!absl::SimpleAtoi(v, &n) || (k < 2 && n < 0)) {
        return bad(absl::StrCat(names[k], " must be ", k < 2 ? "a count >= 0" : "an integer",
                                " or '-', got \"", v, "\""));
      }
      *slots[k] = n;
    }
    if (!table->emplace(std::string(f[1]), l).second) {
      return bad(absl::StrCat(f[0], " ", f[1], " has a line already"));
    }
  }
  return out;
}

namespace {
absl::StatusOr<QuotaRules> ReadRules(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--quotas: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseQuotaRules(text.str(), path);
}
}  // namespace

absl::StatusOr<std::unique_ptr<QuotaBook>> QuotaBook::FromFile(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(QuotaRules rules, ReadRules(path));
  auto book = std::make_unique<QuotaBook>();
  book->path_ = path;
  MutexLock lock(book->mu_);
  book->rules_ = std::move(rules);
  return book;
}

absl::Status QuotaBook::Reload() {
  if (path_.empty()) return absl::FailedPreconditionError("no --quotas file to re-read");
  BATON_ASSIGN_OR_RETURN(QuotaRules rules, ReadRules(path_));
  MutexLock lock(mu_);
  rules_ = std::move(rules);
  return absl::OkStatus();
}

QuotaLimits QuotaBook::LimitsFor(const std::string& user, const std::string& role) const {
  MutexLock lock(mu_);
  if (auto it = rules_.users.find(user); it != rules_.users.end()) return it->second;
  if (auto it = rules_.roles.find(role); it != rules_.roles.end()) return it->second;
  return DefaultLimits(role);
}

}  // namespace baton
