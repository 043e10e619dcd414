#!/usr/bin/env bash
# Installs the Debian packages baton builds with. Idempotent: when everything is already
# installed it only runs dpkg-query and exits. Runs as root without a terminal (CI);
# as another user it uses sudo when available.
#
#   scripts/setup.sh           everything scripts/test.sh needs
#   scripts/setup.sh --demo    only what building and running scripts/demo.sh needs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# What configuring and building the services needs (CMake finds GTest and Google Benchmark
# at configure time even when only the services are built), and what the demo runs.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  protobuf-compiler libprotobuf-dev libgrpc++-dev protobuf-compiler-grpc
  libabsl-dev libopenblas-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev libsqlite3-dev prometheus-cpp-dev
  libpcre2-dev  # tokenizer.json pre-tokenizer regexes (batonctl sample)
  libdnnl-dev  # oneDNN: bf16 products on CPUs with AMX or AVX512-BF16 (common/core/bf16_gemm.h)
  ocl-icd-opencl-dev opencl-headers  # oneDNN's CMake package looks for OpenCL
  libgloo-dev  # collectives between data-parallel replicas on CPU (common/collective)
  python3
  python3-venv  # the demo's tokenizer venv (scripts/data-venv.sh), the Python client's, the peer checks'
  openssl  # scripts/make-certs.sh: the throwaway CA of `scripts/demo.sh --secure` and the TLS tests
)
if [[ "${1:-}" != --demo ]]; then
  PACKAGES+=(
    clang libclang-rt-14-dev  # fuzzing and the thread-safety analysis (scripts/test.sh)
    prometheus docker-compose yamllint  # the deployment and dashboard checks
    iproute2  # network namespaces and links for tests/netfault_test.py
  )
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
  else
    echo "setup: missing packages (${missing[*]}) and not root; install them as root" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "setup: missing ${missing[*]}"
echo "setup: apt-get update"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
echo "setup: apt-get install ${missing[*]}"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" </dev/null
echo "setup: done"
