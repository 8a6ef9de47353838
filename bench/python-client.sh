#!/usr/bin/env bash
# The Python client's speed next to the C++ client's (centroidkv-bench) on one server:
# llama3-8b preset at 4k and 32k, cpu and identity backends; prints one JSON line last.
# Extra flags go to bench/python_client_bench.py (--rounds N, --contexts 4096, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup_python.sh
bash scripts/build.sh centroidkv_server centroidkv_bench centroidkv_cli >&2
exec .venv/bin/python bench/python_client_bench.py --bin-dir "${CKV_BUILD_DIR:-build}/bin" "$@"
