#!/usr/bin/env bash
# ctest entry of the Python client's tests: pytest in the checkout's .venv
# (scripts/setup_python.sh) against build/bin/centroidkv-server. Fails when the environment
# is missing and when pytest collected no test (its exit 5), never passing silently.
# Usage: run_pytest.sh REPO_ROOT BIN_DIR SHARED_DIR [pytest args...] (default: tests/python)
set -uo pipefail
repo=$1 bin_dir=$2 shared_dir=$3
shift 3
python="$repo/.venv/bin/python"
if [ ! -x "$python" ]; then
  echo "run_pytest: $python is missing; run scripts/setup_python.sh (scripts/setup.sh does)" >&2
  exit 1
fi
export CKV_BIN_DIR="$bin_dir" CKV_SHARED_DIR="$shared_dir"
cd "$repo"
[ $# -gt 0 ] || set -- tests/python
"$python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_pytest: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
