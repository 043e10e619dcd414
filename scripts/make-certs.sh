#!/usr/bin/env bash
# Makes a throwaway certificate authority and certificates for a TLS demo or test cluster:
#
#   scripts/make-certs.sh DIR [WORKERS] [EXTRA_SAN ...]
#
# Writes into DIR (created, mode 0700):
#   ca.pem, ca.key                  the cluster CA (keep ca.key off the cluster)
#   coordinator.pem/.key            CN baton-coordinator, URI spiffe://baton/coordinator
#   worker-N.pem/.key               CN baton-worker-N, N = 0 .. WORKERS-1 (default 4), URI
#                                   spiffe://baton/worker/worker-N: the role the coordinator
#                                   checks before it lets a certificate register as a worker;
#                                   the files are named $BATON_WORKER_NAME-N when it is set
#                                   (Kubernetes: baton-worker-N, the pod names)
#   client.pem/.key                 CN baton-client, URI spiffe://baton/user/baton-client (for
#                                   clients that want mutual TLS: a user's, not a worker's)
#   tokens                          bearer tokens for --auth_tokens: "admin" (admin) and
#                                   "healthcheck" (viewer)
#   join-token                      the workers' --join_token_file
# Every certificate is valid for DNS:localhost, IP:127.0.0.1, DNS:baton (one name the
# whole cluster can be checked against with --tls_server_name baton), its own short name
# (coordinator, worker-N) and each EXTRA_SAN ("DNS:coordinator.ns.svc", "IP:10.0.0.5").
# ECDSA P-256 keys, valid for 30 days. For a real cluster use your own CA (docs/security.md).
# Existing files are kept: run again with a fresh DIR to start over.
set -euo pipefail
dir="${1:?usage: scripts/make-certs.sh DIR [WORKERS] [EXTRA_SAN ...]}"
workers="${2:-4}"
shift $(( $# >= 2 ? 2 : 1 ))
extra=("$@")
command -v openssl >/dev/null || { echo "make-certs: openssl not found" >&2; exit 1; }
mkdir -p "$dir"
chmod 700 "$dir"
umask 077

if [[ ! -s "$dir/ca.pem" ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=baton-cluster-ca" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
fi

# issue NAME CN SHORT URI: a key and a certificate signed by the CA.
issue() {
  local name="$1" cn="$2" short="$3" uri="$4"
  [[ -s "$dir/$name.pem" ]] && return 0
  local san="DNS:localhost,IP:127.0.0.1,DNS:baton,DNS:$short,URI:$uri"
  for s in "${extra[@]}"; do san="$san,$s"; done
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 30 -out "$dir/$name.pem.tmp" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san") \
    2>/dev/null
  mv "$dir/$name.pem.tmp" "$dir/$name.pem"
  rm -f "$dir/$name.csr"
}

issue coordinator baton-coordinator coordinator spiffe://baton/coordinator
worker_name="${BATON_WORKER_NAME:-worker}"
for ((i = 0; i < workers; i++)); do
  issue "$worker_name-$i" "baton-worker-$i" "$worker_name-$i" "spiffe://baton/worker/$worker_name-$i"
done
issue client baton-client client spiffe://baton/user/baton-client
if [[ ! -s "$dir/tokens" ]]; then
  printf '# token name role (coordinator --auth_tokens)\n%s admin admin\n%s healthcheck viewer\n' \
    "$(openssl rand -hex 16)" "$(openssl rand -hex 16)" >"$dir/tokens"
fi
[[ -s "$dir/join-token" ]] || openssl rand -hex 16 >"$dir/join-token"
chmod 644 "$dir"/*.pem
echo "make-certs: CA and certificates in $dir"
