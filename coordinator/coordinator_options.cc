#include "coordinator/coordinator_options.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton {

absl::Status ValidateCoordinatorOptions(const CoordinatorOptions& options) {
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_interval: must be positive, got ",
                     absl::FormatDuration(options.heartbeat_interval)));
  }
  if (options.lease_ttl <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lease_ttl: must be longer than --heartbeat_interval (",
                     absl::FormatDuration(options.heartbeat_interval), "), got ",
                     absl::FormatDuration(options.lease_ttl)));
  }
  if (options.recv_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--recv_timeout: must be positive, got ",
                                                   absl::FormatDuration(options.recv_timeout)));
  }
  if (options.start_timeout <= absl::ZeroDuration() ||
      options.abort_timeout <= absl::ZeroDuration() || options.busy_retry < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "start_timeout and abort_timeout must be positive, busy_retry not negative");
  }
  if (options.trace_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace_steps: must be at least 1, got ", options.trace_steps));
  }
  if (options.max_exports < 1 || options.max_exports_per_caller < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_exports and --max_exports_per_caller: must be at least 1, got ",
                     options.max_exports, " and ", options.max_exports_per_caller));
  }
  return absl::OkStatus();
}

absl::Status CheckWorkerCredentials(const CoordinatorOptions& options, const WorkerCaller& caller) {
  if (options.require_worker_certificate && caller.identity.empty()) {
    return absl::UnauthenticatedError(
        "registering a worker needs a certificate signed by the cluster CA (mutual TLS)");
  }
  if (!options.join_token.empty()) {
    if (caller.join_token.empty()) {
      return absl::UnauthenticatedError(
          "registering a worker needs the cluster's join token (worker --join_token_file)");
    }
    if (!SecretsEqual(caller.join_token, options.join_token)) {
      return absl::PermissionDeniedError("wrong join token");
    }
  }
  if (options.require_worker_certificate &&
      std::none_of(caller.uris.begin(), caller.uris.end(), [&](const std::string& u) {
        return absl::StartsWith(u, options.worker_uri_prefix);
      })) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the certificate of ", caller.identity, " is not a worker's: it carries no URI SAN ",
        options.worker_uri_prefix, "... (docs/security.md, \"Worker certificates\")"));
  }
  return absl::OkStatus();
}

}  // namespace baton
