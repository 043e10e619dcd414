#!/usr/bin/env bash
# The device check: everything that needs a real GPU, in one run that ends with a one-screen
# summary. Each test binary runs with BATON_REQUIRE_GPU=1, under which a test that finds no
# CUDA device fails instead of skipping: a pass here means the GPU was used.
#
#   scripts/gpu-test.sh [MODE] [OUT]       set up what is missing, build, run the check from
#                                          build/ (summary in OUT, default build/gpu-test)
#   scripts/gpu-test.sh bundle DIR         pack the check into DIR/baton-gpu.tar.xz, one archive
#                                          of at most 40 MiB (fails when larger), carrying every
#                                          shared library it loads but glibc's, the driver's and
#                                          CUDA's (the GPU host's own are used)
#   scripts/gpu-test.sh run-bundle [MODE] PATH [OUT]
#                                          run it on a GPU host that lacks baton's build
#                                          dependencies and network; PATH is the archive or
#                                          the folder it unpacked to
#
# MODE: --tests (parts 1-3 below: the host, the tests, the cluster job), --bench (parts 1
# and 4), or neither for all of them. A GPU host is lent for minutes, so each mode fits one
# short run: run --tests first, then --bench.
#
# What the check runs, each under a timeout:
#   1. the host: the GPU, the driver and whether it is new enough for the CUDA the binaries
#      were built with; where the CUDA runtime, cuBLAS and NCCL come from (NCCL is opened with
#      dlopen: found on the loader path, in CUDA's folder or in a Python wheel's nvidia/nccl/lib,
#      and exported as BATON_NCCL_LIBRARY);
#   2. the GPU test binaries (GPU_TESTS below), with NCCL_DEBUG=WARN, side by side on the one
#      GPU (BATON_GPU_TEST_JOBS at once, default 4), the largest split into gtest shards
#      (TEST_SHARDS below), the NCCL binaries alone after them; and compute-sanitizer's
#      memcheck and racecheck over the kernels SANITIZE_FILTER selects, where the host has
#      compute-sanitizer (skipped, saying so, where not);
#   3. a cluster job: a coordinator and two workers sharing the GPU (gRPC between them, with
#      device staging), whose weights digest must equal `batonctl train-local --device cuda`'s;
#   4. the benchmark: tokens/s of a training step of the example GPT and of a 768-wide,
#      12-layer GPT with context 1024, baton on CUDA (bench/gpt_bench --device=cuda) against
#      PyTorch eager on the same GPU (bench/pytorch_gpt.py --device cuda), in fp32 (TF32
#      off on both sides), in bf16 (baton's PRECISION_BF16 against torch.autocast) and in
#      bf16 with baton's fused attention (BATON_FUSED_ATTENTION=1) and with its tiled bf16
#      attention on tensor cores (BATON_FUSED_ATTENTION=tiled), with the ratios and
#      achieved TFLOP/s (PyTorch skipped, saying so, where python3 has no torch), and each
#      mode's step part by part (bench/gpt_bench --parts: the device time of the products,
#      the LM head's, attention, element-wise passes, norms, loss, embedding, sums and the
#      optimizer, and the GPU's idle time); then the
#      worker's side: a 2-rank cluster job of the 768-wide GPT in bf16 on the GPU, its
#      tokens/s, MFU and each rank's per-step forward, backward, send and receive-wait times
#      (`batonctl watch --output json`; BATON_GPU_CLUSTER_BENCH_STEPS steps, default 10).
# The summary (gpu-summary.txt) is written to OUT, or to $BATON_GPU_TEST_OUT, a line at a
# time as the check goes (a run cut short keeps what it saw; only a finished one has the
# RESULT line); the whole log (gpu-test.log) and each test binary's or shard's output
# (logs/) go there too. The exit status is 0 only when every part passed.
#
# Environment: BATON_NCCL_LIBRARY (a libnccl.so.2 to use), BATON_GPU_TEST_TIMEOUT (seconds
# per test binary or shard, default 150; the sanitizer's runs get twice that),
# BATON_GPU_TEST_JOBS (test processes at once, default 4), BATON_GPU_BENCH=0 (skip the
# benchmark), PYTHON (the
# interpreter with torch, default python3), BATON_GPU_CHECK_DEVICE (cuda:0; cpu dry-runs the
# cluster job and the benchmark on a host without a GPU, to check this script).
#
# scripts/test.sh runs the same tests everywhere; without a GPU they skip with a message.
set -euo pipefail

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"

# The test binaries (under build/tests) with real-GPU cases. A new GPU test goes here.
GPU_TESTS=(cuda_device_test cuda_kernels_test llama_cuda_test cuda_training_test cuda_pipeline_test
           cuda_fused_pipeline_test cuda_tiled_pipeline_test nccl_real_test
           nccl_collective_real_test)
# Binaries split into gtest shards (GTEST_TOTAL_SHARDS) that run side by side: their cases
# are small and launch-bound, so one process leaves the GPU mostly idle. cuda_pipeline_test
# (about 900 cases, some 140 s alone on an H100) is the one that needs it.
declare -A TEST_SHARDS=([cuda_pipeline_test]=4)
# Binaries that run alone, after the others: the NCCL ones, whose communicators should not
# wait on a GPU busy with other processes.
SERIAL_TESTS=(nccl_real_test nccl_collective_real_test)
# The kernels compute-sanitizer checks (cuda_kernels_test cases): the whole-tensor and
# batched sums, the row and column reductions, the embedding's sorted backward and the fused
# and tiled attentions, whose shared memory and indexing are the most intricate. Not the materialised
# attention's: cuBLAS's kernels under the sanitizer would take most of the run.
SANITIZE_FILTER='CudaKernelsTest.*Embedding*:CudaKernelsTest.*Sum*:CudaKernelsTest.*Reduction*:CudaKernelsTest.FusedAttention*:CudaKernelsTest.TiledAttention*'
# Programs the check runs (build/bin).
BUNDLE_TOOLS=(batonctl coordinator worker gpt_bench)
# Files the check reads: job specs, the benchmark's PyTorch side, the training text.
BUNDLE_SHARE=(client/examples/gpt.json bench/gpt-768.json bench/pytorch_gpt.py)
BUNDLE_TEXT=/usr/share/common-licenses/GPL-3
BUNDLE_NAME=baton-gpu.tar.xz
MAX_BUNDLE_MIB="${BATON_GPU_BUNDLE_MAX_MIB:-40}"  # what is carried to a GPU host stays small

log() { echo "gpu-test: $*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- bundle (on a build host)

make_bundle() {  # DIR
  local out="$1" repo stage bins=() size_bytes limit_bytes
  repo="$(cd "$(dirname "$SCRIPT")/.." && pwd)"
  cd "$repo"
  for t in "${GPU_TESTS[@]}"; do
    [[ -x "build/tests/$t" ]] || die "build/tests/$t is missing: build with CUDA first (scripts/build.sh)"
  done
  for t in "${BUNDLE_TOOLS[@]}"; do
    [[ -x "build/bin/$t" ]] || die "build/bin/$t is missing: build with CUDA first (scripts/build.sh)"
  done
  stage="$(mktemp -d -t baton-gpu-bundle.XXXXXX)"
  local root="$stage/baton-gpu"
  mkdir -p "$root/tests" "$root/bin" "$root/lib" "$root/share"
  for t in "${GPU_TESTS[@]}"; do cp "build/tests/$t" "$root/tests/" && bins+=("build/tests/$t"); done
  for t in "${BUNDLE_TOOLS[@]}"; do cp "build/bin/$t" "$root/bin/" && bins+=("build/bin/$t"); done
  for b in "${bins[@]}"; do
    # Every library the loader resolves, but glibc's (the host's own must be used), libcuda
    # (the driver's) and the CUDA toolkit's (cuBLAS alone is 0.5 GB; run-bundle finds the
    # host's CUDA 13 in its toolkit or in PyTorch's wheels).
    ldd "$b" | awk '/=> \//{print $3}' |
      grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
      grep -vE '/(libcudart|libcublas|libcublasLt|libnccl)\.so' |
      grep -v '^/usr/local/cuda' |
      while read -r lib; do cp -nL "$lib" "$root/lib/"; done
  done
  strip --strip-all "$root"/tests/* "$root"/bin/* "$root"/lib/* 2>/dev/null || true
  for f in "${BUNDLE_SHARE[@]}"; do cp "$f" "$root/share/"; done
  cp "$BUNDLE_TEXT" "$root/share/training-text.txt"
  cp "$SCRIPT" "$root/gpu-test.sh"
  {
    echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "cuda $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "architectures $(sed -n 's/^BATON_CUDA_ARCHITECTURES:[A-Z]*=//p' build/CMakeCache.txt)"
  } >"$root/BUILD_INFO"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  rm -f "$out/$BUNDLE_NAME"
  tar -C "$stage" -cf - baton-gpu | xz -T0 -6 >"$out/$BUNDLE_NAME"
  size_bytes="$(stat -c %s "$out/$BUNDLE_NAME")"
  local unpacked
  unpacked="$(du -sh "$root" | cut -f1)"
  rm -rf "$stage"
  limit_bytes=$((MAX_BUNDLE_MIB * 1024 * 1024))
  log "bundle $out/$BUNDLE_NAME: $((size_bytes / 1024)) KiB (unpacked $unpacked; limit ${MAX_BUNDLE_MIB} MiB)"
  if ((size_bytes > limit_bytes)); then
    rm -f "$out/$BUNDLE_NAME"
    die "the bundle is $((size_bytes / 1024 / 1024)) MiB, over the ${MAX_BUNDLE_MIB} MiB limit: leave out what the check does not run"
  fi
  log "on the GPU host: bash gpu-test.sh run-bundle $BUNDLE_NAME OUT   (gpu-test.sh is inside; or tar -xJf it first)"
}

# ---------------------------------------------------------------- the check (on a GPU host)

# The summary file is the check's record: each line is appended as it happens (one write,
# so the test processes running side by side cannot tear each other's lines), and the
# failures are counted from it at the end.
SUMMARY_FILE=""
summary() { [[ -n "$SUMMARY_FILE" ]] && printf '%s\n' "$*" >>"$SUMMARY_FILE"; return 0; }
note() { summary "$*"; log "$*"; }
fail() { summary "FAIL $*"; log "FAIL $*"; }

# Folders that may hold CUDA's and NCCL's libraries on a host without the toolkit on the
# loader path: CUDA's own, the system's, and the nvidia-* wheels of every Python around.
library_dirs() {
  local py dirs=()
  dirs+=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
         /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 /usr/local/lib)
  for py in "${PYTHON:-python3}" python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || [[ -x "$py" ]] || continue
    while read -r sp; do
      [[ -d "$sp/nvidia" ]] || continue
      for d in "$sp"/nvidia/*/lib "$sp"/nvidia/cu*/lib; do [[ -d "$d" ]] && dirs+=("$d"); done
    done < <(timeout 20 "$py" -c 'import site, sys; print("\n".join(sys.path + site.getsitepackages()))' 2>/dev/null || true)
  done
  printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++'
}

find_library() {  # NAME: the first file of that name in library_dirs, else ldconfig's
  local name="$1" d
  while read -r d; do
    if [[ -e "$d/$name" ]]; then echo "$d/$name"; return 0; fi
  done < <(library_dirs)
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}'
}

check_host() {  # sets LD_LIBRARY_PATH and BATON_NCCL_LIBRARY; returns 1 when no GPU can run
  local smi driver cuda_driver built lib found dirs="" ok=0
  [[ -f "$ROOT/BUILD_INFO" ]] && while read -r line; do note "bundle: $line"; done <"$ROOT/BUILD_INFO"
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    fail "host: nvidia-smi not found: no NVIDIA driver on this host"
    return 1
  fi
  smi="$(timeout 30 nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1)" || {
    fail "host: nvidia-smi failed: $smi"
    return 1
  }
  while read -r line; do note "host: GPU $line"; done <<<"$smi"
  driver="$(head -1 <<<"$smi" | cut -d, -f3 | tr -d ' ')"
  cuda_driver="$(timeout 30 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
  built="$(sed -n 's/^cuda //p' "$ROOT/BUILD_INFO" 2>/dev/null || true)"
  if [[ -z "$built" ]]; then
    built="$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  fi
  note "host: driver $driver supports CUDA ${cuda_driver:-?}; the binaries need CUDA ${built:-?}"
  if [[ -n "$cuda_driver" && -n "$built" ]] &&
     [[ "$(printf '%s\n%s\n' "$built" "$cuda_driver" | sort -V | head -1)" != "$built" ]]; then
    fail "host: driver $driver is too old: it supports CUDA $cuda_driver, the binaries were built with CUDA $built (CUDA 13 needs driver 580 or newer); update the driver or rebuild with this host's CUDA"
    return 1
  fi
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    found="$(find_library "$lib")"
    if [[ -z "$found" ]]; then
      fail "host: $lib not found (looked in CUDA's folders, the system's and Python's nvidia wheels)"
      ok=1
      continue
    fi
    note "host: $lib from $found"
    dirs="$dirs:$(dirname "$found")"
  done
  if [[ -n "${BATON_NCCL_LIBRARY:-}" ]]; then
    [[ -e "$BATON_NCCL_LIBRARY" ]] || fail "host: BATON_NCCL_LIBRARY=$BATON_NCCL_LIBRARY does not exist"
  else
    BATON_NCCL_LIBRARY="$(find_library libnccl.so.2)"
  fi
  if [[ -n "${BATON_NCCL_LIBRARY:-}" ]]; then
    export BATON_NCCL_LIBRARY
    note "host: NCCL from $BATON_NCCL_LIBRARY (BATON_NCCL_LIBRARY)"
    dirs="$dirs:$(dirname "$BATON_NCCL_LIBRARY")"
  else
    fail "host: libnccl.so.2 not found (set BATON_NCCL_LIBRARY): the NCCL tests will fail"
  fi
  dirs="${LIB}${dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH="${dirs#:}"
  return "$ok"
}

gtest_counts() {  # LOG: "N passed[, M skipped (why)]" from a gtest log
  local counts skipped
  counts="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}.*/\1 passed/p' "$1" | tail -1)"
  skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}.*/\1 skipped/p' "$1" | tail -1)"
  if [[ -n "$skipped" ]]; then
    counts="${counts:-?}, $skipped ($( (grep -o 'needs [0-9]* CUDA devices[^;]*' "$1" || true) | sort -u | tr '\n' ' '))"
  fi
  echo "${counts:-?}"
}

# One test binary, or one shard of it (SHARD of SHARDS, from 0), under its timeout; its
# output goes to logs/, its line to the summary.
run_unit() {  # NAME SHARD SHARDS
  local t="$1" shard="$2" shards="$3" label="$1" log rc=0 start=$SECONDS secs
  log="$LOGS/$t.log"
  if ((shards > 1)); then
    label="$t shard $((shard + 1))/$shards"
    log="$LOGS/$t.shard$((shard + 1)).log"
  fi
  if [[ ! -x "$TESTS/$t" ]]; then
    fail "$t: not built"
    return 0
  fi
  log "running $label (timeout ${TEST_TIMEOUT}s)"
  BATON_REQUIRE_GPU=1 GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$shard" \
    timeout --kill-after=10 "$TEST_TIMEOUT" "$TESTS/$t" --gtest_brief=0 >"$log" 2>&1 || rc=$?
  secs=$((SECONDS - start))
  if [[ $rc -eq 0 ]]; then
    note "PASS $label ($(gtest_counts "$log"), ${secs}s)"
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$label: timed out after ${TEST_TIMEOUT}s ($(grep -c '^\[       OK \]' "$log" || true) passed before); last lines: $(tail -3 "$log" | tr '\n' ' ')"
  else
    fail "$label: exit $rc (${secs}s): $(grep -E '^\[  FAILED  \]|Failure|error|Error' "$log" | head -8 | tr '\n' ' ')"
  fi
}

# compute-sanitizer: the host's (on the PATH, in a CUDA folder, or a Python wheel's).
find_sanitizer() {
  local c d
  if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return 0; fi
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /usr/local/cuda-*/bin/compute-sanitizer; do
    [[ -x "$c" ]] && { echo "$c"; return 0; }
  done
  while read -r d; do  # a wheel's nvidia/<pkg>/lib: the tool sits beside it
    for c in "$d"/../bin/compute-sanitizer "$d"/../compute-sanitizer/compute-sanitizer; do
      [[ -x "$c" ]] && { echo "$c"; return 0; }
    done
  done < <(library_dirs)
  return 1
}

sanitize_unit() {  # TOOL: memcheck or racecheck over SANITIZE_FILTER's cases
  local tool="$1" log="$LOGS/sanitize-$1.log" rc=0 start=$SECONDS limit=$((TEST_TIMEOUT * 2))
  log "running compute-sanitizer --tool $tool (timeout ${limit}s)"
  BATON_REQUIRE_GPU=1 timeout --kill-after=10 "$limit" "$SANITIZER" --tool "$tool" \
    --error-exitcode 1 "$TESTS/cuda_kernels_test" --gtest_filter="$SANITIZE_FILTER" \
    --gtest_brief=0 >"$log" 2>&1 || rc=$?
  local found
  found="$( (grep -E '(ERROR|RACECHECK) SUMMARY' "$log" || true) | tail -1 | sed 's/^=* *//')"
  if [[ $rc -eq 0 ]]; then
    note "PASS compute-sanitizer $tool: cuda_kernels_test $(gtest_counts "$log") of '$SANITIZE_FILTER'; ${found:-no summary line} ($((SECONDS - start))s)"
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "compute-sanitizer $tool: timed out after ${limit}s; last lines: $(tail -3 "$log" | tr '\n' ' ')"
  else
    fail "compute-sanitizer $tool: exit $rc: ${found:-} $(grep -E '^=+ (Invalid|Race|Error|Program hit)|^\[  FAILED  \]' "$log" | sort | uniq -c | sort -rn | head -6 | tr '\n' ' ')"
  fi
}

# Every test binary (its shards apart) and the sanitizer's runs, at most TEST_JOBS at once,
# longest first; then the serial ones, one at a time.
run_tests() {
  local units=() pids=() t i u
  if [[ -x "$TESTS/cuda_kernels_test" ]] && SANITIZER="$(find_sanitizer)"; then
    note "tests: compute-sanitizer from $SANITIZER"
    units+=("sanitize memcheck" "sanitize racecheck")
  else
    note "tests: compute-sanitizer not found (PATH, /usr/local/cuda*, Python's nvidia wheels): memcheck and racecheck skipped"
  fi
  for t in "${GPU_TESTS[@]}"; do  # the sharded binaries first: they take longest
    [[ -n "${TEST_SHARDS[$t]:-}" ]] || continue
    for ((i = 0; i < TEST_SHARDS[$t]; i++)); do units+=("test $t $i ${TEST_SHARDS[$t]}"); done
  done
  for t in "${GPU_TESTS[@]}"; do
    [[ -z "${TEST_SHARDS[$t]:-}" && " ${SERIAL_TESTS[*]} " != *" $t "* ]] && units+=("test $t 0 1")
  done
  # (Waits name the units' processes: a bare `wait` would also wait for the log's tee.)
  for u in "${units[@]}"; do
    while (($(jobs -pr | wc -l) >= TEST_JOBS)); do wait -n || true; done
    case "$u" in
      sanitize*) sanitize_unit ${u#sanitize } & ;;
      test*) run_unit ${u#test } & ;;
    esac
    pids+=($!)
  done
  wait "${pids[@]}" || true
  for t in "${SERIAL_TESTS[@]}"; do
    [[ " ${GPU_TESTS[*]} " == *" $t "* ]] && run_unit "$t" 0 1
  done
}

wait_file() {  # FILE SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [[ -s "$1" ]] && { cat "$1"; return 0; }
    sleep 0.1
  done
  return 1
}

share_spec() {  # SPEC: printed with its training text at SHARE's copy (under --data_root)
  sed "s#\"path\": *\"[^\"]*\"#\"path\": \"$SHARE/training-text.txt\"#" "$1"
}

json_digest() {  # the weights digest of a Job or train-local report on stdin
  python3 -c 'import json, sys; print(json.load(sys.stdin).get("weights_digest", ""))' 2>/dev/null
}

# A coordinator and two workers on the device, in TMP; sets CLUSTER_PIDS and exports
# BATON_COORDINATOR. Returns 1 (and says why, as WHAT) when the coordinator does not start.
start_cluster() {  # TMP WHAT
  local tmp="$1" coordinator w
  CLUSTER_PIDS=()
  for w in coordinator worker batonctl; do
    [[ -x "$BIN/$w" ]] || { fail "$2: $BIN/$w is missing"; return 1; }
  done
  "$BIN/coordinator" --listen 127.0.0.1:0 --db "$tmp/baton.db" --port_file "$tmp/c.port" \
    --metrics_listen "" --data_root "$SHARE" >"$tmp/coordinator.log" 2>&1 &
  CLUSTER_PIDS+=($!)
  if ! coordinator="$(wait_file "$tmp/c.port" 20)"; then
    fail "$2: the coordinator did not start: $(tail -3 "$tmp/coordinator.log" | tr '\n' ' ')"
    stop_cluster
    return 1
  fi
  for w in 1 2; do
    "$BIN/worker" --coordinator "$coordinator" --listen 127.0.0.1:0 --worker_id "gpu-$w" \
      --device "$DEVICE" --data_root "$SHARE" --metrics_listen "" --port_file "$tmp/w$w.port" \
      >"$tmp/worker-$w.log" 2>&1 &
    CLUSTER_PIDS+=($!)
  done
  export BATON_COORDINATOR="$coordinator"
}

stop_cluster() {  # [TMP]: with TMP, its logs' last lines go to the log first
  local f
  unset BATON_COORDINATOR
  kill "${CLUSTER_PIDS[@]}" 2>/dev/null || true
  wait "${CLUSTER_PIDS[@]}" 2>/dev/null || true
  if [[ -n "${1:-}" ]]; then
    for f in "$1"/*.log; do
      log "--- last lines of $(basename "$f") ---"
      tail -15 "$f" >&2
    done
  fi
}

# Submits SPEC with the flags after it and waits for the job; prints its id. Fails (saying
# why, as WHAT) when it does not succeed within LIMIT seconds. TMP/watch.log gets what
# `batonctl watch` printed, as $WATCH_OUTPUT (text, or json: one JobEvent per line).
run_cluster_job() {  # TMP WHAT LIMIT SPEC FLAGS...
  local tmp="$1" what="$2" limit="$3" job
  shift 3
  if ! job="$(timeout 60 "$BIN/batonctl" submit -f "$@" --device "${DEVICE%%:*}" 2>"$tmp/submit.err")"; then
    fail "$what: submit failed: $(cat "$tmp/submit.err")"
    return 1
  fi
  if ! timeout "$limit" "$BIN/batonctl" watch "$job" --output "${WATCH_OUTPUT:-text}" \
         >"$tmp/watch.log" 2>"$tmp/watch.err"; then
    cat "$tmp/watch.err" >>"$tmp/watch.log"
    fail "$what: job $job did not succeed: $(tail -4 "$tmp/watch.log" | tr '\n' ' ')"
    return 1
  fi
  echo "$job"
}

cluster_job() {
  local tmp spec steps=30 job rc=1 cluster_digest local_digest
  tmp="$(mktemp -d -t baton-gpu-cluster.XXXXXX)"
  spec="$tmp/gpt.json"
  start_cluster "$tmp" "cluster job" || { rm -rf "$tmp"; return; }
  share_spec "$SHARE/gpt.json" >"$spec"
  if job="$(run_cluster_job "$tmp" "cluster job" 120 "$spec" --stages 2 --microbatches 4 \
              --schedule 1f1b --steps "$steps")"; then
    cluster_digest="$(timeout 30 "$BIN/batonctl" get "$job" --output json | json_digest)"
    local_digest="$(timeout 120 "$BIN/batonctl" train-local -f "$spec" --device "${DEVICE%%:*}" \
      --steps "$steps" --output json 2>"$tmp/local.err" | json_digest)"
    if [[ -n "$cluster_digest" && "$cluster_digest" == "$local_digest" ]]; then
      rc=0
      note "PASS cluster job: 2 workers on one GPU (gRPC, device staging), 1F1B, $steps steps: digest ${cluster_digest:0:16}... = train-local --device cuda"
    else
      fail "cluster job: digest ${cluster_digest:-none} != train-local's ${local_digest:-none} $(tail -2 "$tmp/local.err" | tr '\n' ' ')"
    fi
  fi
  if [[ $rc -eq 0 ]]; then stop_cluster; else stop_cluster "$tmp"; fi
  rm -rf "$tmp"
}

# The worker's side of a step: a 2-rank cluster job of SPEC in bf16 (both ranks on the one
# GPU, gRPC with device staging between them), its tokens/s and MFU, and each rank's
# forward, backward, send and receive-wait time per step: medians over the steps after the
# first two, from the progress `batonctl watch` streams (each step's timing of every rank
# that reported it by then).
cluster_bench() {  # SPEC NAME REFERENCE_TOKENS_PER_S
  local tmp spec job steps="${BATON_GPU_CLUSTER_BENCH_STEPS:-10}" line
  tmp="$(mktemp -d -t baton-gpu-cluster-bench.XXXXXX)"
  spec="$tmp/spec.json"
  share_spec "$1" >"$spec"
  start_cluster "$tmp" "bench cluster $2" || { rm -rf "$tmp"; return; }
  if job="$(WATCH_OUTPUT=json run_cluster_job "$tmp" "bench cluster $2" 300 "$spec" --stages 2 \
              --microbatches 4 --schedule 1f1b --precision bf16 --steps "$steps")"; then
    if python3 - "$tmp/watch.log" "$2" "${3:-}" "${DEVICE%%:*}" >"$tmp/lines" 2>"$tmp/lines.err" <<'PY'
import json, statistics, sys

events, name, reference, device = sys.argv[1:5]
steps, ranks = {}, {}  # step -> progress; (rank, step) -> its timing
for line in open(events):
    step = json.loads(line).get("step") if line.strip().startswith("{") else None
    if not step:
        continue
    n = int(step["step"])
    steps[n] = step
    for t in step.get("stages", []):
        ranks[(t.get("rank", 0), n)] = t
kept = [n for n in sorted(steps) if n > 2] or sorted(steps)
if not kept:
    sys.exit("no steps reported")
def ms(d):  # a protobuf JSON Duration, "0.012s"
    return float(str(d or "0s").rstrip("s")) * 1e3
med = lambda xs: statistics.median(xs) if xs else 0.0
tps = med([steps[n].get("tokens_per_second", 0.0) for n in kept])
line = (f"bench cluster {name}: 2 ranks on one {device}, 1F1B, 4 micro-batches: {tps:,.0f} tokens/s, "
        f"{med([steps[n].get('model_tflops', 0.0) for n in kept]):.2f} TFLOP/s, "
        f"MFU {100 * med([steps[n].get('mfu', 0.0) for n in kept]):.1f}%, "
        f"step {med([ms(steps[n].get('duration')) for n in kept]):.1f} ms (median of {len(kept)} steps)")
if reference:
    line += f"; cluster/reference trainer = {tps / float(reference):.3f}"
print(line)
for r in sorted({r for r, _ in ranks}):
    rows = [ranks[(r, n)] for n in kept if (r, n) in ranks]
    if not rows:
        continue
    parts = ", ".join(f"{k} {med([ms(t.get(f)) for t in rows]):.1f} ms" for k, f in
                      (("forward", "forward"), ("backward", "backward"), ("weight", "weight"),
                       ("send", "send"), ("receive wait", "recv_wait"), ("step", "step")))
    print(f"bench cluster {name} rank {r}, per step (median of {len(rows)} steps): {parts}")
PY
    then
      while read -r line; do note "$line"; done <"$tmp/lines"
    else
      fail "bench cluster $2: cannot read the job's progress: $(tail -2 "$tmp/lines.err" | tr '\n' ' ')"
    fi
    stop_cluster
  else
    stop_cluster "$tmp"
  fi
  rm -rf "$tmp"
}

bench() {
  local py="${PYTHON:-python3}" spec name tmp baton_tps torch_tps fpt
  local -A reference_tps=()
  if [[ "${BATON_GPU_BENCH:-1}" == 0 ]]; then
    note "bench: skipped (BATON_GPU_BENCH=0)"
    return
  fi
  tmp="$(mktemp -d -t baton-gpu-bench.XXXXXX)"
  if ! timeout 60 "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    note "bench: PyTorch side skipped: $py has no torch with CUDA"
    py=""
  fi
  local mode precision env_fused
  for spec in "$SHARE/gpt.json" "$SHARE/gpt-768.json"; do
    # fp32 (TF32 off on both sides); bf16 (baton's precision: PRECISION_BF16 against
    # torch.autocast(bfloat16)); bf16 with baton's fused attention (BATON_FUSED_ATTENTION=1)
    # and with its tiled attention on tensor cores (BATON_FUSED_ATTENTION=tiled).
    for mode in fp32 bf16 bf16-fused bf16-tiled; do
    precision="${mode%%-*}"
    env_fused=0
    [[ "$mode" == *fused ]] && env_fused=1
    [[ "$mode" == *tiled ]] && env_fused=tiled
    name="$(basename "$spec" .json)-$mode"
    if [[ "$mode" == *tiled && "${DEVICE%%:*}" == cpu ]]; then
      # The CPU runs the tile kernels' blocks one thread at a time: a check of the contract,
      # minutes a step at context 1024.
      note "bench $name: skipped on the CPU (its tiled attention is a reference, not a fast path)"
      continue
    fi
    share_spec "$spec" |
      python3 -c '
import json, sys
s = json.load(sys.stdin)
if sys.argv[1] == "bf16": s["precision"] = "PRECISION_BF16"
json.dump(s, sys.stdout)' "$precision" >"$tmp/$name.json"
    # tokens/s, and the model's FLOPs per token as baton counts them (DescribeBlocks'
    # forward FLOPs x3 for forward and backward): the same count for both sides.
    read -r baton_tps fpt < <(BATON_FUSED_ATTENTION=$env_fused timeout 180 "$BIN/gpt_bench" \
      --device="${DEVICE%%:*}" --spec="$tmp/$name.json" \
      --benchmark_filter=BM_GptTrainerStep --benchmark_min_time=3 --benchmark_format=json \
      2>"$tmp/$name.baton.err" | python3 -c '
import json, sys
for b in json.load(sys.stdin)["benchmarks"]:
    if b.get("error_occurred") or "error_message" in b: sys.exit(b.get("error_message", "error"))
    print(round(b["tokens_per_second"]), round(b["model_flops_per_second"] / b["tokens_per_second"]))' \
      2>>"$tmp/$name.baton.err") || true
    if [[ -z "${baton_tps:-}" || -z "${fpt:-}" ]]; then
      fail "bench $name: baton on CUDA failed: $(tail -3 "$tmp/$name.baton.err" | tr '\n' ' ')"
      continue
    fi
    torch_tps=""
    if [[ -n "$py" && "$mode" != *fused && "$mode" != *tiled ]]; then
      timeout 180 "$py" "$SHARE/pytorch_gpt.py" --device cuda --spec "$tmp/$name.json" \
        --measure step --variants explicit,sdpa --min-time 3 --warmup 3 --precision "$precision" \
        >"$tmp/$name.torch.json" 2>"$tmp/$name.torch.err" || true
      # "explicit=TOKENS_PER_S sdpa=TOKENS_PER_S", one pair per attention variant measured.
      torch_tps="$(python3 -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(" ".join("%s=%d" % (r["attention"], r["step"]["tokens_per_second_median"]) for r in rows))
' "$tmp/$name.torch.json" 2>>"$tmp/$name.torch.err")" || torch_tps=""
      [[ -z "$torch_tps" ]] && fail "bench $name: PyTorch failed: $(tail -3 "$tmp/$name.torch.err" | tr '\n' ' ')"
    fi
    reference_tps[$name]="$baton_tps"
    note "bench $name: baton ${DEVICE%%:*} $baton_tps tokens/s ($(python3 -c "print(f'{$baton_tps*$fpt/1e12:.2f}')") TFLOP/s at $fpt FLOP/token)"
    for v in $torch_tps; do
      note "bench $name: pytorch ${v%%=*} ${v#*=} tokens/s ($(python3 -c "print(f'{${v#*=}*$fpt/1e12:.2f}')") TFLOP/s); baton/pytorch = $(python3 -c "print(f'{$baton_tps/${v#*=}:.3f}')")"
    done
    # Where the step's time goes, part by part (gpt_bench --parts: each kernel's device time
    # between CUDA events; what the step has beyond their sum, the GPU spent idle).
    if BATON_FUSED_ATTENTION=$env_fused timeout 120 "$BIN/gpt_bench" --device="${DEVICE%%:*}" \
      --spec="$tmp/$name.json" --parts=3 >"$tmp/$name.parts" 2>"$tmp/$name.parts.err"; then
      # The parts, the step, and the eight kernels that took the most time.
      while IFS= read -r line; do note "bench $name $line"; done < <(
        grep -E '^(part|step)' "$tmp/$name.parts"; grep '^kernel' "$tmp/$name.parts" | head -8)
    else
      fail "bench $name: its parts: $(tail -3 "$tmp/$name.parts.err" | tr '\n' ' ')"
    fi
    done
  done
  note "bench: peaks of the device (datasheet, dense): fp32 (no TF32) 67 TFLOP/s, bf16 989 TFLOP/s on H100 SXM and H200"
  rm -rf "$tmp"
  cluster_bench "$SHARE/gpt-768.json" gpt-768-bf16 "${reference_tps[gpt-768-bf16]:-}"
}

# A part of the check in a subshell: one that stops early (a missing file under set -e)
# is a failure the summary names, and the parts after it still run.
run_part() {  # FUNCTION
  local rc=0
  ( "$1" ) || rc=$?
  [[ $rc -eq 0 ]] || fail "$1: stopped early (exit $rc); see gpu-test.log"
}

run_check() {  # ROOT (tests/ bin/ lib/ share/ layout, or the repository with build/) OUT MODE
  ROOT="$1"
  local out="$2" mode="$3" start=$SECONDS failures
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  LOGS="$out/logs"
  rm -rf "$LOGS"
  mkdir -p "$LOGS"
  TEST_TIMEOUT="${BATON_GPU_TEST_TIMEOUT:-150}"
  TEST_JOBS="${BATON_GPU_TEST_JOBS:-4}"
  DEVICE="${BATON_GPU_CHECK_DEVICE:-cuda:0}"
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  exec > >(tee "$out/gpu-test.log") 2>&1
  SUMMARY_FILE="$out/gpu-summary.txt"
  echo "baton GPU check ($mode), started $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)" >"$SUMMARY_FILE"
  log "check of $ROOT, mode $mode, summary in $SUMMARY_FILE"
  if check_host; then
    if [[ "$mode" != bench ]]; then
      run_part run_tests
      run_part cluster_job
    fi
    [[ "$mode" == tests ]] || run_part bench
  else
    fail "host: the checks did not run (see above)"
  fi
  failures="$(grep -c '^FAIL ' "$SUMMARY_FILE" || true)"
  if [[ $failures -eq 0 ]]; then
    summary "RESULT: all passed ($((SECONDS - start)) s)"
  else
    summary "RESULT: $failures failed ($((SECONDS - start)) s)"
  fi
  echo
  echo "==================== summary ($SUMMARY_FILE) ===================="
  cat "$SUMMARY_FILE"
  [[ $failures -eq 0 ]]
}

main() {
  local mode=all
  case "${1:-}" in
    --tests) mode=tests; shift ;;
    --bench) mode=bench; shift ;;
  esac
  case "${1:-}" in
    bundle)
      make_bundle "${2:?usage: scripts/gpu-test.sh bundle DIR}"
      ;;
    run-bundle)
      shift
      case "${1:-}" in
        --tests) mode=tests; shift ;;
        --bench) mode=bench; shift ;;
      esac
      path="${1:?usage: scripts/gpu-test.sh run-bundle [--tests|--bench] ARCHIVE|DIR [OUT]}"
      out="${2:-${BATON_GPU_TEST_OUT:-$PWD/gpu-test-out}}"
      if [[ -f "$path" ]]; then
        unpack="$(mktemp -d -t baton-gpu.XXXXXX)"
        tar -C "$unpack" -xJf "$path" || die "cannot unpack $path"
        path="$unpack/baton-gpu"
      fi
      [[ -d "$path/tests" ]] || die "$path is not an unpacked bundle (no tests/)"
      path="$(cd "$path" && pwd)"
      TESTS="$path/tests" BIN="$path/bin" LIB="$path/lib" SHARE="$path/share"
      run_check "$path" "$out" "$mode"
      ;;
    "" | */*)
      repo="$(cd "$(dirname "$SCRIPT")/.." && pwd)"
      out="${1:-${BATON_GPU_TEST_OUT:-$repo/build/gpu-test}}"
      cd "$repo"
      # Set up and build only what is missing: a GPU host that already has the packages must
      # not need apt-get (scripts/setup.sh only runs dpkg-query when nothing is missing).
      scripts/setup.sh
      scripts/build.sh
      share="$(mktemp -d -t baton-gpu-share.XXXXXX)"
      for f in "${BUNDLE_SHARE[@]}"; do cp "$f" "$share/"; done
      cp "$BUNDLE_TEXT" "$share/training-text.txt"
      TESTS="$repo/build/tests" BIN="$repo/build/bin" LIB="" SHARE="$share"
      run_check "$repo" "$out" "$mode"
      ;;
    *)
      die "unknown command '$1' ([--tests|--bench] [OUT with a /], bundle DIR, run-bundle [--tests|--bench] PATH [OUT])"
      ;;
  esac
}

# Sourced (a test of its functions), it only defines them.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then main "$@"; fi
