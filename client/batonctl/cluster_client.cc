#include "client/batonctl/cluster_client.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/rpc/rpc.h"
#include "common/schedule/vocabulary.h"
#include "common/spec/spec.h"
#include "google/protobuf/util/json_util.h"

namespace baton::cli {

std::vector<FlagSpec> WithClusterFlags(std::vector<FlagSpec> own) {
  own.push_back({"coordinator", "", false,
                 absl::StrCat("coordinator host:port (default $", kCoordinatorEnv, ", else ",
                              kDefaultCoordinator, ")")});
  own.push_back({"token_file", "", false,
                 absl::StrCat("file holding the bearer token for the coordinator (default $",
                              kTokenEnv, ")")});
  own.push_back({"tls_ca", "", false,
                 absl::StrCat("PEM CA to verify the coordinator with: speak TLS (default $",
                              kTlsCaEnv, ")")});
  own.push_back({"tls_cert", "", false, "PEM client certificate (mutual TLS; optional)"});
  own.push_back({"tls_key", "", false, "PEM key of --tls_cert"});
  own.push_back({"tls_server_name", "", false,
                 "name to check the coordinator's certificate against instead of its host"});
  own.push_back({"timeout", "", false,
                 "RPC deadline, e.g. 10s, 2m, 24h (default 10s; watch: 24h)"});
  own.push_back({"output", "o", false, "text (default) or json"});
  own.push_back({"help", "h", true, "show this help"});
  return own;
}

int CommandFail(const std::string& command, const std::string& message, int code) {
  std::fprintf(stderr, "batonctl %s: %s\n", command.c_str(), message.c_str());
  return code;
}

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout wants a duration such as 10s, 2m or 24h, got '", text, "'"));
  }
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be positive and finite, got '", text, "'"));
  }
  return d;
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(
    const std::string& command, const Args& args, absl::Duration default_timeout,
    bool output_is_format) {
  auto c = std::unique_ptr<ClusterClient>(new ClusterClient());
  c->command_ = command;
  const char* env = std::getenv(kCoordinatorEnv);
  c->address_ = args.Get("coordinator", env != nullptr && *env != '\0' ? env : kDefaultCoordinator);
  if (c->address_.empty() || c->address_.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator wants host:port, got '", c->address_, "'"));
  }
  const std::string output = output_is_format ? args.Get("output", "text") : "text";
  if (output != "text" && output != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--output must be text or json, got '", output, "'"));
  }
  c->json_ = output == "json";
  c->timeout_ = default_timeout;
  if (args.Has("timeout")) {
    absl::StatusOr<absl::Duration> t = ParseTimeout(args.Get("timeout"));
    if (!t.ok()) return t.status();
    c->timeout_ = *t;
  }
  TlsConfig tls;
  const char* ca_env = std::getenv(kTlsCaEnv);
  tls.ca_file = args.Get("tls_ca", ca_env != nullptr ? ca_env : "");
  tls.cert_file = args.Get("tls_cert", "");
  tls.key_file = args.Get("tls_key", "");
  tls.server_name = args.Get("tls_server_name", "");
  if (absl::Status s = CheckTlsConfig(tls); !s.ok()) return s;
  SetProcessTls(tls);
  if (args.Has("token_file")) {
    absl::StatusOr<std::string> token = ReadSecretFile(args.Get("token_file"), "--token_file");
    if (!token.ok()) return token.status();
    c->token_ = *std::move(token);
  } else if (const char* t = std::getenv(kTokenEnv); t != nullptr && *t != '\0') {
    c->token_ = std::string(absl::StripAsciiWhitespace(t));
  }
  c->channel_ = MakeChannel(c->address_);
  c->stub_ = baton::v1::JobService::NewStub(c->channel_);
  return c;
}

std::unique_ptr<grpc::ClientContext> ClusterClient::Context() const { return Context(timeout_); }

std::unique_ptr<grpc::ClientContext> ClusterClient::Context(absl::Duration timeout) const {
  std::unique_ptr<grpc::ClientContext> ctx = ContextWithTimeout(timeout);
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  return ctx;
}

int ClusterClient::Fail(const grpc::Status& status, bool was_connected) const {
  const absl::Status s = FromGrpcStatus(status);
  const std::string what = absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
  const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/false);
  const bool unreachable =
      (s.code() == absl::StatusCode::kUnavailable ||
       s.code() == absl::StatusCode::kDeadlineExceeded) &&
      state != GRPC_CHANNEL_READY;
  if (unreachable && was_connected) {
    return CommandFail(command_, absl::StrCat("lost the connection to the coordinator at ",
                                              address_, ": ", what));
  }
  if (unreachable) {
    return CommandFail(command_,
                       absl::StrCat("cannot reach the coordinator at ", address_, ": ", what,
                                    " (is it running? set --coordinator or $",
                                    kCoordinatorEnv, ")"));
  }
  return CommandFail(command_, what);
}

int ClusterClient::Fail(const absl::Status& status) const {
  return CommandFail(command_,
                     absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = pretty;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string out;
  const auto st = google::protobuf::util::MessageToJsonString(message, &out, opts);
  if (!st.ok()) {
    // Only reachable with invalid UTF-8 in a string field; keep the output parseable.
    return absl::StrCat("{\"error\": \"cannot print ", message.GetTypeName(), " as JSON\"}",
                        pretty ? "\n" : "");
  }
  if (pretty && (out.empty() || out.back() != '\n')) out.push_back('\n');
  while (!pretty && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string JobStateName(baton::v1::JobState state) {
  std::string name = baton::v1::JobState_Name(state);
  constexpr char kPrefix[] = "JOB_STATE_";
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(sizeof(kPrefix) - 1);
  return name.empty() ? absl::StrCat("STATE_", static_cast<int>(state)) : name;
}

std::string WorkerStateName(baton::v1::WorkerState state) {
  std::string name = baton::v1::WorkerState_Name(state);
  constexpr char kPrefix[] = "WORKER_STATE_";
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(sizeof(kPrefix) - 1);
  return name.empty() ? absl::StrCat("STATE_", static_cast<int>(state)) : name;
}

bool IsTerminal(baton::v1::JobState state) {
  return state == baton::v1::JOB_STATE_SUCCEEDED || state == baton::v1::JOB_STATE_FAILED ||
         state == baton::v1::JOB_STATE_CANCELLED;
}

namespace {
std::string ScheduleName(baton::v1::Schedule s) {
  if (s == baton::v1::SCHEDULE_UNSPECIFIED) return "1f1b (default)";
  absl::StatusOr<const ScheduleEntry*> e = ScheduleEntryForSpecValue(static_cast<int>(s));
  return e.ok() ? (*e)->name : absl::StrCat("schedule ", static_cast<int>(s), " (unknown)");
}
}  // namespace

std::string DescribeSpec(const baton::v1::JobSpec& spec) {
  const std::string model = DescribeModel(spec.model());
  const auto& p = spec.pipeline();
  const int stages = std::max(1, p.stages());
  const int chunks = std::max(1, p.virtual_stages());
  const int micro = std::max(1, p.microbatches());
  std::string extra;
  if (p.data_parallel() > 1) {
    absl::StrAppend(&extra, " x ", p.data_parallel(), " replicas");
    if (p.reduce_mode() == baton::v1::REDUCE_MODE_FAST) absl::StrAppend(&extra, " (fast sum)");
  }
  if (p.recompute() == baton::v1::RECOMPUTE_FULL) {
    absl::StrAppend(&extra, ", recompute");
    if (!p.recompute_stages().empty()) {
      absl::StrAppend(&extra, " (stages ", absl::StrJoin(p.recompute_stages(), ","), ")");
    }
  }
  if (spec.precision() == baton::v1::PRECISION_BF16) absl::StrAppend(&extra, ", bf16");
  if (spec.allow_tf32()) absl::StrAppend(&extra, ", tf32 allowed");
  if (spec.attention() != baton::v1::ATTENTION_KERNEL_UNSPECIFIED) {
    absl::StrAppend(&extra, ", attention ",
                    absl::AsciiStrToLower(absl::StripPrefix(
                        baton::v1::AttentionKernel_Name(spec.attention()), "ATTENTION_KERNEL_")));
  }
  return absl::StrFormat("%s, %s, %d stage%s x %d chunk%s%s, %d micro-batch%s, batch %d, %d "
                         "steps, seed %d",
                         model, ScheduleName(p.schedule()), stages, stages == 1 ? "" : "s",
                         chunks, chunks == 1 ? "" : "s", extra, micro, micro == 1 ? "" : "es",
                         spec.data().batch_size(), spec.steps(), spec.seed());
}

std::string FormatClock(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%H:%M:%S", FromProtoTime(t), absl::LocalTimeZone());
}

std::string FormatDateTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", FromProtoTime(t), absl::LocalTimeZone());
}

std::string FormatEta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace baton::cli
