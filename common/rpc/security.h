// Transport security for every baton server and channel: TLS, mutual TLS, and plaintext
// only where it was asked for.
//
// A process has one TlsConfig, read from the same flags on the coordinator, the workers and
// batonctl (--tls_cert, --tls_key, --tls_ca, --tls_server_name, --insecure):
//   * tls_cert + tls_key: the process's identity. Servers speak TLS with it; channels
//     present it when the server asks for a client certificate (mutual TLS).
//   * tls_ca: channels verify servers against this CA (without it, the system's roots);
//     servers verify client certificates against it. Whether a server *requires* a client
//     certificate at the handshake is its ClientCerts policy: the workers' port (WorkerService,
//     TensorService: only cluster members call) requires one; the coordinator's port
//     (JobService for people with tokens, ClusterService for workers with certificates)
//     verifies one when presented and leaves the decision to each service (PeerIdentity).
//   * none of them: plaintext, allowed only with insecure = true or on a loopback listen
//     address (CheckServerSecurity).
// Certificate and key files are re-read every reload_interval (gRPC's file watcher), so
// certificates rotate by replacing the files (write, then rename) while jobs keep running.
//
// Channels made by MakeChannel (common/rpc/rpc.h) and the tensor transport take their
// credentials from the process-wide config set once by main (SetProcessTls) before any
// channel is made; tests set it the same way.
#ifndef BATON_COMMON_RPC_SECURITY_H_
#define BATON_COMMON_RPC_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace baton {

struct TlsConfig {
  std::string cert_file;  // PEM certificate chain of this process
  std::string key_file;   // PEM private key of cert_file
  std::string ca_file;    // PEM CA that signs the cluster's certificates
  // Name checked against servers' certificates instead of the host dialled (e.g. one
  // name all cluster certificates carry, when peers are dialled by IP address).
  std::string server_name;
  // Plaintext was asked for explicitly (--insecure).
  bool insecure = false;
  absl::Duration reload_interval = absl::Seconds(10);

  bool tls() const { return !cert_file.empty() || !ca_file.empty(); }
  // Mutual TLS: a CA to verify peers with and an identity to present.
  bool mutual() const { return !ca_file.empty() && !cert_file.empty(); }
};

// Checks the config of a process: cert and key come together; files exist and are
// readable; --insecure is not combined with TLS files. Errors name the flag.
absl::Status CheckTlsConfig(const TlsConfig& config);

// Checks that a server may listen on `listen` ("host:port") with `config`: plaintext on an
// address other than loopback needs config.insecure; TLS needs a certificate and key.
// INVALID_ARGUMENT says which flag to give.
absl::Status CheckServerSecurity(const TlsConfig& config, absl::string_view listen);

// True for 127.0.0.0/8, ::1, [::1] and "localhost" (host:port or a bare host).
bool IsLoopbackAddress(absl::string_view address);

enum class ClientCerts {
  kNone,             // do not ask (plaintext, or TLS without a CA)
  kVerifyIfPresent,  // ask; a certificate presented must verify against the CA
  kRequire,          // a certificate verifying against the CA is required at the handshake
};

// Server credentials for `config` (plaintext when !config.tls()). With a CA, `client_certs`
// decides what is asked of clients; without one, nothing is.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& config,
                                                               ClientCerts client_certs);

// Channel credentials for `config` (plaintext when !config.tls()); with server_name set,
// *args gets the target name override.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsConfig& config,
                                                                 grpc::ChannelArguments* args);

// The process-wide config channels use. Set once, before any channel is made.
void SetProcessTls(const TlsConfig& config);
const TlsConfig& ProcessTls();

// The common name of the peer's certificate when it was verified against the CA (mutual
// TLS), else "" (plaintext, or no certificate presented).
std::string PeerIdentity(const grpc::ServerContext& context);

// The URI subject alternative names of the peer's certificate when it was verified against
// the CA (mutual TLS), else none. Worker certificates carry one naming the worker role
// (kWorkerUriPrefix; scripts/make-certs.sh), which users' certificates do not.
std::vector<std::string> PeerUris(const grpc::ServerContext& context);

// The URI SAN prefix of a worker's certificate (a SPIFFE ID in trust domain "baton"):
// spiffe://baton/worker/<name>. The coordinator's --worker_uri_prefix may name another.
inline constexpr char kWorkerUriPrefix[] = "spiffe://baton/worker/";

// Request metadata carrying baton's cluster secrets (lower case, as gRPC requires).
inline constexpr char kSessionMetadata[] = "x-baton-session";      // a worker's session
inline constexpr char kJoinTokenMetadata[] = "x-baton-join-token";  // the cluster join token

// A fresh random secret: 32 hex digits (128 bits) from the OS's random source.
std::string NewSecret();
// Compares two secrets in time independent of where they differ.
bool SecretsEqual(absl::string_view a, absl::string_view b);

// The first line of `path`, trimmed: a shared secret such as the join token.
// INVALID_ARGUMENT naming `flag` and the file when unreadable, or shorter than 16
// characters.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag);

// The value of the request metadata `key` ("" when absent; the first when repeated).
std::string MetadataValue(const grpc::ServerContext& context, absl::string_view key);

}  // namespace baton

#endif  // BATON_COMMON_RPC_SECURITY_H_
