#!/usr/bin/env bash
# An idle coordinator stays small: it must not load the numeric stack's GPU libraries
# (loading libcublasLt alone costs a process about 150 MB resident). Checks that the binary
# links neither Gloo nor cuBLAS (it plans pipelines with common/plan, never runs one), then
# starts one on loopback, waits until it serves, and checks its resident memory and what it
# loaded.
#
#   tests/coordinator_footprint_test.sh BIN_DIR
set -euo pipefail
bin="$1"
limit_mib=64
linked="$(ldd "$bin/coordinator" | grep -oE 'lib(gloo|cublas|cublasLt)[^ ]*' | sort -u | tr '\n' ' ' || true)"
echo "coordinator binary: Gloo or cuBLAS linked: ${linked:-none}"
[[ -z "$linked" ]] || { echo "FAIL: the coordinator links $linked"; exit 1; }
tmp="$(mktemp -d -t baton-footprint.XXXXXX)"
pid=""
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$bin/coordinator" --listen 127.0.0.1:0 --db "$tmp/db" --port_file "$tmp/port" \
  --metrics_listen 127.0.0.1:0 >"$tmp/log" 2>&1 &
pid=$!
# A bound on a hang only (a loaded machine may take seconds to start it).
for _ in $(seq 600); do [[ -s "$tmp/port" ]] && break; sleep 0.1; done
[[ -s "$tmp/port" ]] || { cat "$tmp/log"; echo "FAIL: the coordinator did not start"; exit 1; }
sleep 1  # idle
rss_kib="$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")"
loaded="$(grep -oE 'lib(cublas|cublasLt|cudnn)[^ ]*\.so[^ ]*' "/proc/$pid/maps" | sort -u | tr '\n' ' ' || true)"
echo "idle coordinator: $((rss_kib / 1024)) MiB resident; GPU math libraries mapped: ${loaded:-none}"
[[ -z "$loaded" ]] || { echo "FAIL: the coordinator loaded $loaded"; exit 1; }
(( rss_kib < limit_mib * 1024 )) || { echo "FAIL: over ${limit_mib} MiB"; exit 1; }
echo "coordinator_footprint_test: passed"
