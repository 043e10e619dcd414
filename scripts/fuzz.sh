#!/usr/bin/env bash
# Builds a libFuzzer target with clang (address and undefined-behaviour sanitizers) and
# runs it for a bounded time. scripts/test.sh runs each target for a short while (ctest's
# fuzz_* tests); run longer by hand:
#
#   scripts/fuzz.sh http 3600          # an hour on the metrics port's request handling
#   scripts/fuzz.sh spec 3600          # job-spec JSON: parser and validator
#   scripts/fuzz.sh frame 3600         # tensor frames as a worker's TensorService parses them
#   scripts/fuzz.sh schedule 3600      # schedule CSV import, costs and action texts
#   scripts/fuzz.sh submit 3600        # arbitrary SubmitJobRequests into the coordinator core
#
# http is compiled here from its few sources; the others are built by CMake in build-fuzz/
# (BATON_FUZZ=ON: the whole dependency chain instrumented; sources in tests/fuzz/), one
# build at a time. The corpus grows in build/fuzz/corpus-TARGET (seeded from the target's
# committed corpus); a crashing input is written to build/fuzz/ and its path printed. Exits
# non-zero when the fuzzer found a crash, a leak, a timeout or an out-of-memory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="${1:?usage: scripts/fuzz.sh TARGET [SECONDS]   (targets: http spec frame schedule submit)}"
seconds="${2:-60}"
out=build/fuzz
mkdir -p "$out"

case "$target" in
  http)
    sources=(tests/fuzz/http_fuzz.cc common/http/http.cc common/metrics/metrics_http.cc)
    headers=(common/http/http.h common/metrics/metrics_http.h)
    seeds=tests/fuzz/corpus/http
    libs=(-lz)
    ;;
  spec | frame | schedule | submit)
    seeds="tests/fuzz/corpus/$target"
    ;;
  *)
    echo "fuzz: unknown target $target (known: http spec frame schedule submit)" >&2
    exit 2
    ;;
esac

CXX="${FUZZ_CXX:-clang++}"
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
if [[ "$target" == http ]]; then
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
else
  # One CMake build at a time (ctest runs the fuzz tests in parallel); ninja rebuilds only
  # what changed.
  fuzz_build="${BATON_FUZZ_BUILD_DIR:-build-fuzz}"
  mkdir -p "$fuzz_build"
  (
    flock 9
    if [[ ! -f "$fuzz_build/build.ninja" ]]; then
      echo "fuzz: configuring $fuzz_build with $CXX (BATON_FUZZ=ON)"
      CC="${FUZZ_CC:-clang}" CXX="$CXX" cmake -S . -B "$fuzz_build" -G Ninja -DBATON_FUZZ=ON \
        -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    fi
    echo "fuzz: building ${target}_fuzz in $fuzz_build"
    if ! cmake --build "$fuzz_build" --target "${target}_fuzz" -- -j"${BATON_JOBS:-2}" \
      >"$fuzz_build/build-$target.log" 2>&1; then
      tail -n 40 "$fuzz_build/build-$target.log"
      echo "fuzz: building ${target}_fuzz failed (log: $fuzz_build/build-$target.log)" >&2
      exit 1
    fi
  ) 9>"$fuzz_build/.lock"
  bin="$fuzz_build/fuzz/${target}_fuzz"
fi

corpus="$out/corpus-$target"
mkdir -p "$corpus"
echo "fuzz: running $bin for ${seconds}s (corpus $corpus, seeds $seeds)"
"$bin" "$corpus" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 -artifact_prefix="$out/$target-" 2>&1 |
  grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)' || true
# libFuzzer's status, not grep's.
exit "${PIPESTATUS[0]}"
