# Sourced by the scripts that keep a virtualenv OUTSIDE the clone for test-only or data
# tools (scripts/peer-venv.sh, scripts/data-venv.sh). One function:
#
#   cached_venv NAME REQ VENV_OVERRIDE INSTALL_FN
#
# reuses, or makes, the venv $VENV_OVERRIDE (when set) or $HOME/.cache/baton/NAME-<hash>,
# where <hash> is that of the requirements file REQ: a changed file makes a new venv, an
# unchanged one is reused. A venv counts only once its install has finished (the marker
# .baton-complete holds the hash); a half-made one is removed and made again. One install
# at a time per venv path (flock): concurrent runs wait. INSTALL_FN VENV REQ installs into a
# fresh venv and returns non-zero on failure (then the venv is removed). Progress goes to
# stderr (as "NAME: ..."), the venv's path alone to stdout.
cached_venv() {
  local name="$1" req="$2" override="$3" install="$4"
  local hash venv mark
  hash="$(sha256sum "$req" | cut -c1-12)"
  venv="${override:-$HOME/.cache/baton/$name-$hash}"
  mark="$venv/.baton-complete"
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if [[ -f "$mark" && "$(cat "$mark")" == "$hash" ]]; then
    echo "$venv"
    return 0
  fi
  rm -rf "$venv"
  echo "$name: creating $venv" >&2
  if ! python3 -m venv "$venv" >&2; then
    echo "$name: python3 -m venv failed (on Debian's python3 it needs the python3-venv package)" >&2
    return 1
  fi
  if ! "$install" "$venv" "$req"; then
    rm -rf "$venv"
    return 1
  fi
  echo "$hash" >"$mark"
  echo "$name: ready: $venv" >&2
  echo "$venv"
}
