#include "coordinator/coordinator_options.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(ValidateCoordinatorOptionsTest, NamesTheFlag) {
  struct Case {
    const char* name;
    void (*change)(CoordinatorOptions*);
    std::string starts;  // "": valid
  };
  const std::vector<Case> cases = {
      {"the defaults", [](CoordinatorOptions*) {}, ""},
      {"no heartbeat interval", [](CoordinatorOptions* o) { o->heartbeat_interval = {}; },
       "--heartbeat_interval:"},
      {"a lease no longer than the interval",
       [](CoordinatorOptions* o) { o->lease_ttl = o->heartbeat_interval; }, "--lease_ttl:"},
      {"no receive deadline", [](CoordinatorOptions* o) { o->recv_timeout = {}; },
       "--recv_timeout:"},
      {"a negative busy retry", [](CoordinatorOptions* o) { o->busy_retry = -absl::Seconds(1); },
       "start_timeout and abort_timeout"},
      {"no trace steps", [](CoordinatorOptions* o) { o->trace_steps = 0; }, "--trace_steps:"},
      {"no exports", [](CoordinatorOptions* o) { o->max_exports_per_caller = 0; },
       "--max_exports and"},
  };
  for (const Case& c : cases) {
    CoordinatorOptions o;
    c.change(&o);
    const absl::Status s = ValidateCoordinatorOptions(o);
    if (c.starts.empty()) {
      EXPECT_TRUE(s.ok()) << c.name << ": " << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(s.message().substr(0, c.starts.size()), c.starts) << c.name << ": " << s;
  }
}

TEST(CheckWorkerCredentialsTest, ByWhatTheClusterRequires) {
  CoordinatorOptions open;
  CoordinatorOptions token;
  token.join_token = "s3cret";
  CoordinatorOptions mtls;
  mtls.require_worker_certificate = true;
  WorkerCaller anonymous;
  WorkerCaller with_token;
  with_token.join_token = "s3cret";
  WorkerCaller wrong_token;
  wrong_token.join_token = "guess";
  WorkerCaller worker_cert;
  worker_cert.identity = "w-1";
  worker_cert.uris = {std::string(kWorkerUriPrefix) + "w-1"};
  WorkerCaller user_cert;
  user_cert.identity = "alice";
  struct Case {
    const char* name;
    const CoordinatorOptions& options;
    const WorkerCaller& caller;
    absl::StatusCode want;
  };
  const std::vector<Case> cases = {
      {"an open cluster", open, anonymous, absl::StatusCode::kOk},
      {"the token", token, with_token, absl::StatusCode::kOk},
      {"no token", token, anonymous, absl::StatusCode::kUnauthenticated},
      {"a wrong token", token, wrong_token, absl::StatusCode::kPermissionDenied},
      {"a worker's certificate", mtls, worker_cert, absl::StatusCode::kOk},
      {"no certificate", mtls, anonymous, absl::StatusCode::kUnauthenticated},
      {"a user's certificate", mtls, user_cert, absl::StatusCode::kPermissionDenied},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(CheckWorkerCredentials(c.options, c.caller).code(), c.want) << c.name;
  }
}

}  // namespace
}  // namespace baton
