// Quotas: how much of the cluster each user may hold and queue, and the highest priority
// it may ask for.
//
// From a file (--quotas), one rule per line, '#' starting a comment:
//
//   # scope  name        max_workers  max_queued  max_priority
//   role     submitter   16           50          0
//   role     admin       -            -           100
//   user     alice       8            20          5
//
// A "role" line gives every user with that role (auth.h) its limits; a "user" line gives one
// user (a token's name) its own, replacing its role's. '-' is no limit. Limits apply to each
// user separately:
//   max_workers   workers its running jobs hold at once: a job that would exceed it waits,
//                 saying so;
//   max_queued    its jobs waiting in the queue: a submission beyond it is refused with
//                 RESOURCE_EXHAUSTED naming the limit;
//   max_priority  the highest JobSpec.priority it may submit with (PERMISSION_DENIED above).
// Without a file (or for a user and role without a line) nothing is limited except priority:
// a submitter may ask for at most 0 (lower is fine), a viewer submits nothing, an admin may
// ask for anything.
//
// Thread-safe: LimitsFor may run while Reload replaces the rules (SIGHUP).
#ifndef BATON_COORDINATOR_QUOTAS_H_
#define BATON_COORDINATOR_QUOTAS_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/core/mutex.h"

namespace baton {

struct QuotaLimits {
  std::optional<int> max_workers;
  std::optional<int> max_queued;
  std::optional<int> max_priority;
};

// The limits of `role` ("viewer", "submitter", "admin") without any file.
QuotaLimits DefaultLimits(const std::string& role);

// Parses a quota file's text; INVALID_ARGUMENT naming `what` (the file) and the line for a
// malformed line (not five fields, an unknown scope or role, a negative or non-numeric
// limit, a name twice).
struct QuotaRules {
  std::map<std::string, QuotaLimits> roles;
  std::map<std::string, QuotaLimits> users;
};
absl::StatusOr<QuotaRules> ParseQuotaRules(const std::string& text, const std::string& what);

class QuotaBook {
 public:
  // No file: DefaultLimits for everyone.
  QuotaBook() = default;
  static absl::StatusOr<std::unique_ptr<QuotaBook>> FromFile(const std::string& path);
  // Re-reads the file (SIGHUP). On error the rules in use stay and the error is returned.
  absl::Status Reload();
  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  // The limits of `user`, whose role is `role`: its user line, else its role's line, else
  // DefaultLimits(role).
  QuotaLimits LimitsFor(const std::string& user, const std::string& role) const;

 private:
  std::string path_;
  mutable Mutex mu_;
  QuotaRules rules_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_COORDINATOR_QUOTAS_H_
