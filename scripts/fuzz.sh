#!/usr/bin/env bash
# Builds a libFuzzer target with clang (address and undefined-behaviour sanitizers) and
# runs it for a bounded time. scripts/test.sh runs each target for a short while (ctest's
# fuzz_* tests); run longer by hand:
#
#   scripts/fuzz.sh http 3600          # an hour on the metrics port's request handling
#
# The corpus grows in build/fuzz/corpus-TARGET (seeded from the target's fuzz_corpus/);
# a crashing input is written to build/fuzz/ and its path printed. Exits non-zero when the
# fuzzer found a crash, a leak, a timeout or an out-of-memory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="${1:?usage: scripts/fuzz.sh TARGET [SECONDS]   (targets: http)}"
seconds="${2:-60}"
out=build/fuzz
mkdir -p "$out"

case "$target" in
  http)
    sources=(common/http/http_fuzz.cc common/http/http.cc common/metrics/metrics_http.cc)
    headers=(common/http/http.h common/metrics/metrics_http.h)
    seeds=common/http/fuzz_corpus
    libs=(-lz)
    ;;
  *)
    echo "fuzz: unknown target $target (known: http)" >&2
    exit 2
    ;;
esac

CXX="${FUZZ_CXX:-clang++}"
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
bin="$out/${target}_fuzz"
# Rebuild when any source or header is newer than the binary (or this script is).
stale=0
[[ -x "$bin" ]] || stale=1
for f in "${sources[@]}" "${headers[@]}" "${BASH_SOURCE[0]}"; do
  [[ "$f" -nt "$bin" ]] && stale=1
done
if [[ $stale -eq 1 ]]; then
  echo "fuzz: building $bin with $CXX"
  "$CXX" -std=c++17 -O1 -g -I. -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
    "${sources[@]}" "${libs[@]}" -o "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi

corpus="$out/corpus-$target"
mkdir -p "$corpus"
echo "fuzz: running $bin for ${seconds}s (corpus $corpus, seeds $seeds)"
"$bin" "$corpus" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 -artifact_prefix="$out/$target-" 2>&1 |
  grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)' || true
# libFuzzer's status, not grep's.
exit "${PIPESTATUS[0]}"
