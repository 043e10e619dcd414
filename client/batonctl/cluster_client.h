// What batonctl's cluster commands (submit, get, list, watch, cancel, workers) share: the
// common flags, the channel to the coordinator's JobService, deadlines, error printing and
// output formatting.
//
// Common flags:
//   --coordinator HOST:PORT  the coordinator (default $BATON_COORDINATOR, else 127.0.0.1:7070)
//   --timeout DURATION       deadline of each RPC ("10s", "2m", "24h"; a bare number is
//                            seconds); 10s by default, 24h for watch's stream
//   -o, --output text|json   json: protobuf JSON (proto field names, every field printed)
//   --token_file FILE        bearer token sent as "authorization: Bearer ..." (default
//                            $BATON_TOKEN; none when neither is set)
//   --tls_ca FILE            speak TLS, verifying the coordinator against this CA (default
//                            $BATON_TLS_CA); --tls_cert/--tls_key add a client certificate,
//                            --tls_server_name checks another name than the host
//
// Errors print "batonctl COMMAND: CODE_NAME: message" to stderr (e.g. "batonctl submit:
// INVALID_ARGUMENT: model.gpt.heads: must divide d_model ...") and the command exits 1; a
// coordinator that cannot be reached is named: "cannot reach the coordinator at ADDR".
#ifndef BATON_CLIENT_BATONCTL_CLUSTER_CLIENT_H_
#define BATON_CLIENT_BATONCTL_CLUSTER_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/jobs.grpc.pb.h"
#include "client/batonctl/args.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

namespace baton::cli {

inline constexpr char kCoordinatorEnv[] = "BATON_COORDINATOR";
inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
inline constexpr char kTokenEnv[] = "BATON_TOKEN";
inline constexpr char kTlsCaEnv[] = "BATON_TLS_CA";

// `own` followed by --coordinator, --timeout, --output and --help.
std::vector<FlagSpec> WithClusterFlags(std::vector<FlagSpec> own);

// Prints "batonctl COMMAND: message" to stderr; returns 1 (or `code`).
int CommandFail(const std::string& command, const std::string& message, int code = 1);

// Parses a duration: absl syntax ("10s", "1m30s", "24h") or a bare number of seconds.
absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text);

class ClusterClient {
 public:
  // Reads the common flags of `args` and opens a channel (connection is lazy).
  // `output_is_format` false: the command reads --output itself (batonctl trace: a file).
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Create(const std::string& command,
                                                               const Args& args,
                                                               absl::Duration default_timeout,
                                                               bool output_is_format = true);

  baton::v1::JobService::Stub& stub() const { return *stub_; }
  const std::string& address() const { return address_; }
  const std::string& command() const { return command_; }
  bool json() const { return json_; }
  absl::Duration timeout() const { return timeout_; }

  // A context whose deadline is timeout() (or `timeout`) from now, carrying the token.
  std::unique_ptr<grpc::ClientContext> Context() const;
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;

  // Prints the failed RPC's status ("CODE_NAME: message"; for an unreachable coordinator
  // "cannot reach the coordinator at ADDR: ...", or "lost the connection to the coordinator
  // at ADDR: ..." when `was_connected`, e.g. a stream that had received events) and
  // returns 1.
  int Fail(const grpc::Status& status, bool was_connected = false) const;
  // Prints "CODE_NAME: message" and returns 1.
  int Fail(const absl::Status& status) const;

 private:
  std::string command_;
  std::string address_;
  bool json_ = false;
  absl::Duration timeout_;
  std::string token_;  // bearer token; empty: none sent
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<baton::v1::JobService::Stub> stub_;
};

// Protobuf JSON with proto field names and every field printed; `pretty` adds whitespace
// (one object over several lines), otherwise one line.
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// "QUEUED", "RUNNING", ... (the enum name without its prefix).
std::string JobStateName(baton::v1::JobState state);
std::string WorkerStateName(baton::v1::WorkerState state);
bool IsTerminal(baton::v1::JobState state);

// One line: "gpt (vocab 96, context 64, d_model 128, heads 4, layers 2), 1f1b, 4 stages x 1
// chunk, 4 micro-batches, batch 32, 300 steps, seed 42".
std::string DescribeSpec(const baton::v1::JobSpec& spec);

// "12:03:04" in local time; "-" for an unset timestamp.
std::string FormatClock(const google::protobuf::Timestamp& t);
// "2024-05-01 12:03:04" in local time; "-" for an unset timestamp.
std::string FormatDateTime(const google::protobuf::Timestamp& t);
// "0:42", "12:03", "1:02:03".
std::string FormatEta(double seconds);

// Watches `job_id` until it ends (watch and submit --watch), the stream having a deadline
// `stream_timeout` from now. Returns the exit code: 0 when the job SUCCEEDED, 1 otherwise
// (or when the watch itself failed).
int WatchUntilDone(const ClusterClient& client, const std::string& job_id,
                   absl::Duration stream_timeout);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_CLUSTER_CLIENT_H_
