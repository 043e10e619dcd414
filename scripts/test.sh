#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (clang's thread-safety analysis and
# the layer check among them, ctest label `lint`); when the build has CUDA, also builds
# without it (build-nocuda/) and runs its unit tests. Extra arguments go to ctest (e.g.
# scripts/test.sh -R core_test). Exits non-zero when a build or a test failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
scripts/build.sh

status=0
logs=()  # ctest's output, copied, so the failures can be restated at the end
ctest --test-dir build --output-on-failure -j2 "$@" 2>&1 | tee build/ctest.log || status=$?
logs+=(build/ctest.log)

# The peer benchmark against PyTorch, as a smoke run (bench/peer/README.md): every kind runs
# 3 steps once; it fails only when something fails to run, never on speed.
echo "test: bench/peer/run.sh --smoke"
bench/peer/run.sh --smoke >build/peer-smoke.md || status=1

# When the main build has CUDA, the build without it (what a machine without nvcc gets)
# must build and pass too: its unit tests, in build-nocuda/ (the integration tests drive
# the same services and run above).
if [[ -x build/tests/cuda_kernels_test ]]; then  # built only with CUDA
  echo "test: the build without CUDA, in build-nocuda/"
  BATON_BUILD_DIR=build-nocuda BATON_CMAKE_ARGS="-DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF" \
    scripts/build.sh || status=1
  ctest --test-dir build-nocuda --output-on-failure -j2 -LE 'integration|fuzz|lint' "$@" 2>&1 |
    tee build-nocuda/ctest.log || status=$?
  logs+=(build-nocuda/ctest.log)
fi

# What failed, restated last: a failed test's output is printed where it failed, often
# thousands of lines before the end.
if [[ "$status" -ne 0 ]]; then
  echo "test: FAILED (exit $status); the failed tests and the end of their output:"
  scripts/ctest-failures.py "${logs[@]}" || true
fi
exit "$status"
