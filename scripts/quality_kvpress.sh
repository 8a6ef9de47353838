#!/usr/bin/env bash
# CentroidKV among kvpress's presses: builds the server and centroidkv-quality, starts a
# server, runs bench/kvpress_quality.py on both real models (stories260K: fluent text;
# models/longctx: fluent text and its retrieval cases), runs centroidkv-quality on the same
# texts (the agreement check: our press against the C++ worker, kvpress's StreamingLLM
# against ours) and writes docs/results/quality-kvpress-*.json, then the tables
# docs/results/quality-kvpress-tables.md and the plot docs/results/quality-kvpress.png
# (bench/kvpress_report.py); docs/results/quality-kvpress.md discusses them. About 10
# minutes on 2 cores.
# Outlier heads of centroidkv+outliers: the rankings calibrated on their own texts and
# cases (docs/results/quality.md, docs/results/quality-long-retrieval.md), never on these.
# Usage: scripts/quality_kvpress.sh [stories260k|longctx|report|all] (default all)
set -euo pipefail
cd "$(dirname "$0")/.."

stage=${1:-all}
bash scripts/build.sh centroidkv_server centroidkv_quality
bash scripts/setup_python.sh >/dev/null
bin=${CKV_BUILD_DIR:-build}/bin
work=$(mktemp -d /tmp/ckv-kvpress.XXXXXX)
trap 'rm -rf "$work"' EXIT
with_server=(env CKV_SERVER_SOCKET=/tmp/centroidkv-quality-kvpress.sock bash scripts/with_server.sh "$bin")
budgets=0.5,0.25,0.1

run_model() {  # NAME MODEL PREFILL CONTINUATION OUTLIERS [more kvpress_quality.py args]
  local name=$1 model=$2 prefill=$3 continuation=$4 outliers=$5
  shift 5
  "${with_server[@]}" .venv/bin/python bench/kvpress_quality.py --server "{server}" \
    --model "$model" --tokenizer ../shared/models/tok512.bin --texts 16 --prefill "$prefill" --continuation "$continuation" \
    --budgets "$budgets" --outlier-heads "$outliers" --tokens-out "$work/$name.txt" \
    --json-out "docs/results/quality-kvpress-$name.json" "$@"
  "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --model "$model" \
    --tokenizer ../shared/models/tok512.bin --tokens-file "$work/$name.txt" \
    --prefill "$prefill" --continuation "$continuation" --budgets "$budgets" \
    --methods centroidkv,streamingllm --calibration-texts 0 --preset small-model --report-md "" \
    --report-json "docs/results/quality-kvpress-$name-cpp.json" --quiet
}

if [ "$stage" = stories260k ] || [ "$stage" = all ]; then
  run_model stories260k ../shared/models/stories260K.bin 384 96 4:0,4:2,2:3
fi
if [ "$stage" = longctx ] || [ "$stage" = all ]; then
  run_model longctx models/longctx/model.bin 768 128 2:0,0:1 \
    --cases models/longctx/retrieval_cases.txt
fi
bash scripts/ensure_matplotlib.sh quality_kvpress
/usr/bin/python3 bench/kvpress_report.py \
  docs/results/quality-kvpress-stories260k docs/results/quality-kvpress-longctx \
  --md docs/results/quality-kvpress-tables.md --png docs/results/quality-kvpress.png
