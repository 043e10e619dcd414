#!/usr/bin/env bash
# Makes (or reuses) the small virtualenv scripts/prepare-data.py runs in and prints its path.
#
#   scripts/data-venv.sh            # prints e.g. /root/.cache/baton/data-venv-1a2b3c4d5e6f
#
# It holds only Hugging Face's `tokenizers` (scripts/data-requirements.txt; about 70 MB,
# seconds to install), not the peer checks' torch and transformers (scripts/peer-venv.sh).
# The venv lives OUTSIDE the clone, at ${BATON_DATA_VENV:-$HOME/.cache/baton/data-venv-<hash>},
# where <hash> is that of the requirements file: a changed file makes a new venv, an
# unchanged one is reused. A venv is used only once its install has finished (the marker
# .baton-complete); a half-made one is removed and made again. Installing needs PyPI (or a
# pip configured for a mirror): without it this exits 1 and says so. Progress goes to
# stderr, the path alone to stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

REQ=scripts/data-requirements.txt
HASH="$(sha256sum "$REQ" | cut -c1-12)"
VENV="${BATON_DATA_VENV:-$HOME/.cache/baton/data-venv-$HASH}"
MARK="$VENV/.baton-complete"

log() { echo "data-venv: $*" >&2; }

mkdir -p "$(dirname "$VENV")"
# One install at a time for a venv path: concurrent runs wait here.
exec 9>"$VENV.lock"
flock 9

if [[ -f "$MARK" && "$(cat "$MARK")" == "$HASH" ]]; then
  echo "$VENV"
  exit 0
fi

rm -rf "$VENV"
log "creating $VENV"
if ! python3 -m venv "$VENV" >&2; then
  log "python3 -m venv failed (on Debian's python3 it needs the python3-venv package)"
  exit 1
fi
log "installing -r $REQ"
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --quiet \
    --timeout 30 --retries 1 -r "$REQ" >&2; then
  log "could not install $REQ (is PyPI reachable?)"
  rm -rf "$VENV"
  exit 1
fi
echo "$HASH" >"$MARK"
log "ready: $VENV"
echo "$VENV"
