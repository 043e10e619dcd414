#!/usr/bin/env bash
# The device check: everything that needs a real GPU, in one run that ends with a one-screen
# summary. Each test binary runs with BATON_REQUIRE_GPU=1, under which a test that finds no
# CUDA device fails instead of skipping: a pass here means the GPU was used.
#
#   scripts/gpu-test.sh [OUT]              set up what is missing, build, run the check from
#                                          build/ (summary in OUT, default build/gpu-test)
#   scripts/gpu-test.sh bundle DIR         pack the check into DIR/baton-gpu.tar.xz, one archive
#                                          of at most 40 MiB (fails when larger), carrying every
#                                          shared library it loads but glibc's, the driver's and
#                                          CUDA's (the GPU host's own are used)
#   scripts/gpu-test.sh run-bundle PATH [OUT]
#                                          run it on a GPU host that lacks baton's build
#                                          dependencies and network; PATH is the archive or
#                                          the folder it unpacked to
#
# What the check runs, each under a timeout:
#   1. the host: the GPU, the driver and whether it is new enough for the CUDA the binaries
#      were built with; where the CUDA runtime, cuBLAS and NCCL come from (NCCL is opened with
#      dlopen: found on the loader path, in CUDA's folder or in a Python wheel's nvidia/nccl/lib,
#      and exported as BATON_NCCL_LIBRARY);
#   2. the GPU test binaries (GPU_TESTS below), with NCCL_DEBUG=WARN;
#   3. a cluster job: a coordinator and two workers sharing the GPU (gRPC between them, with
#      device staging), whose weights digest must equal `batonctl train-local --device cuda`'s;
#   4. the benchmark: tokens/s of a training step of the example GPT and of a 768-wide,
#      12-layer GPT with context 1024, baton on CUDA (bench/gpt_bench --device=cuda) against
#      PyTorch eager on the same GPU (bench/pytorch_gpt.py --device cuda), in fp32 (TF32
#      off on both sides), in bf16 (baton's PRECISION_BF16 against torch.autocast) and in
#      bf16 with baton's fused attention (BATON_FUSED_ATTENTION=1), with the ratios and
#      achieved TFLOP/s (PyTorch skipped, saying so, where python3 has no torch).
# The summary (gpu-summary.txt) and the whole log (gpu-test.log) are written to OUT, or to
# $BATON_GPU_TEST_OUT. The exit status is 0 only when every part passed.
#
# Environment: BATON_NCCL_LIBRARY (a libnccl.so.2 to use), BATON_GPU_TEST_TIMEOUT (seconds
# per test binary, default 150), BATON_GPU_BENCH=0 (skip the benchmark), PYTHON (the
# interpreter with torch, default python3), BATON_GPU_CHECK_DEVICE (cuda:0; cpu dry-runs the
# cluster job and the benchmark on a host without a GPU, to check this script).
#
# scripts/test.sh runs the same tests everywhere; without a GPU they skip with a message.
set -euo pipefail

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"

# The test binaries (under build/tests) with real-GPU cases. A new GPU test goes here.
GPU_TESTS=(cuda_device_test cuda_kernels_test llama_cuda_test cuda_training_test cuda_pipeline_test
           cuda_fused_pipeline_test nccl_real_test nccl_collective_real_test)
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

SUMMARY=()
FAILURES=0
note() { SUMMARY+=("$*"); log "$*"; }
fail() { SUMMARY+=("FAIL $*"); FAILURES=$((FAILURES + 1)); log "FAIL $*"; }

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

run_tests() {
  local t rc start secs counts
  for t in "${GPU_TESTS[@]}"; do
    if [[ ! -x "$TESTS/$t" ]]; then
      fail "$t: not built"
      continue
    fi
    log "running $t (timeout ${TEST_TIMEOUT}s)"
    start=$SECONDS
    rc=0
    BATON_REQUIRE_GPU=1 timeout --kill-after=10 "$TEST_TIMEOUT" "$TESTS/$t" --gtest_brief=0 \
      >"$WORK/$t.log" 2>&1 || rc=$?
    cat "$WORK/$t.log" >&2
    secs=$((SECONDS - start))
    counts="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}.*/\1 passed/p' "$WORK/$t.log" | tail -1)"
    local skipped
    skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}.*/\1 skipped/p' "$WORK/$t.log" | tail -1)"
    if [[ -n "$skipped" ]]; then
      counts="${counts:-?}, $skipped ($( (grep -o 'needs [0-9]* CUDA devices[^;]*' "$WORK/$t.log" || true) | sort -u | tr '\n' ' '))"
    fi
    if [[ $rc -eq 0 ]]; then
      note "PASS $t (${counts:-?}, ${secs}s)"
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
      fail "$t: timed out after ${TEST_TIMEOUT}s; last lines: $(tail -3 "$WORK/$t.log" | tr '\n' ' ')"
    else
      fail "$t: exit $rc (${secs}s): $(grep -E '^\[  FAILED  \]|Failure|error|Error' "$WORK/$t.log" | head -8 | tr '\n' ' ')"
    fi
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

json_digest() {  # the weights digest of a Job or train-local report on stdin
  python3 -c 'import json, sys; print(json.load(sys.stdin).get("weights_digest", ""))' 2>/dev/null
}

cluster_job() {
  local tmp coordinator spec steps=30 job rc=0 pids=() cluster_digest local_digest
  tmp="$(mktemp -d -t baton-gpu-cluster.XXXXXX)"
  spec="$tmp/gpt.json"
  sed "s#\"path\": *\"[^\"]*\"#\"path\": \"$SHARE/training-text.txt\"#" "$SHARE/gpt.json" >"$spec"
  "$BIN/coordinator" --listen 127.0.0.1:0 --db "$tmp/baton.db" --port_file "$tmp/c.port" \
    --metrics_listen "" --data_root "$SHARE" >"$tmp/coordinator.log" 2>&1 &
  pids+=($!)
  if ! coordinator="$(wait_file "$tmp/c.port" 20)"; then
    fail "cluster job: the coordinator did not start: $(tail -3 "$tmp/coordinator.log" | tr '\n' ' ')"
    kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null
    return
  fi
  for w in 1 2; do
    "$BIN/worker" --coordinator "$coordinator" --listen 127.0.0.1:0 --worker_id "gpu-$w" \
      --device "$DEVICE" --data_root "$SHARE" --metrics_listen "" --port_file "$tmp/w$w.port" \
      >"$tmp/worker-$w.log" 2>&1 &
    pids+=($!)
  done
  export BATON_COORDINATOR="$coordinator"
  if ! job="$(timeout 60 "$BIN/batonctl" submit -f "$spec" --device "${DEVICE%%:*}" --stages 2 \
                --microbatches 4 --schedule 1f1b --steps "$steps" 2>"$tmp/submit.err")"; then
    fail "cluster job: submit failed: $(cat "$tmp/submit.err")"
  elif ! timeout 120 "$BIN/batonctl" watch "$job" >"$tmp/watch.log" 2>&1; then
    rc=1
    fail "cluster job $job did not succeed: $(tail -4 "$tmp/watch.log" | tr '\n' ' ')"
  else
    cluster_digest="$(timeout 30 "$BIN/batonctl" get "$job" --output json | json_digest)"
    local_digest="$(timeout 120 "$BIN/batonctl" train-local -f "$spec" --device "${DEVICE%%:*}" \
      --steps "$steps" --output json 2>"$tmp/local.err" | json_digest)"
    if [[ -n "$cluster_digest" && "$cluster_digest" == "$local_digest" ]]; then
      note "PASS cluster job: 2 workers on one GPU (gRPC, device staging), 1F1B, $steps steps: digest ${cluster_digest:0:16}... = train-local --device cuda"
    else
      rc=1
      fail "cluster job: digest ${cluster_digest:-none} != train-local's ${local_digest:-none} $(tail -2 "$tmp/local.err" | tr '\n' ' ')"
    fi
  fi
  unset BATON_COORDINATOR
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  if [[ $rc -ne 0 ]]; then
    for f in "$tmp"/*.log; do
      log "--- last lines of $(basename "$f") ---"
      tail -15 "$f" >&2
    done
  fi
  rm -rf "$tmp"
}

bench() {
  local py="${PYTHON:-python3}" spec name tmp baton_tps torch_tps fpt
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
    # torch.autocast(bfloat16)); bf16 with baton's fused attention (BATON_FUSED_ATTENTION=1).
    for mode in fp32 bf16 bf16-fused; do
    precision="${mode%%-*}"
    env_fused=0
    [[ "$mode" == *fused ]] && env_fused=1
    name="$(basename "$spec" .json)-$mode"
    sed "s#\"path\": *\"[^\"]*\"#\"path\": \"$SHARE/training-text.txt\"#" "$spec" |
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
    if [[ -n "$py" && "$mode" != *fused ]]; then
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
    note "bench $name: baton ${DEVICE%%:*} $baton_tps tokens/s ($(python3 -c "print(f'{$baton_tps*$fpt/1e12:.2f}')") TFLOP/s at $fpt FLOP/token)"
    for v in $torch_tps; do
      note "bench $name: pytorch ${v%%=*} ${v#*=} tokens/s ($(python3 -c "print(f'{${v#*=}*$fpt/1e12:.2f}')") TFLOP/s); baton/pytorch = $(python3 -c "print(f'{$baton_tps/${v#*=}:.3f}')")"
    done
    done
  done
  note "bench: peaks of the device (datasheet, dense): fp32 (no TF32) 67 TFLOP/s, bf16 989 TFLOP/s on H100 SXM and H200"
  rm -rf "$tmp"
}

run_check() {  # ROOT (tests/ bin/ lib/ share/ layout, or the repository with build/) OUT
  ROOT="$1"
  local out="$2" start=$SECONDS
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  WORK="$(mktemp -d -t baton-gpu-check.XXXXXX)"
  TEST_TIMEOUT="${BATON_GPU_TEST_TIMEOUT:-150}"
  DEVICE="${BATON_GPU_CHECK_DEVICE:-cuda:0}"
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  exec > >(tee "$out/gpu-test.log") 2>&1
  log "check of $ROOT, summary in $out/gpu-summary.txt"
  if check_host; then
    run_tests
    cluster_job
    bench
  else
    fail "host: the checks did not run (see above)"
  fi
  {
    echo "baton GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), $((SECONDS - start)) s"
    printf '%s\n' "${SUMMARY[@]}"
    if [[ $FAILURES -eq 0 ]]; then echo "RESULT: all passed"; else echo "RESULT: $FAILURES failed"; fi
  } >"$out/gpu-summary.txt"
  echo
  echo "==================== summary ($out/gpu-summary.txt) ===================="
  cat "$out/gpu-summary.txt"
  rm -rf "$WORK"
  [[ $FAILURES -eq 0 ]]
}

main() {
  case "${1:-}" in
    bundle)
      make_bundle "${2:?usage: scripts/gpu-test.sh bundle DIR}"
      ;;
    run-bundle)
      path="${2:?usage: scripts/gpu-test.sh run-bundle ARCHIVE|DIR [OUT]}"
      out="${3:-${BATON_GPU_TEST_OUT:-$PWD/gpu-test-out}}"
      if [[ -f "$path" ]]; then
        unpack="$(mktemp -d -t baton-gpu.XXXXXX)"
        tar -C "$unpack" -xJf "$path" || die "cannot unpack $path"
        path="$unpack/baton-gpu"
      fi
      [[ -d "$path/tests" ]] || die "$path is not an unpacked bundle (no tests/)"
      path="$(cd "$path" && pwd)"
      TESTS="$path/tests" BIN="$path/bin" LIB="$path/lib" SHARE="$path/share"
      run_check "$path" "$out"
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
      run_check "$repo" "$out"
      ;;
    *)
      die "unknown command '$1' (none or OUT with a /, bundle DIR, run-bundle PATH [OUT])"
      ;;
  esac
}

# Sourced (a test of its functions), it only defines them.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then main "$@"; fi
