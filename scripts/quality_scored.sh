#!/usr/bin/env bash
# Scored and fitted jobs against KVzip (docs/results/quality-scored.md and .json): builds the
# server, runs bench/kvpress_quality.py on both real models (stories260K: fluent text;
# models/longctx: fluent text and its retrieval cases) with KVzip, our scored presses at
# several centroid shares, fitted, the diagnostics (equal budgets, SnapKV's scores), SnapKV,
# StreamingLLM and CentroidKV at the small-model preset, then bench/scored_report.py.
# About 40 minutes on 2 cores (KVzip's replay runs for every scored method).
# Stage `worker` (not in `all`, about 10 minutes): the C++ llama2.c worker's window-scored
# jobs (centroidkv+snapkv: SnapKV's scores, one budget over layers x heads) beside SnapKV
# and CentroidKV, KL on both models and retrieval on models/longctx, into
# docs/results/quality-scored-worker-{stories260k,longctx,retrieval}.md/.json.
# Usage: scripts/quality_scored.sh [stories260k|longctx|report|all|worker] (default all)
set -euo pipefail
cd "$(dirname "$0")/.."

stage=${1:-all}
bash scripts/build.sh centroidkv_server
bash scripts/setup_python.sh >/dev/null
bin=${CKV_BUILD_DIR:-build}/bin
with_server=(env CKV_SERVER_SOCKET=/tmp/centroidkv-quality-scored.sock bash scripts/with_server.sh "$bin")
methods=kvzip,centroidkv+kvzip@0,centroidkv+kvzip@0.1,centroidkv+kvzip,centroidkv+kvzip@0.3
methods+=,centroidkv+kvzip+fit,centroidkv+kvzip@0/equal,centroidkv+snapkv@0
methods+=,snapkv,streamingllm,centroidkv

run_model() {  # NAME MODEL PREFILL CONTINUATION [more kvpress_quality.py args]
  local name=$1 model=$2 prefill=$3 continuation=$4
  shift 4
  "${with_server[@]}" .venv/bin/python bench/kvpress_quality.py --server "{server}" \
    --model "$model" --tokenizer ../shared/models/tok512.bin --texts 16 --prefill "$prefill" \
    --continuation "$continuation" --budgets 0.5,0.25,0.1 --methods "$methods" \
    --json-out "docs/results/quality-scored-$name.json" "$@"
}

if [ "$stage" = stories260k ] || [ "$stage" = all ]; then
  run_model stories260k ../shared/models/stories260K.bin 384 96
fi
if [ "$stage" = longctx ] || [ "$stage" = all ]; then
  run_model longctx models/longctx/model.bin 768 128 --cases models/longctx/retrieval_cases.txt
fi
if [ "$stage" = worker ]; then
  bash scripts/build.sh centroidkv_quality centroidkv_retrieval
  stamp=(/usr/bin/python3 scripts/stamp_regenerate.py)
  worker_methods=snapkv,centroidkv+snapkv@0,centroidkv+snapkv,centroidkv
  out=docs/results/quality-scored-worker
  "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --preset small-model \
    --methods "$worker_methods" --budgets 0.5,0.25,0.1 \
    --report-md "$out-stories260k.md" --report-json "$out-stories260k.json"
  "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --preset small-model \
    --model models/longctx/model.bin --tokenizer ../shared/models/tok512.bin --texts 16 \
    --seed 1000 --prefill 768 --continuation 128 --methods "$worker_methods" \
    --budgets 0.5,0.25,0.1 --report-md "$out-longctx.md" --report-json "$out-longctx.json"
  "${with_server[@]}" "$bin/centroidkv-retrieval" --server "{server}" --preset small-model \
    --model models/longctx/model.bin --cases models/longctx/retrieval_cases.txt \
    --methods "$worker_methods" --budgets 0.5,0.25,0.1 \
    --report-md "$out-retrieval.md" >"$out-retrieval.json"
  for part in stories260k longctx retrieval; do
    "${stamp[@]}" "scripts/quality_scored.sh worker" "$out-$part.md"
  done
  exit 0
fi
/usr/bin/python3 bench/scored_report.py docs/results/quality-scored-stories260k.json \
  docs/results/quality-scored-longctx.json --md docs/results/quality-scored.md \
  --json docs/results/quality-scored.json
