#include "common/rpc/security.h"
#include "common/core/mutex.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace baton {
namespace {

absl::Status CheckReadable(const std::string& path, absl::string_view flag) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read ", path, " (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

unsigned int ReloadSeconds(const TlsConfig& config) {
  const int64_t s = absl::ToInt64Seconds(config.reload_interval);
  return static_cast<unsigned int>(s < 1 ? 1 : s);
}

Mutex process_mu;
TlsConfig* process_tls = nullptr;  // guarded by process_mu; leaked on purpose

}  // namespace

absl::Status CheckTlsConfig(const TlsConfig& config) {
  if (config.cert_file.empty() != config.key_file.empty()) {
    return absl::InvalidArgumentError(
        config.cert_file.empty() ? "--tls_key needs --tls_cert" : "--tls_cert needs --tls_key");
  }
  if (config.insecure && config.tls()) {
    return absl::InvalidArgumentError(
        "--insecure contradicts --tls_cert/--tls_ca: give one or the other");
  }
  if (!config.cert_file.empty()) {
    if (absl::Status s = CheckReadable(config.cert_file, "--tls_cert"); !s.ok()) return s;
    if (absl::Status s = CheckReadable(config.key_file, "--tls_key"); !s.ok()) return s;
  }
  if (!config.ca_file.empty()) {
    if (absl::Status s = CheckReadable(config.ca_file, "--tls_ca"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::string_view host = address;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == absl::string_view::npos ? host.size() - 1
                                                                    : host.find(']') - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  const std::string h = absl::AsciiStrToLower(host);
  return h == "localhost" || h == "::1" || absl::StartsWith(h, "127.");
}

absl::Status CheckServerSecurity(const TlsConfig& config, absl::string_view listen) {
  if (absl::Status s = CheckTlsConfig(config); !s.ok()) return s;
  if (config.tls() && config.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca alone cannot serve TLS: a server needs --tls_cert and --tls_key");
  }
  if (!config.tls() && !config.insecure && !IsLoopbackAddress(listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve plaintext on ", listen,
        ", which is not a loopback address: give --tls_cert, --tls_key and --tls_ca, or "
        "--insecure to accept that anyone on the network can call this service"));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& config,
                                                               ClientCerts client_certs) {
  if (!config.tls()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.key_file, config.cert_file, config.ca_file, ReloadSeconds(config));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  grpc_ssl_client_certificate_request_type request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  if (!config.ca_file.empty()) {
    options.watch_root_certs();
    if (client_certs == ClientCerts::kRequire) {
      request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    } else if (client_certs == ClientCerts::kVerifyIfPresent) {
      request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
    }
  }
  options.set_cert_request_type(request);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsConfig& config,
                                                                 grpc::ChannelArguments* args) {
  if (!config.tls()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (!config.cert_file.empty() || !config.ca_file.empty()) {
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        config.key_file, config.cert_file, config.ca_file, ReloadSeconds(config));
    options.set_certificate_provider(provider);
    if (!config.ca_file.empty()) options.watch_root_certs();
    if (!config.cert_file.empty()) options.watch_identity_key_cert_pairs();
  }
  options.set_verify_server_certs(true);
  if (!config.server_name.empty() && args != nullptr) {
    args->SetSslTargetNameOverride(config.server_name);
  }
  return grpc::experimental::TlsCredentials(options);
}

void SetProcessTls(const TlsConfig& config) {
  MutexLock lock(process_mu);
  if (process_tls == nullptr) process_tls = new TlsConfig();
  *process_tls = config;
}

const TlsConfig& ProcessTls() {
  static const TlsConfig kPlaintext;
  MutexLock lock(process_mu);
  return process_tls == nullptr ? kPlaintext : *process_tls;
}

std::string PeerIdentity(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (cn.empty()) return "";
  return std::string(cn.front().data(), cn.front().size());
}

std::vector<std::string> PeerUris(const grpc::ServerContext& context) {
  std::vector<std::string> out;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return out;
  for (const grpc::string_ref& u : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
    out.emplace_back(u.data(), u.size());
  }
  return out;
}

std::string NewSecret() {
  std::random_device os;  // getrandom(2) / /dev/urandom
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(os(), absl::kZeroPad8));
  return out;
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The first line of `path`, trimmed; INVALID_ARGUMENT naming the flag when unreadable,
// empty or too short to be a secret.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  std::string secret(absl::StripAsciiWhitespace(line));
  if (secret.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the secret in ", path, " is shorter than 16 characters"));
  }
  return secret;
}

std::string MetadataValue(const grpc::ServerContext& context, absl::string_view key) {
  const auto& md = context.client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace baton
