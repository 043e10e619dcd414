#include "common/service/security_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this process: serve TLS with it, and present it to "
          "servers that ask (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA of the cluster: verify servers and client certificates against it (with a "
          "CA, cluster services require mutual TLS)");
ABSL_FLAG(std::string, tls_server_name, "",
          "name to check servers' certificates against instead of the host dialled");
ABSL_FLAG(bool, insecure, false,
          "serve and dial plaintext, even on a non-loopback address (anyone who reaches the "
          "port can call it); plaintext on loopback needs no flag");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "how often certificate and key files are re-read (rotate by replacing them)");

namespace baton {

TlsConfig TlsConfigFromFlags() {
  TlsConfig c;
  c.cert_file = absl::GetFlag(FLAGS_tls_cert);
  c.key_file = absl::GetFlag(FLAGS_tls_key);
  c.ca_file = absl::GetFlag(FLAGS_tls_ca);
  c.server_name = absl::GetFlag(FLAGS_tls_server_name);
  c.insecure = absl::GetFlag(FLAGS_insecure);
  c.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  return c;
}

}  // namespace baton
