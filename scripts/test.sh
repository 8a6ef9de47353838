#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs every test.
# This is what CI runs (.ci/run). GPU tests skip, visibly, on machines without a GPU.
# Then the sanitizer legs (scripts/test-sanitized.sh ci): a smoke run of each fuzz target
# and the service and client tests under ASan+UBSan, then the service and client tests under
# TSan (docs/reliability.md: what runs, how long it takes).
#   --sanitize=address,undefined | --sanitize=thread   only that sanitizer build and run
#   --sanitize=none                                    only the normal suite
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=${1:-}
bash scripts/setup.sh
case "$sanitize" in
  "" | --sanitize=none) ;;
  --sanitize=*) exec bash scripts/test-sanitized.sh "${sanitize#--sanitize=}" ;;
  *) echo "test.sh: unknown argument $sanitize" >&2; exit 2 ;;
esac
start=$SECONDS
bash scripts/build.sh
(cd "${CKV_BUILD_DIR:-build}" && ctest --output-on-failure -j "${CKV_TEST_JOBS:-2}" --timeout 600)
echo "test.sh: normal suite took $((SECONDS - start)) s"
[ "$sanitize" = --sanitize=none ] || bash scripts/test-sanitized.sh ci
