#!/usr/bin/env bash
# The quality report of SPEC section 4 on the real model: builds the server and
# centroidkv-quality, starts a server, runs the comparison (CentroidKV through the server vs
# StreamingLLM, H2O-style eviction and k-means), and writes docs/results/quality.md,
# docs/results/quality.json and the plot docs/results/quality.png (python3-matplotlib,
# installed if missing).
# Extra arguments go to centroidkv-quality (e.g. --texts 16 --calibration-texts 8).
# `scripts/quality.sh --online [ARGS]`: the long-generation report of online compression
# instead (docs/results/quality-online.md and docs/results/quality-online.json; no plot).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh centroidkv_server centroidkv_quality
bin=${CKV_BUILD_DIR:-build}/bin

if [ "${1:-}" = "--online" ]; then
  CKV_SERVER_SOCKET=/tmp/centroidkv-quality.sock bash scripts/with_server.sh "$bin" \
    "$bin/centroidkv-quality" --server "{server}" \
    --model ../shared/models/stories260K.bin --tokenizer ../shared/models/tok512.bin "$@"
  /usr/bin/python3 scripts/stamp_regenerate.py "scripts/quality.sh --online" \
    docs/results/quality-online.md
  exit 0
fi
CKV_SERVER_SOCKET=/tmp/centroidkv-quality.sock bash scripts/with_server.sh "$bin" "$bin/centroidkv-quality" --server "{server}" \
  --model ../shared/models/stories260K.bin --tokenizer ../shared/models/tok512.bin \
  --report-md docs/results/quality.md --report-json docs/results/quality.json "$@"
/usr/bin/python3 scripts/stamp_regenerate.py scripts/quality.sh docs/results/quality.md

bash scripts/ensure_matplotlib.sh quality
/usr/bin/python3 scripts/plot_quality.py docs/results/quality.json docs/results/quality.png >&2
