#!/usr/bin/env bash
# The retrieval evaluation on the long-context model (issue 22): builds the server and
# centroidkv-retrieval, starts a server, runs every case of models/longctx/retrieval_cases.txt
# with the full cache and with CentroidKV (through the server), StreamingLLM and H2O at each
# budget, and writes docs/quality-long.md and docs/quality-long.json.
# Extra arguments go to centroidkv-retrieval (e.g. --budgets 0.25 --methods centroidkv).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh centroidkv_server centroidkv_retrieval
bin=${CKV_BUILD_DIR:-build}/bin

socket_path=/tmp/centroidkv-quality-long.$$.sock
rm -f "$socket_path"
log=$(mktemp /tmp/centroidkv-quality-long-server.XXXXXX)
"$bin/centroidkv-server" --listen "unix://$socket_path" >"$log" 2>&1 &
server_pid=$!
cleanup() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -f "$log" "$socket_path"
}
trap cleanup EXIT
for _ in $(seq 1 100); do [ -S "$socket_path" ] && break; sleep 0.1; done

"$bin/centroidkv-retrieval" --server "unix://$socket_path" \
  --model models/longctx/model.bin --cases models/longctx/retrieval_cases.txt \
  --report-md docs/quality-long.md "$@" >docs/quality-long.json
