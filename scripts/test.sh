#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs every test.
# This is what CI runs (.ci/run). GPU tests skip, visibly, on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh
cd "${CKV_BUILD_DIR:-build}"
ctest --output-on-failure -j "${CKV_TEST_JOBS:-2}" --timeout 600
