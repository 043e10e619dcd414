// Who may call the coordinator's JobService: bearer tokens with roles.
//
// Clients send "authorization: Bearer TOKEN" in the request metadata. The tokens come from a
// file (--auth_tokens), one per line, '#' starting a comment:
//
//   # token                             name    role
//   3f9c0a7e5b1d4c2a8e6f0b9d7c5a3e1f    alice   submitter
//   8d2e4f6a0c1b3d5e7f9a2c4e6b8d0f1a    ci-bot  admin
//
// Roles, each allowing what the one before allows:
//   viewer     GetJob, ListJobs, WatchJob, GetJobTrace, GetJobHistory, ListWorkers
//   submitter  also SubmitJob, and CancelJob of the jobs it submitted
//   admin      also CancelJob of any job
// A missing or unknown token is UNAUTHENTICATED; a known token asking for more than its role
// allows is PERMISSION_DENIED. Tokens are compared in constant time and never logged or put
// in an error message. Without a token file every caller is "anonymous" with the admin role
// (the loopback demo).
//
// Thread-safe: Authenticate may run while Reload replaces the tokens.
#ifndef BATON_COORDINATOR_AUTH_H_
#define BATON_COORDINATOR_AUTH_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/core/mutex.h"

namespace baton {

enum class Role { kViewer = 1, kSubmitter = 2, kAdmin = 3 };

absl::string_view RoleName(Role role);

struct Principal {
  std::string name;
  Role role = Role::kViewer;
};

// The name jobs are recorded under when no token file is configured.
inline constexpr char kAnonymous[] = "anonymous";

// Shortest accepted token, in characters: shorter ones are guessable.
inline constexpr int kMinTokenChars = 16;

class Authenticator {
 public:
  // Every caller is {kAnonymous, admin}.
  Authenticator() = default;
  // Reads the token file; INVALID_ARGUMENT naming the file and line for a malformed line
  // (not three fields, an unknown role, a token under kMinTokenChars, a name outside
  // [A-Za-z0-9._@-], a duplicate token).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);

  // Re-reads the file (SIGHUP). On error the tokens in use stay and the error is returned.
  absl::Status Reload();

  bool enabled() const { return !path_.empty(); }

  // The caller presenting `authorization` (the metadata value, "Bearer TOKEN").
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization) const;

 private:
  struct Entry {
    std::string token;
    Principal principal;
  };
  static absl::StatusOr<std::vector<Entry>> Load(const std::string& path);

  std::string path_;
  mutable Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// OK when `who` may do something needing `needed`; PERMISSION_DENIED naming the caller, its
// role and `what` ("cancel job j-3") otherwise.
absl::Status Authorize(const Principal& who, Role needed, absl::string_view what);

// How a coordinator was started, as far as who may call it goes.
struct AccessSetup {
  bool tls = false;         // its port speaks TLS
  bool mutual_tls = false;  // and verifies client certificates (workers must present one)
  bool tokens = false;      // --auth_tokens
  bool join_token = false;  // --join_token_file
};

// What this setup lets any caller who reaches the port do, one plain sentence each, for
// the coordinator to print at start-up; empty when nothing is open (tokens, and workers
// admitted by certificate or join token, over TLS).
std::vector<std::string> OpenAccessWarnings(const AccessSetup& setup);

}  // namespace baton

#endif  // BATON_COORDINATOR_AUTH_H_
