#!/usr/bin/env bash
# The device check's script without a GPU (scripts/gpu-test.sh): where it looks for NCCL
# (a Python wheel's nvidia/nccl/lib, which ldd never shows: NCCL is opened with dlopen), what
# a host without a driver gets (a summary file saying so, exit 1), the tests-only mode on a
# fake GPU host (shards side by side, the NCCL binaries after them, the summary written as
# the check goes, failures named) and, in a CUDA build, the bundle's size limit (one
# archive, refused when over it).
#
#   tests/gpu_test_script_test.sh REPO BUILD_DIR
set -euo pipefail
repo="$1"
build="$2"
tmp="$(mktemp -d -t baton-gpu-script-test.XXXXXX)"
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$tmp"' EXIT
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

# 3. --tests on a fake GPU host: nvidia-smi, the CUDA libraries and compute-sanitizer are
#    stand-ins, and so are the test binaries (scripts printing gtest's lines), so what is
#    checked is the script: which units run, how, and what the summary says.
fake="$tmp/fake"
mkdir -p "$fake/bin" "$fake/site/nvidia/cu13/lib" "$fake/bundle/tests" "$fake/bundle/bin" \
  "$fake/bundle/lib" "$fake/bundle/share"
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  touch "$fake/site/nvidia/cu13/lib/$lib"
done
cat >"$fake/bin/nvidia-smi" <<'SH'
#!/usr/bin/env bash
if [[ "${1:-}" == --query-gpu=* ]]; then echo "0, Fake GPU, 580.00, 1000 MiB, Default"; else echo "| CUDA Version: 13.0 |"; fi
SH
cat >"$fake/bin/fakepython" <<PY
#!/usr/bin/env bash
echo "$fake/site"
PY
# The sanitizer runs the program after its options, and says what it found.
cat >"$fake/bin/compute-sanitizer" <<'SH'
#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift 2; done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
SH
summary_file="$tmp/fake-out/gpu-summary.txt"
fake_test() {  # NAME BODY: a test binary that runs BODY, then prints gtest's last lines
  cat >"$fake/bundle/tests/$1" <<SH
#!/usr/bin/env bash
[[ "\${BATON_REQUIRE_GPU:-}" == 1 ]] || { echo "BATON_REQUIRE_GPU is not 1"; exit 3; }
echo "\$(basename "\$0") \${GTEST_SHARD_INDEX:-}/\${GTEST_TOTAL_SHARDS:-} \$*" >>"$fake/ran"
$2
SH
  chmod +x "$fake/bundle/tests/$1"
}
passed='echo "[  PASSED  ] $((10 + ${GTEST_SHARD_INDEX:-0})) tests."'
fake_test cuda_device_test "$passed"
fake_test cuda_kernels_test "$passed"
fake_test cuda_pipeline_test "$passed"
fake_test cuda_fused_pipeline_test "$passed"
fake_test cuda_tiled_pipeline_test "$passed"
fake_test nccl_real_test "$passed"
fake_test nccl_collective_real_test "$passed"
fake_test llama_cuda_test 'echo "[  FAILED  ] LlamaCudaTest.Planted"; exit 1'
# Passes only once cuda_device_test's line is in the summary: the summary is written while
# the check runs, not at its end (bounded: it gives up after 60 s and fails).
fake_test cuda_training_test "for i in \$(seq 600); do grep -q '^PASS cuda_device_test ' '$summary_file' && { $passed; exit 0; }; sleep 0.1; done; echo 'the summary had no line yet'; exit 1"
chmod +x "$fake/bin/"*
echo "cuda 13.0" >"$fake/bundle/BUILD_INFO"
if PATH="$fake/bin:/usr/bin:/bin" PYTHON="$fake/bin/fakepython" BATON_GPU_TEST_TIMEOUT=100 \
     bash "$repo/scripts/gpu-test.sh" run-bundle --tests "$fake/bundle" "$tmp/fake-out" \
     >"$tmp/fake.log" 2>&1; then
  fail "the check passed with a failing test binary: $(cat "$summary_file")"
fi
s="$(cat "$summary_file")"
for want in "PASS cuda_device_test (10 passed" "PASS cuda_training_test (10 passed" \
            "PASS cuda_pipeline_test shard 1/4 (10 passed" "PASS cuda_pipeline_test shard 4/4 (13 passed" \
            "FAIL llama_cuda_test: exit 1" "LlamaCudaTest.Planted" \
            "PASS compute-sanitizer memcheck: cuda_kernels_test 10 passed" \
            "PASS compute-sanitizer racecheck" "ERROR SUMMARY: 0 errors" \
            "FAIL cluster job: $fake/bundle/bin/coordinator is missing" "RESULT: 2 failed"; do
  [[ "$s" == *"$want"* ]] || fail "the summary lacks '$want':"$'\n'"$s"
done
[[ "$s" != *"bench"* ]] || fail "--tests ran the benchmark:"$'\n'"$s"
[[ "$(grep -c '^cuda_pipeline_test [0-3]/4' "$fake/ran")" == 4 ]] \
  || fail "cuda_pipeline_test did not run as 4 shards: $(cat "$fake/ran")"
grep -q "^cuda_kernels_test / --gtest_filter=CudaKernelsTest" "$fake/ran" \
  || fail "the sanitizer did not run cuda_kernels_test's selected cases: $(cat "$fake/ran")"
# The NCCL binaries run after all the others have finished, one at a time.
last_pool="$(grep -n -E '^(PASS|FAIL) (cuda|llama|compute)' "$summary_file" | tail -1 | cut -d: -f1)"
first_nccl="$(grep -n -E '^(PASS|FAIL) nccl' "$summary_file" | head -1 | cut -d: -f1)"
[[ -n "$first_nccl" && "$first_nccl" -gt "$last_pool" ]] \
  || fail "an NCCL binary ran beside the others:"$'\n'"$s"
[[ -s "$tmp/fake-out/logs/cuda_pipeline_test.shard2.log" ]] || fail "no log of shard 2 in logs/"
echo "ok: --tests on a fake GPU host: 4 shards, the sanitizer's runs, NCCL last, the summary as it goes, the failures named"

# 4. The bundle: one archive under its limit, refused over it (CUDA builds only).
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
