#!/usr/bin/env bash
# ThreadSanitizer-instrumented copies of the Debian libraries whose synchronisation the TSan
# leg must see (docs/reliability.md):
# - oneTBB (libtbb): its scheduler hands our clustering work between threads;
# - Abseil's base and synchronization libraries: every lock and condition variable inside
#   gRPC (gpr_mu, grpc_core::Mutex) is an absl::Mutex / absl::CondVar, so with these
#   instrumented TSan sees how gRPC orders a reactor's callbacks and its batches.
# Uninstrumented, TSan sees none of that ordering and reports every hand-off as a race.
# The same Debian source versions as the installed packages (apt-get source through a
# private deb-src list: the system's apt configuration is not touched), built with clang-14
# -fsanitize=thread, once per machine into ~/.cache/centroidkv/tsan-deps/<versions>/lib
# (CKV_TSAN_DEPS_DIR overrides the folder). About 5-8 minutes on 2 cores, then reused.
# The TSan build (scripts/build-sanitized.sh thread) links its binaries with this folder as
# their RPATH. Prints the folder on stdout; everything else goes to stderr.
set -euo pipefail

tbb_version=$(dpkg-query -W -f='${source:Version}' libtbb12)
absl_version=$(dpkg-query -W -f='${source:Version}' libabsl20220623)
root=${CKV_TSAN_DEPS_DIR:-$HOME/.cache/centroidkv/tsan-deps}
dir="$root/onetbb-${tbb_version}_abseil-${absl_version}_clang-14"
lib="$dir/lib"
if [ -f "$lib/.complete" ]; then
  echo "$lib"
  exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9  # another build of the same folder finishes first
if [ -f "$lib/.complete" ]; then
  echo "$lib"
  exit 0
fi
start=$SECONDS
{
  echo "build-tsan-deps: building instrumented onetbb $tbb_version and abseil $absl_version into $dir"
  rm -rf "$dir/src" "$dir/build" "$lib"
  mkdir -p "$dir/src" "$dir/apt/lists/partial" "$lib"
  cat >"$dir/apt/sources.list" <<'EOF'
deb-src http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian-security bookworm-security main
EOF
  apt_options=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o "Dir::Etc::SourceParts=-"
               -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache" -o "APT::Sandbox::User=$(id -un)" -qq)
  apt-get "${apt_options[@]}" update
  (cd "$dir/src" && apt-get "${apt_options[@]}" source "onetbb=$tbb_version" "abseil=$absl_version")

  launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  common=(-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 "${launcher[@]}"
          -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_SKIP_RPATH=ON
          -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG")
  jobs=${CKV_JOBS:-$(nproc)}
  tbb_src=$(find "$dir/src" -maxdepth 1 -type d -iname 'onetbb-*' | head -1)
  cmake -S "$tbb_src" -B "$dir/build/tbb" "${common[@]}" -DTBB_SANITIZE=thread -DTBB_TEST=OFF \
    -DTBB_EXAMPLES=OFF -DTBB_STRICT=OFF -DTBBMALLOC_BUILD=OFF -DTBB_ENABLE_IPO=OFF >/dev/null
  cmake --build "$dir/build/tbb" -j "$jobs" --target tbb >/dev/null
  absl_src=$(find "$dir/src" -maxdepth 1 -type d -name 'abseil-*' | head -1)
  # No RUNPATH in these (CMAKE_SKIP_RPATH): each library's dependencies then resolve through
  # the executable's RPATH, to the instrumented copies next to it.
  # Debian's own settings (debian/rules): C++17, shared libraries; its patched options.h
  # keeps the absl::debian3 inline namespace, so these replace the installed ones one for one.
  cmake -S "$absl_src" -B "$dir/build/abseil" "${common[@]}" -DCMAKE_CXX_STANDARD=17 \
    -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF -DCMAKE_CXX_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
  cmake --build "$dir/build/abseil" -j "$jobs" --target synchronization >/dev/null
  find "$dir/build/tbb" -name 'libtbb.so.*' -exec cp -P {} "$lib/" \;
  find "$dir/build/abseil/absl" -name 'libabsl_*.so.*' -exec cp -P {} "$lib/" \;
  rm -rf "$dir/build" "$dir/src"
  touch "$lib/.complete"
  echo "build-tsan-deps: done in $((SECONDS - start)) s: $(ls "$lib" | sed 's/\.so.*//' | sort -u | wc -l) libraries"
} >&2
echo "$lib"
