#!/usr/bin/env bash
# Configures and builds a sanitizer build of CentroidKV with clang-14:
#   address,undefined -> build-asan/ (ASan+UBSan, and the libFuzzer targets of fuzz/)
#   thread            -> build-tsan/ (TSan, linked to instrumented oneTBB and Abseil
#                        synchronisation: scripts/build-tsan-deps.sh)
# -O1 and line tables only: the usual sanitizer trade (compiles in about half the time of
# -O2 -g, stacks still symbolize to lines). CUDA is off in both (cmake/ckv_sanitize.cmake). CKV_SANITIZE_BUILD_DIR overrides the folder.
# Usage: scripts/build-sanitized.sh address,undefined|thread [cmake target ...]
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=${1:?usage: build-sanitized.sh address,undefined|thread [target ...]}
shift
case "$sanitize" in
  address,undefined|undefined,address) sanitize=address,undefined; dir=build-asan; fuzz=ON ;;
  thread) dir=build-tsan; fuzz=OFF ;;
  *) echo "build-sanitized.sh: unknown sanitizer set '$sanitize'" >&2; exit 2 ;;
esac
export CKV_BUILD_DIR=${CKV_SANITIZE_BUILD_DIR:-$dir}
link=()
if [ "$sanitize" = thread ]; then
  # oneTBB and Abseil's synchronisation instrumented (scripts/build-tsan-deps.sh), found
  # through the binaries' RPATH. DT_RPATH rather than RUNPATH: it also applies to the
  # libraries' own dependencies, so that libgrpc's absl::Mutex is the instrumented one too.
  deps_lib=$(bash scripts/build-tsan-deps.sh)
  link=(-DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags,-rpath,$deps_lib")
fi
if [ ! -f "$CKV_BUILD_DIR/CMakeCache.txt" ] ||
   { [ -n "${deps_lib:-}" ] && ! grep -qF -- "-rpath,$deps_lib" "$CKV_BUILD_DIR/CMakeCache.txt"; }; then
  launcher=()
  # ccache as in build.sh: a second sanitizer build of unchanged sources is mostly cache hits.
  if command -v ccache >/dev/null 2>&1 && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S . -B "$CKV_BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
    -DCMAKE_CXX_COMPILER=clang++-14 -DCKV_SANITIZE="$sanitize" -DCKV_BUILD_FUZZ="$fuzz" \
    -DCKV_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    "${link[@]}"
fi
exec bash scripts/build.sh "$@"
