#!/usr/bin/env bash
# Configures and builds CentroidKV into build/ (binaries in build/bin/).
# Usage: scripts/build.sh [cmake target ...]   (no target: everything, tests included)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${CKV_BUILD_DIR:-build}
jobs=${CKV_JOBS:-$(nproc)}
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  launcher=()
  # ccache, where the machine has it, only speeds rebuilds up (nothing requires it).
  if command -v ccache >/dev/null 2>&1 && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
fi
if [ $# -eq 0 ]; then
  cmake --build "$build_dir" -j "$jobs"
else
  for target in "$@"; do cmake --build "$build_dir" -j "$jobs" --target "$target"; done
fi
