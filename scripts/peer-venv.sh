#!/usr/bin/env bash
# Makes (or reuses) the virtualenv for the Hugging Face peer checks and prints its path.
#
#   scripts/peer-venv.sh            # prints e.g. /root/.cache/baton/peer-venv-1a2b3c4d5e6f
#
# The venv lives OUTSIDE the clone, at ${BATON_PEER_VENV:-$HOME/.cache/baton/peer-venv-<hash>},
# where <hash> is that of tests/peer/requirements.txt: a changed requirements file makes a new
# venv, an unchanged one is reused (torch is large). A venv is used only once its install has
# finished (the marker file .baton-complete); a half-made one is removed and made again.
# torch comes from PyTorch's CPU-only index when that is reachable, else from PyPI (the same
# version, with its CUDA libraries). Progress goes to stderr, the path alone to stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

REQ=tests/peer/requirements.txt
HASH="$(sha256sum "$REQ" | cut -c1-12)"
VENV="${BATON_PEER_VENV:-$HOME/.cache/baton/peer-venv-$HASH}"
MARK="$VENV/.baton-complete"

log() { echo "peer-venv: $*" >&2; }

mkdir -p "$(dirname "$VENV")"
# One install at a time for a venv path: concurrent test runs wait here.
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
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
TORCH="$(grep -E '^torch[=<>~ ]' "$REQ" | head -1 | tr -d ' ')"
TORCH="${TORCH:-torch}"
log "installing $TORCH (CPU-only index first)"
if ! "${PIP[@]}" --quiet --timeout 30 --retries 1 \
    --index-url https://download.pytorch.org/whl/cpu "$TORCH" >&2 2>/dev/null; then
  log "PyTorch's CPU index is not reachable: installing $TORCH from PyPI"
  "${PIP[@]}" --quiet "$TORCH" >&2 || { log "could not install $TORCH"; exit 1; }
fi
log "installing -r $REQ"
"${PIP[@]}" --quiet -r "$REQ" >&2 || { log "could not install $REQ (is PyPI reachable?)"; exit 1; }
echo "$HASH" >"$MARK"
log "ready: $VENV"
echo "$VENV"
