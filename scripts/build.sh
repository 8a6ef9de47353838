#!/usr/bin/env bash
# Configures and builds CentroidKV into build/ (binaries in build/bin/).
# Usage: scripts/build.sh [cmake target ...]   (no target: everything, tests included)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${CKV_BUILD_DIR:-build}
jobs=${CKV_JOBS:-$(nproc)}
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
if [ $# -eq 0 ]; then
  cmake --build "$build_dir" -j "$jobs"
else
  for target in "$@"; do cmake --build "$build_dir" -j "$jobs" --target "$target"; done
fi
