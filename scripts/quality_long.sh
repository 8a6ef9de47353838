#!/usr/bin/env bash
# The retrieval evaluation on the long-context model (issue 22): builds the server and
# centroidkv-retrieval, starts a server, runs every case of models/longctx/retrieval_cases.txt
# with the full cache and with CentroidKV (through the server), StreamingLLM and H2O at each
# budget, and writes docs/quality-long-retrieval.md and .json (docs/quality-long.md discusses them).
# Extra arguments go to centroidkv-retrieval (e.g. --budgets 0.25 --methods centroidkv).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh centroidkv_server centroidkv_retrieval
bin=${CKV_BUILD_DIR:-build}/bin

CKV_SERVER_SOCKET=/tmp/centroidkv-quality-long.sock bash scripts/with_server.sh "$bin" "$bin/centroidkv-retrieval" --server "{server}" \
  --model models/longctx/model.bin --cases models/longctx/retrieval_cases.txt \
  --report-md docs/quality-long-retrieval.md "$@" >docs/quality-long-retrieval.json
