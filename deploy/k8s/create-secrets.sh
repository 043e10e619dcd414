#!/usr/bin/env bash
# Creates the Secrets the manifests mount, from a throwaway CA (scripts/make-certs.sh):
#
#   deploy/k8s/create-secrets.sh [-n NAMESPACE] [WORKERS]     (default 4 workers)
#
#   baton-coordinator-tls  ca.pem, coordinator.pem/.key, tokens, join-token
#   baton-worker-tls       ca.pem, baton-worker-N.pem/.key for N < WORKERS, join-token
#
# The CA key and the certificates stay in a directory it prints (keep it safe: the CA key
# signs new members; the tokens file holds people's tokens). For a real cluster, put your
# own CA's certificates (carrying DNS name "baton") in the same Secrets instead, e.g. with
# cert-manager. Existing Secrets are replaced.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ns=()
if [[ "${1:-}" == "-n" ]]; then ns=(-n "$2"); shift 2; fi
workers="${1:-4}"
dir="$(mktemp -d -t baton-k8s-tls.XXXXXX)"
BATON_WORKER_NAME=baton-worker scripts/make-certs.sh "$dir" "$workers"
coordinator=(--from-file="$dir/ca.pem" --from-file="$dir/coordinator.pem"
  --from-file="$dir/coordinator.key" --from-file="$dir/tokens" --from-file="$dir/join-token")
worker=(--from-file="$dir/ca.pem" --from-file="$dir/join-token")
for ((i = 0; i < workers; i++)); do
  worker+=(--from-file="$dir/baton-worker-$i.pem" --from-file="$dir/baton-worker-$i.key")
done
for s in baton-coordinator-tls baton-worker-tls; do
  kubectl "${ns[@]}" delete secret "$s" --ignore-not-found
done
kubectl "${ns[@]}" create secret generic baton-coordinator-tls "${coordinator[@]}"
kubectl "${ns[@]}" create secret generic baton-worker-tls "${worker[@]}"
echo "create-secrets: CA, certificates and tokens kept in $dir"
echo "create-secrets: batonctl --tls_ca $dir/ca.pem --tls_server_name baton with BATON_TOKEN from $dir/tokens"
