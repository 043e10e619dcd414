#!/usr/bin/env bash
# The peer benchmark: baton against PyTorch on the CPU (bench/peer/README.md).
#
#   bench/peer/run.sh [--smoke] [--rounds 3] [--steps 30] [--kinds fp32,bf16,pipeline]
#                     [--json results.json] [...]      # any flag of bench/peer/peer_bench.py
#   bench/peer/run.sh --accuracy [--seeds 5] [--steps 100] [--json acc.json]
#                                                       # bench/peer/accuracy.py instead
#
# Makes or reuses the peer virtualenv (scripts/peer-venv.sh: torch, outside the clone) and
# runs the driver with it. Builds nothing: it uses build/bin/{batonctl,coordinator,worker}
# (--bin DIR for others). Exits non-zero only when something fails to run, never on speed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

script=bench/peer/peer_bench.py
if [[ "${1:-}" == "--accuracy" ]]; then
  script=bench/peer/accuracy.py
  shift
fi
VENV="$(scripts/peer-venv.sh)"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the clone
exec "$VENV/bin/python" "$script" "$@"
