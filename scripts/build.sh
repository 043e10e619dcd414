#!/usr/bin/env bash
# Configures build/ (or $BATON_BUILD_DIR) once (Ninja, RelWithDebInfo) and builds
# incrementally: every target, or only the TARGETs named (and what they link).
#
#   scripts/build.sh                               everything: tests, benchmarks, tools
#   scripts/build.sh coordinator worker batonctl   only these (what scripts/demo.sh runs)
#
# Extra CMake arguments come from BATON_CMAKE_ARGS, e.g.
#   BATON_CMAKE_ARGS="-DBATON_WITH_CUDA=OFF -DBATON_SANITIZE=address" scripts/build.sh
# CMake re-runs only when build/ has no build.ninja or BATON_CMAKE_ARGS changed since the
# last configure. ccache is used automatically when installed (top-level CMakeLists.txt).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BATON_BUILD_DIR:-build}"
ARGS_STAMP="$BUILD_DIR/.baton_cmake_args"
read -r -a EXTRA_ARGS <<<"${BATON_CMAKE_ARGS:-}"
TARGETS=("$@")

if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  echo "build: configuring $BUILD_DIR ${EXTRA_ARGS[*]:-}"
  cmake -G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
  printf '%s\n' "${BATON_CMAKE_ARGS:-}" >"$ARGS_STAMP"
elif [[ -n "${BATON_CMAKE_ARGS:-}" && "$(cat "$ARGS_STAMP" 2>/dev/null || true)" != "$BATON_CMAKE_ARGS" ]]; then
  echo "build: reconfiguring $BUILD_DIR with ${EXTRA_ARGS[*]}"
  cmake -S . -B "$BUILD_DIR" "${EXTRA_ARGS[@]}"
  printf '%s\n' "$BATON_CMAKE_ARGS" >"$ARGS_STAMP"
fi

if [[ ${#TARGETS[@]} -eq 0 ]]; then
  echo "build: cmake --build $BUILD_DIR -j$(nproc)"
  cmake --build "$BUILD_DIR" -j"$(nproc)"
else
  echo "build: cmake --build $BUILD_DIR -j$(nproc) --target ${TARGETS[*]}"
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${TARGETS[@]}"
fi
