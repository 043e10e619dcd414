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
source scripts/venv-lib.sh

install_peer_tools() {
  local venv="$1" req="$2" torch
  local pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
  torch="$(grep -E '^torch[=<>~ ]' "$req" | head -1 | tr -d ' ')"
  torch="${torch:-torch}"
  echo "peer-venv: installing $torch (CPU-only index first)" >&2
  if ! "${pip[@]}" --quiet --timeout 30 --retries 1 \
      --index-url https://download.pytorch.org/whl/cpu "$torch" >&2 2>/dev/null; then
    echo "peer-venv: PyTorch's CPU index is not reachable: installing $torch from PyPI" >&2
    "${pip[@]}" --quiet "$torch" >&2 || { echo "peer-venv: could not install $torch" >&2; return 1; }
  fi
  echo "peer-venv: installing -r $req" >&2
  "${pip[@]}" --quiet -r "$req" >&2 ||
    { echo "peer-venv: could not install $req (is PyPI reachable?)" >&2; return 1; }
}

cached_venv peer-venv tests/peer/requirements.txt "${BATON_PEER_VENV:-}" install_peer_tools
