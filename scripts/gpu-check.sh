#!/usr/bin/env bash
# The CUDA backend's check on a machine with a GPU, in one call:
#   1. binaries: from the bundle .gpu-bundle/ when there is one (made on the dev machine by
#      `scripts/gpu-check.sh --bundle`: the GPU machine has nvcc and CMake but not this
#      project's Debian libraries), else configure and build the two targets here (-j16);
#   2. the GPU tests: the conformance suite on the gpu backend (golden cases, random parity
#      with the reference, properties) plus the CUDA engine's and the stages' own tests; then
#      the suite's parity cases again with the warp match (CKV_CUDA_MATCH=warp), since the
#      default is the tensor-core match;
#   3. compute-sanitizer memcheck and racecheck on a small subset of them;
#   4. centroidkv-gpu-bench (copy and pinned h2d bandwidth, kernel, end to end, CPU);
#   5. the service level: centroidkv-server with the gpu backend under centroidkv-bench
#      (bench/run-service.sh, a short sweep) for docs/results/cpu-vs-gpu.md.
# Results go to docs/results/gpu/ (results.md, results.json, bench.json, the logs) and, when $OUT is
# set (the device tool), to $OUT as well. A step that fails leaves the others' results.
# Exit status: 0 all passed; 1 a test or sanitizer failed; 3 no GPU here (nothing checked).
#
# Usage: scripts/gpu-check.sh            run the check (on the GPU machine)
#        scripts/gpu-check.sh --bundle   build and pack .gpu-bundle/ (on the dev machine)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
BUNDLE="$ROOT/.gpu-bundle"
RESULTS="$ROOT/docs/results/gpu"
BUILD_DIR="${CKV_BUILD_DIR:-$ROOT/build-gpu}"
TARGETS=(ckv_kernels_test centroidkv_gpu_bench centroidkv_server centroidkv_bench)
GPU_FILTER='Cuda/*:CudaEngineTest.*:CudaStagesOnHost/*:HostPipelineTest.*:*HostPipelineMatchTest.*:TileMatchTest.*:LayerStagesTest.*:EngineFactoryTest.*'
WARP_FILTER='Cuda/EngineConformanceTest.GoldenCases/*:Cuda/EngineConformanceTest.*Reference*:CudaEngineTest.*'
SANITIZER_FILTER='Cuda/EngineConformanceTest.GoldenCases/*:Cuda/EngineConformanceTest.TiesGoToTheLowestDestination/*:Cuda/EngineConformanceTest.FloorRisesEachPass/*:CudaEngineTest.*'

log() { echo "[gpu-check] $*" >&2; }

# --- on the dev machine: build and pack the bundle -------------------------------------
if [[ "${1:-}" == "--bundle" ]]; then
  BUILD_DIR="${CKV_BUILD_DIR:-$ROOT/build}"
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_CUDA_COMPILER_LAUNCHER="${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}"
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKV_ENABLE_CUDA=ON || exit 2
  cmake --build "$BUILD_DIR" -j"${CKV_JOBS:-2}" --target "${TARGETS[@]}" || exit 2
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/shared"
  for binary in ckv_kernels_test centroidkv-gpu-bench centroidkv-server centroidkv-bench; do
    strip -o "$BUNDLE/bin/$binary" "$BUILD_DIR/bin/$binary" || exit 2
    # Every shared library but the C and C++ runtimes (the GPU machine's image, Ubuntu 24.04
    # by its Python 3.12, has newer ones, and no Abseil or oneTBB).
    ldd "$BUILD_DIR/bin/$binary" | awk '/=> \//{print $3}' |
      grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
      while read -r lib; do cp -L -n "$lib" "$BUNDLE/lib/"; done
  done
  cp -r "$ROOT/../shared/golden" "$BUNDLE/shared/golden" || exit 2
  git -C "$ROOT" rev-parse HEAD > "$BUNDLE/COMMIT" 2>/dev/null
  log "bundle: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE (commit $(cat "$BUNDLE/COMMIT" 2>/dev/null))"
  exit 0
fi

# --- on the GPU machine ------------------------------------------------------------------
mkdir -p "$RESULTS"
rm -f "$RESULTS"/{results.md,results.json,tests.log,tests-warp.log,tests.xml,memcheck.log,racecheck.log,bench.log,build.log,service.log,logs.tar.gz}
START=$(date +%s)
# shellcheck disable=SC2317  # called by the EXIT trap
publish() {  # copy what exists to $OUT (flat: the device tool returns at most 8 files)
  if [[ -n "${OUT:-}" ]]; then
    for f in results.json results.md bench.json service.json; do
      [[ -f "$RESULTS/$f" ]] && cp "$RESULTS/$f" "$OUT/$f"
    done
    local logs=()
    for f in tests.log tests-warp.log memcheck.log racecheck.log bench.log build.log service.log; do
      [[ -f "$RESULTS/$f" ]] && logs+=("$f")
    done
    ((${#logs[@]})) && tar -C "$RESULTS" -czf "$OUT/logs.tar.gz" "${logs[@]}"
  fi
}
trap publish EXIT

CARD="none"
if command -v nvidia-smi >/dev/null 2>&1; then
  CARD="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >&2
fi
[[ -z "$CARD" ]] && CARD="none"

# 1. Binaries.
BIN=""
LIBS=""
SHARED_DIR="$ROOT/../shared"
if [[ -x "$BUNDLE/bin/ckv_kernels_test" ]]; then
  BIN="$BUNDLE/bin"
  LIBS="$BUNDLE/lib"
  SHARED_DIR="$BUNDLE/shared"
  log "binaries from the bundle (commit $(cat "$BUNDLE/COMMIT" 2>/dev/null || echo unknown))"
else
  log "no bundle: configure and build ${TARGETS[*]} in $BUILD_DIR"
  if cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKV_ENABLE_CUDA=ON \
       -DCKV_CUDA_ARCHITECTURES="90-real" >"$RESULTS/build.log" 2>&1 &&
     cmake --build "$BUILD_DIR" -j16 --target "${TARGETS[@]}" >>"$RESULTS/build.log" 2>&1; then
    BIN="$BUILD_DIR/bin"
  else
    log "build failed (see docs/results/gpu/build.log)"
  fi
fi
BUILD_SECONDS=$(( $(date +%s) - START ))
export CKV_SHARED_DIR="$SHARED_DIR"
if [[ -n "$LIBS" ]]; then export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi

SANITIZER="$(command -v compute-sanitizer ||
  find /usr/local/cuda*/bin /usr/local/cuda*/compute-sanitizer -name compute-sanitizer -type f \
    2>/dev/null | head -1)"

TESTS_PASSED=0; TESTS_FAILED=0; TESTS_SKIPPED=0; TESTS_RC=-1; GPU_SKIPPED=0
WARP_PASSED=0; WARP_FAILED=0; WARP_RC=-1
MEMCHECK_RC=-1; RACECHECK_RC=-1; BENCH_RC=-1; SERVICE_RC=-1; BENCH_LINE="{}"
NO_GPU=0
if [[ -n "$BIN" ]]; then
  # 2. The GPU tests.
  timeout 150 "$BIN/ckv_kernels_test" --gtest_filter="$GPU_FILTER" \
    --gtest_output="xml:$RESULTS/tests.xml" >"$RESULTS/tests.log" 2>&1
  TESTS_RC=$?
  TESTS_PASSED=$(grep -c '^\[       OK \]' "$RESULTS/tests.log")
  TESTS_FAILED=$(grep -Ec '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$RESULTS/tests.log")
  TESTS_SKIPPED=$(grep -Ec '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$RESULTS/tests.log")
  GPU_SKIPPED=$(grep -Ec '^\[  SKIPPED \] (Cuda/|CudaEngineTest).* \([0-9]+ ms\)$' "$RESULTS/tests.log")
  if grep -q 'no CUDA device' "$RESULTS/tests.log"; then NO_GPU=1; fi
  log "tests: rc $TESTS_RC, $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped ($GPU_SKIPPED GPU cases skipped)"
  if [[ $NO_GPU -eq 0 ]]; then
    CKV_CUDA_MATCH=warp timeout 60 "$BIN/ckv_kernels_test" --gtest_filter="$WARP_FILTER" \
      >"$RESULTS/tests-warp.log" 2>&1
    WARP_RC=$?
    WARP_PASSED=$(grep -c '^\[       OK \]' "$RESULTS/tests-warp.log")
    WARP_FAILED=$(grep -Ec '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$RESULTS/tests-warp.log")
    log "tests with the warp match: rc $WARP_RC, $WARP_PASSED passed, $WARP_FAILED failed"
  fi

  # 3. compute-sanitizer on a subset (skipped without a GPU or without the tool).
  if [[ $NO_GPU -eq 0 && -n "$SANITIZER" ]]; then
    timeout 80 "$SANITIZER" --tool memcheck --leak-check full --error-exitcode 9 \
      "$BIN/ckv_kernels_test" --gtest_filter="$SANITIZER_FILTER" >"$RESULTS/memcheck.log" 2>&1
    MEMCHECK_RC=$?
    timeout 80 "$SANITIZER" --tool racecheck --error-exitcode 9 \
      "$BIN/ckv_kernels_test" --gtest_filter="$SANITIZER_FILTER" >"$RESULTS/racecheck.log" 2>&1
    RACECHECK_RC=$?
    log "compute-sanitizer: memcheck rc $MEMCHECK_RC, racecheck rc $RACECHECK_RC"
  else
    log "compute-sanitizer: skipped (${SANITIZER:-not found}; no GPU: $NO_GPU)"
  fi

  # 4. The benchmark.
  if [[ $NO_GPU -eq 0 && -x "$BIN/centroidkv-gpu-bench" ]]; then
    timeout 130 "$BIN/centroidkv-gpu-bench" --out="$RESULTS/bench.json" \
      >"$RESULTS/bench.stdout" 2>"$RESULTS/bench.log"
    BENCH_RC=$?
    cat "$RESULTS/bench.stdout" >>"$RESULTS/bench.log"
    BENCH_LINE="$(grep '^{' "$RESULTS/bench.stdout" | tail -1)"
    [[ -z "$BENCH_LINE" ]] && BENCH_LINE="{}"
    rm -f "$RESULTS/bench.stdout"
    log "bench: rc $BENCH_RC: $BENCH_LINE"
  fi

  # 5. The service level with the gpu backend (rows for docs/results/cpu-vs-gpu.md).
  if [[ $NO_GPU -eq 0 && -x "$BIN/centroidkv-server" && -x "$BIN/centroidkv-bench" ]]; then
    CKV_BIN_DIR="$BIN" timeout 60 bench/run-service.sh --backend gpu \
      --out "$RESULTS/service.json" --contexts 4096,32768 --concurrency 1,4 \
      --jobs-per-stream 4 >"$RESULTS/service.log" 2>&1
    SERVICE_RC=$?
    log "service level: rc $SERVICE_RC (docs/results/gpu/service.json)"
  fi
fi

if [[ "$CARD" == "none" || $NO_GPU -eq 1 ]]; then
  log "NO GPU: no usable CUDA device on this machine; nothing was checked on a GPU"
  NO_GPU=1
fi

# 5. results.json and results.md.
field() {  # a number (or null) from the bench's JSON line
  local v
  v="$(echo "$BENCH_LINE" | grep -o "\"$1\": *[-0-9.e]*" | head -1 | sed 's/.*: *//')"
  echo "${v:-null}"
}
COPY_GBPS=$(field copy_gbps); H2D_GBPS=$(field h2d_gbps)
KERNEL_FRACTION=$(field kernel_fraction_of_copy); E2E_FRACTION=$(field e2e_fraction_of_h2d)
TOTAL_SECONDS=$(( $(date +%s) - START ))
cat >"$RESULTS/results.json" <<EOF
{
  "card": "$CARD",
  "no_gpu": $([[ $NO_GPU -eq 1 ]] && echo true || echo false),
  "commit": "$(cat "$BUNDLE/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)",
  "tests_passed": $TESTS_PASSED,
  "tests_failed": $TESTS_FAILED,
  "tests_skipped": $TESTS_SKIPPED,
  "gpu_tests_skipped": $GPU_SKIPPED,
  "tests_rc": $TESTS_RC,
  "warp_match_tests_passed": $WARP_PASSED,
  "warp_match_tests_failed": $WARP_FAILED,
  "warp_match_tests_rc": $WARP_RC,
  "memcheck_rc": $MEMCHECK_RC,
  "racecheck_rc": $RACECHECK_RC,
  "bench_rc": $BENCH_RC,
  "service_rc": $SERVICE_RC,
  "copy_gbps": $COPY_GBPS,
  "kernel_fraction_of_copy": $KERNEL_FRACTION,
  "h2d_gbps": $H2D_GBPS,
  "e2e_fraction_of_h2d": $E2E_FRACTION,
  "targets": {"kernel_fraction_of_copy": 0.6, "e2e_fraction_of_h2d": 0.7},
  "build_seconds": $BUILD_SECONDS,
  "total_seconds": $TOTAL_SECONDS
}
EOF
{
  echo "# CUDA backend check: $CARD"
  echo
  echo "Written by \`scripts/gpu-check.sh\` on $(date -u +%Y-%m-%dT%H:%MZ), commit"
  echo "\`$(cat "$BUNDLE/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)\`."
  [[ $NO_GPU -eq 1 ]] && echo && echo "**No usable GPU on this machine: nothing below ran on a GPU.**"
  echo
  echo "| what | result |"
  echo "| --- | --- |"
  echo "| GPU tests (\`$GPU_FILTER\`) | $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped (GPU cases skipped: $GPU_SKIPPED), rc $TESTS_RC |"
  echo "| the same parity cases with the warp match (\`CKV_CUDA_MATCH=warp\`, \`$WARP_FILTER\`) | $WARP_PASSED passed, $WARP_FAILED failed, rc $WARP_RC |"
  echo "| compute-sanitizer memcheck / racecheck (\`$SANITIZER_FILTER\`) | rc $MEMCHECK_RC / rc $RACECHECK_RC (-1: not run) |"
  echo "| device-to-device copy (read + write) | $COPY_GBPS GB/s |"
  echo "| pinned host-to-device | $H2D_GBPS GB/s |"
  echo "| kernel, chunk 256, KV bytes/s over copy bandwidth (target 0.6) | $KERNEL_FRACTION |"
  echo "| end to end, chunk 256, KV bytes/s over pinned h2d (target 0.7) | $E2E_FRACTION |"
  echo
  echo "Rows of every run (bench.json):"
  echo
  echo '```'
  cat "$RESULTS/bench.json" 2>/dev/null || echo "(no bench.json)"
  echo '```'
  echo
  echo "Command: \`scripts/gpu-check.sh\` (build + tests + sanitizers + bench in ${TOTAL_SECONDS} s)."
} >"$RESULTS/results.md"

if [[ $NO_GPU -eq 1 ]]; then exit 3; fi
if [[ $TESTS_RC -ne 0 || $TESTS_FAILED -ne 0 || $GPU_SKIPPED -ne 0 ]]; then exit 1; fi
if [[ $WARP_RC -ne 0 || $WARP_FAILED -ne 0 ]]; then exit 1; fi
if [[ $MEMCHECK_RC -gt 0 || $RACECHECK_RC -gt 0 ]]; then exit 1; fi
exit 0
