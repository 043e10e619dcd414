#!/usr/bin/env bash
# Installs what is missing, builds, and trains the example GPT locally. Extra arguments go
# to `batonctl train-local`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
scripts/build.sh

exec build/bin/batonctl train-local -f client/examples/gpt.json "$@"
