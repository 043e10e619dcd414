#!/usr/bin/env bash
# Installs the Python tools the offline deployment checks (tests/deploy_test.sh) and the
# checkpoint interoperability test (tests/checkpoint_interop_test.py: the safetensors
# package, with numpy) need into a virtual environment at build/test-tools, and prints its
# bin/ directory on stdout.
# Idempotent: when the pinned versions are already there it only reads the installed
# packages' metadata and exits (well under a second). Everything else those checks use is
# a Debian package from scripts/setup.sh (docker-compose, promtool, yamllint).
#
# kubernetes-validate bundles the Kubernetes JSON schemas of every release it knows, so
# validation needs no network once it is installed; the install itself needs PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${BATON_TEST_TOOLS:-build/test-tools}"
# Pinned: a new release can change which Kubernetes versions it bundles and how strict
# --strict is, and a test should only change when this line does. PyYAML (a dependency of
# kubernetes-validate) is named because the test's own checks import it.
REQUIREMENTS=(kubernetes-validate==1.37.0 PyYAML==6.0.3 safetensors==0.8.0 numpy==2.3.5)

log() { echo "test-tools: $*" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  if ! python3 -m venv --clear "$VENV" >&2; then
    log "python3 -m venv failed (on Debian's python3 it needs the python3-venv package)"
    exit 1
  fi
fi

# The cheap "already installed?" check (no pip run): exits 0 only when every pinned version
# is the one installed.
if ! "$VENV/bin/python" - "${REQUIREMENTS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
for req in sys.argv[1:]:
    name, _, pinned = req.partition("==")
    try:
        if version(name) != pinned:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
then
  log "pip install ${REQUIREMENTS[*]}"
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      "${REQUIREMENTS[@]}" >&2; then
    log "could not install ${REQUIREMENTS[*]} into $VENV (is PyPI reachable?)"
    exit 1
  fi
fi

cd "$VENV/bin" && pwd
