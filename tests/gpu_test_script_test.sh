#!/usr/bin/env bash
# The device check's script without a GPU (scripts/gpu-test.sh): where it looks for NCCL
# (a Python wheel's nvidia/nccl/lib, which ldd never shows: NCCL is opened with dlopen), what
# a host without a driver gets (a summary file saying so, exit 1), and, in a CUDA build, the
# bundle's size limit (one archive, refused when over it).
#
#   tests/gpu_test_script_test.sh REPO BUILD_DIR
set -euo pipefail
repo="$1"
build="$2"
tmp="$(mktemp -d -t baton-gpu-script-test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu_test_script_test: FAIL: $*" >&2; exit 1; }

# 1. NCCL in a wheel's folder, found through the Python that has it (where no other folder
#    has it: a file of a name only the wheel holds).
mkdir -p "$tmp/site/nvidia/nccl/lib" "$tmp/bin"
touch "$tmp/site/nvidia/nccl/lib/libnccl-only-in-the-wheel.so.2"
cat >"$tmp/bin/fakepython" <<PY
#!/usr/bin/env bash
echo "$tmp/site"
PY
chmod +x "$tmp/bin/fakepython"
found="$(PYTHON="$tmp/bin/fakepython" bash -c \
  "source '$repo/scripts/gpu-test.sh'; find_library libnccl-only-in-the-wheel.so.2")"
[[ "$found" == "$tmp/site/nvidia/nccl/lib/libnccl-only-in-the-wheel.so.2" ]] \
  || fail "a library in a wheel's nvidia/nccl/lib was not found (got '$found')"
echo "ok: NCCL found in a wheel's folder: $found"

# 2. A host without a driver: the check says so, in the summary file too, and fails.
mkdir -p "$tmp/bundle/tests" "$tmp/bundle/bin" "$tmp/bundle/lib" "$tmp/bundle/share"
echo "cuda 13.0" >"$tmp/bundle/BUILD_INFO"
if PATH="/usr/bin:/bin" bash "$repo/scripts/gpu-test.sh" run-bundle "$tmp/bundle" "$tmp/out" \
     >"$tmp/run.log" 2>&1; then
  fail "run-bundle passed on a host without a GPU"
fi
[[ -f "$tmp/out/gpu-summary.txt" ]] || fail "no summary file was written"
grep -q "FAIL host: nvidia-smi not found" "$tmp/out/gpu-summary.txt" \
  || fail "the summary does not say the driver is missing: $(cat "$tmp/out/gpu-summary.txt")"
grep -q "^RESULT: " "$tmp/out/gpu-summary.txt" || fail "the summary has no RESULT line"
echo "ok: without a driver the summary says so ($(tail -1 "$tmp/out/gpu-summary.txt"))"

# 3. The bundle: one archive under its limit, refused over it (CUDA builds only).
if [[ -x "$build/tests/cuda_kernels_test" ]]; then
  ( cd "$repo" && BATON_GPU_BUNDLE_MAX_MIB=1 bash scripts/gpu-test.sh bundle "$tmp/small" ) \
    >"$tmp/small.log" 2>&1 && fail "a bundle over a 1 MiB limit was made"
  grep -q "over the 1 MiB limit" "$tmp/small.log" || fail "no size refusal: $(tail -3 "$tmp/small.log")"
  [[ ! -e "$tmp/small/baton-gpu.tar.xz" ]] || fail "the refused bundle was left behind"
  echo "ok: a bundle over its limit is refused"
else
  echo "skipped: the bundle (this build has no CUDA)"
fi
echo "gpu_test_script_test: passed"
