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
source scripts/venv-lib.sh

install_tokenizers() {
  echo "data-venv: installing -r $2" >&2
  "$1/bin/python" -m pip install --disable-pip-version-check --progress-bar off --quiet \
    --timeout 30 --retries 1 -r "$2" >&2 ||
    { echo "data-venv: could not install $2 (is PyPI reachable?)" >&2; return 1; }
}

cached_venv data-venv scripts/data-requirements.txt "${BATON_DATA_VENV:-}" install_tokenizers
