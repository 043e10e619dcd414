#!/usr/bin/env bash
# The tests that need a real GPU. Each runs with BATON_REQUIRE_GPU=1, under which a test
# that finds no CUDA device fails instead of skipping: a pass here means the GPU was used.
#
#   scripts/gpu-test.sh                  set up, build, and run them from build/tests
#   scripts/gpu-test.sh bundle DIR       pack them, with every shared library they load
#                                        but glibc's and the driver's, into DIR
#   scripts/gpu-test.sh run-bundle DIR   run a bundle on a GPU host that lacks baton's
#                                        build dependencies (gRPC, Abseil, ... from Debian)
#
# scripts/test.sh runs the same tests everywhere; without a GPU they skip with a message.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The test binaries (under build/tests) with real-GPU cases. A new GPU test goes here.
GPU_TESTS=(cuda_device_test cuda_kernels_test cuda_training_test cuda_pipeline_test
           nccl_real_test nccl_collective_real_test)
# Programs a bundle also carries (build/bin), for runs by hand on the GPU host.
BUNDLE_TOOLS=(batonctl coordinator worker)

log() { echo "gpu-test: $*" >&2; }

run_tests() {  # DIR holding the binaries; extra environment already exported
  local dir="$1" failed=()
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu-test: device: /' >&2 || log "nvidia-smi not found"
  for t in "${GPU_TESTS[@]}"; do
    log "running $t"
    if ! BATON_REQUIRE_GPU=1 "$dir/$t" --gtest_brief=0; then
      failed+=("$t")
    fi
  done
  if [[ ${#failed[@]} -gt 0 ]]; then
    log "FAILED: ${failed[*]}"
    return 1
  fi
  log "all ${#GPU_TESTS[@]} GPU test binaries passed"
}

case "${1:-}" in
  "")
    scripts/setup.sh
    scripts/build.sh
    run_tests build/tests
    ;;
  bundle)
    out="${2:?usage: scripts/gpu-test.sh bundle DIR}"
    rm -rf "$out"
    mkdir -p "$out/lib"
    mkdir -p "$out/bin"
    bins=()
    for t in "${GPU_TESTS[@]}"; do cp "build/tests/$t" "$out/" && bins+=("build/tests/$t"); done
    for t in "${BUNDLE_TOOLS[@]}"; do cp "build/bin/$t" "$out/bin/" && bins+=("build/bin/$t"); done
    for b in "${bins[@]}"; do
      # Every library the loader resolves, but glibc's (the host's own must be used),
      # libcuda (the driver's) and the CUDA toolkit's (cuBLAS alone is 0.5 GB; the GPU
      # host has its own CUDA 13, found by run-bundle).
      ldd "$b" | awk '/=> \//{print $3}' |
        grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
        grep -v '^/usr/local/cuda' |
        while read -r lib; do cp -nL "$lib" "$out/lib/"; done
    done
    # Debug info off: a bundle travels (the device tool carries 64 MiB at most).
    find "$out" -type f \( -name '*_test' -o -path '*/bin/*' -o -name '*.so*' \) \
      -exec strip --strip-debug {} +
    cp "${BASH_SOURCE[0]}" "$out/gpu-test.sh"
    log "bundle in $out ($(du -sh "$out" | cut -f1))"
    ;;
  run-bundle)
    dir="$(cd "${2:?usage: scripts/gpu-test.sh run-bundle DIR}" && pwd)"
    # The host's CUDA 13 runtime and cuBLAS: the toolkit's, else a pip wheel's.
    cuda_libs=""
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
      found="$(ls /usr/local/cuda/lib64/$lib /usr/local/cuda/lib/$lib 2>/dev/null | head -1 || true)"
      [[ -n "$found" ]] || found="$(find / -xdev -name "$lib" 2>/dev/null | head -1 || true)"
      [[ -n "$found" ]] || { log "$lib not found on this host"; continue; }
      cuda_libs="$cuda_libs:$(dirname "$found")"
    done
    export LD_LIBRARY_PATH="$dir/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    run_tests "$dir"
    ;;
  *)
    log "unknown command $1 (none, bundle DIR or run-bundle DIR)"
    exit 2
    ;;
esac
