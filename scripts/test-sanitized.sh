#!/usr/bin/env bash
# The sanitizer legs of the test command, each in its own clang-14 build
# folder and building only the targets it runs (scripts/build-sanitized.sh). Prints each
# leg's wall time (the measured times are in docs/reliability.md).
# Usage: scripts/test-sanitized.sh MODE
#   address,undefined  the whole suite under ASan+UBSan, fuzz smoke runs included (build-asan/)
#   thread             the service and client tests under TSan (build-tsan/, with oneTBB and
#                      Abseil's synchronisation instrumented: scripts/build-tsan-deps.sh)
#   ci                 what CI runs after the normal suite: the fuzz smoke runs and the
#                      service and client tests under ASan+UBSan, then the service and client
#                      tests under TSan
# Any sanitizer report fails its test: ASan aborts, UBSan and TSan halt on the first error
# (TSan exits 66 even where the test's assertions passed).
set -euo pipefail
cd "$(dirname "$0")/.."
unset CKV_SANITIZE_BUILD_DIR  # the legs use build-asan/ and build-tsan/

# A sanitizer report fails the test that triggers it. TSan's suppressions (third-party
# frames only, each one explained) are in scripts/tsan.supp.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
# Symbolized stacks: llvm-14's symbolizer (scripts/setup.sh), also when no llvm-symbolizer is on PATH.
[ -x /usr/lib/llvm-14/bin/llvm-symbolizer ] &&
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-14/bin/llvm-symbolizer} \
         TSAN_SYMBOLIZER_PATH=${TSAN_SYMBOLIZER_PATH:-/usr/lib/llvm-14/bin/llvm-symbolizer}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# ignore_noninstrumented_modules: libc calls made from inside Debian's uninstrumented gRPC,
# protobuf and Abseil are not checked (scripts/tsan.supp says why).
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/scripts/tsan.supp}

# Tests that assert what only an uninstrumented build can meet: wall-clock bounds (a deadline
# of 2 s for sending a job, "stops within a second", CPU used after a cancel, SIGTERMs each
# within 3 s; under a
# sanitizer the same work takes 5-15x as long) and the server's RSS against its stated bound
# (the sanitizers' shadow memory and allocator metadata add to RSS). They fail on that, not
# on a finding; and glibc's heap tuning (mallopt, which the sanitizers' own allocators
# refuse). They run in the normal suite and the sanitizer legs leave them out.
uninstrumented_only_tests='HeapTuningTest\.|CompressReactorTest\.(ExpiredDeadlineDropsWork|CancelledBigJobStopsUsingCpuWithinASecond)$|ServerMainTest\.(SigtermDuringALongJobExitsZeroEveryTime|SigtermWhileJobsFinishInTheDrainExitsWithinThreeSeconds|JobsAtTheLargestChunkLimitStopInsideTheirChunk)$|CpuEngineTest\.CancelStopsTheCpuInsideAChunk|ServerMemoryTest\.'

run_ctest() {  # build dir, then ctest arguments
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure -j "${CKV_TEST_JOBS:-2}" --timeout 600 "$@")
}
leg() {  # name, then the command
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "test-sanitized.sh: $name took $((SECONDS - start)) s"
}

asan_all() {
  bash scripts/build-sanitized.sh address,undefined
  run_ctest build-asan -E "$uninstrumented_only_tests"
}
asan_fuzz_smoke() {
  bash scripts/build-sanitized.sh address,undefined ckv_compress_stream_fuzzer \
    ckv_wire_convert_fuzzer ckv_npy_fuzzer ckv_model_fuzzer
  run_ctest build-asan -R '_fuzzer_smoke$'
}
asan_service_client() {
  bash scripts/build-sanitized.sh address,undefined ckv_service_test ckv_client_test
  run_ctest build-asan -R '^ckv_(service|client)_test\.' -E "$uninstrumented_only_tests"
}
tsan_service_client() {
  bash scripts/build-sanitized.sh thread ckv_service_test ckv_client_test
  # The leg means nothing against Debian's uninstrumented oneTBB and Abseil: make sure the
  # binaries (and the server they start) load the instrumented copies.
  local deps_lib binary library
  deps_lib=$(bash scripts/build-tsan-deps.sh)
  local loaded
  for binary in ckv_service_test ckv_client_test centroidkv-server centroidkv; do
    loaded=$(ldd "build-tsan/bin/$binary")  # not piped into grep -q: pipefail and SIGPIPE
    for library in libtbb.so.12 libabsl_synchronization.so.20220623; do
      # The client CLI links no engine, so no oneTBB.
      [ "$binary/$library" = centroidkv/libtbb.so.12 ] && continue
      if ! grep -qF "$library => $deps_lib/" <<<"$loaded"; then
        echo "test-sanitized.sh: build-tsan/bin/$binary does not load $library from $deps_lib" >&2
        return 1
      fi
    done
  done
  run_ctest build-tsan -R '^ckv_(service|client)_test\.' -E "$uninstrumented_only_tests"
}

case "${1:-}" in
  address,undefined|undefined,address) leg "asan+ubsan (whole suite)" asan_all ;;
  thread) leg "tsan (service, client)" tsan_service_client ;;
  ci)
    leg "asan+ubsan (fuzz smoke)" asan_fuzz_smoke
    leg "asan+ubsan (service, client)" asan_service_client
    leg "tsan (service, client)" tsan_service_client ;;
  *) echo "usage: test-sanitized.sh address,undefined|thread|ci" >&2; exit 2 ;;
esac
