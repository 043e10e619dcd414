#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test. Extra arguments go to ctest
# (e.g. scripts/test.sh -R core_test). Exits with ctest's status.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
scripts/build.sh

status=0
ctest --test-dir build --output-on-failure -j2 "$@" || status=$?
exit "$status"
