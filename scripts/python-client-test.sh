#!/usr/bin/env bash
# The Python client's tests (client/python/tests) against a real cluster from build/bin.
#
#   scripts/python-client-test.sh [--bin-dir build/bin] [PYTEST ARGS...]
#
# Every run installs the package the way a user does, into a fresh virtual environment
# (build/python-client-venv, removed first): `pip install ./client/python`, which builds the
# stubs from proto/ with the pinned grpcio-tools, plus the test-only tools below, all from
# PyPI (pip's cache makes the second run quick). Exits non-zero when the install or a test
# fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${BATON_PYTHON_CLIENT_VENV:-build/python-client-venv}"
# Test-only: the runner, and the optional extras the tests exercise (progress bars,
# History.to_pandas, the plotting example) and the type checker.
TOOLS=(pytest==9.2.0 tqdm==4.70.1 pandas==3.1.1 matplotlib==3.11.2 mypy==2.4.1 tensorboard==2.21.0)

log() { echo "python-client-test: $*" >&2; }

rm -rf "$VENV"
if ! python3 -m venv "$VENV" >&2; then
  log "python3 -m venv failed (on Debian's python3 it needs the python3-venv package)"
  exit 1
fi
log "pip install ./client/python ${TOOLS[*]}"
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    ./client/python "${TOOLS[@]}" >&2; then
  log "could not install the package or ${TOOLS[*]} into $VENV (is PyPI reachable?)"
  exit 1
fi
# `import baton` finds the installed package only: the source is under client/python/src,
# which is on no path.
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs client/python/tests "$@"
