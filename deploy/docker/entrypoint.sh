#!/bin/sh
# The image's entrypoint: the first argument picks the program, the rest are its flags.
#   coordinator --listen=0.0.0.0:7070 --db=/var/lib/baton/coordinator.db ...
#   worker --coordinator=coordinator:7070 --listen=0.0.0.0:7071 --advertise=NAME:7071 ...
#   batonctl workers --coordinator=coordinator:7070
# exec, so that the program receives SIGTERM from tini directly and stops cleanly.
set -eu

bin_dir="${BATON_BIN_DIR:-/opt/baton/bin}"

usage() {
  echo "usage: PROGRAM [FLAGS...]   PROGRAM: coordinator | worker | batonctl" >&2
  echo "  e.g. worker --coordinator=coordinator:7070 --listen=0.0.0.0:7071 --advertise=worker-0:7071" >&2
  echo "  'PROGRAM --help' lists its flags." >&2
}

case "${1:-}" in
  coordinator | worker | batonctl)
    program="$1"
    shift
    exec "$bin_dir/$program" "$@"
    ;;
  "" | -h | --help | help)
    usage
    exit 2
    ;;
  *)
    echo "baton-entrypoint: unknown program '$1'" >&2
    usage
    exit 2
    ;;
esac
