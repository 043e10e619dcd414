#!/usr/bin/env bash
# The checks of baton against Hugging Face transformers (tests/peer):
#
#   scripts/peer-test.sh [--tool build/tests/hf_peer_tool] [--batonctl build/bin/batonctl]
#                        [PYTEST ARGS...]
#
# Makes or reuses the peer virtualenv (scripts/peer-venv.sh: torch, transformers, outside
# the clone), then runs pytest on tests/peer with the tool's path in BATON_HF_PEER_TOOL and
# batonctl's in BATON_BATONCTL (its tests are skipped when it is not built).
# Exits non-zero when the install or a test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TOOL="build/tests/hf_peer_tool"
BATONCTL="build/bin/batonctl"
while [[ $# -ge 2 && ( "$1" == "--tool" || "$1" == "--batonctl" ) ]]; do
  if [[ "$1" == "--tool" ]]; then TOOL="$2"; else BATONCTL="$2"; fi
  shift 2
done
if [[ ! -x "$TOOL" ]]; then
  echo "peer-test: $TOOL is not built (cmake --build build --target hf_peer_tool)" >&2
  exit 1
fi
VENV="$(scripts/peer-venv.sh)"
export BATON_HF_PEER_TOOL="$(realpath "$TOOL")"
export BATON_BATONCTL="$(realpath -m "$BATONCTL")"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the clone
# One thread each: the numbers do not depend on it, and the machine is small.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs tests/peer "$@"
