// The transport-security flags the coordinator and the workers share (security.h):
//   --tls_cert, --tls_key, --tls_ca, --tls_server_name, --insecure, --tls_reload_interval.
#ifndef BATON_COMMON_SERVICE_SECURITY_FLAGS_H_
#define BATON_COMMON_SERVICE_SECURITY_FLAGS_H_

#include "common/rpc/security.h"

namespace baton {

// The flags' values (after absl::ParseCommandLine).
TlsConfig TlsConfigFromFlags();

}  // namespace baton

#endif  // BATON_COMMON_SERVICE_SECURITY_FLAGS_H_
