#!/usr/bin/env bash
# The long-context report on models/longctx: builds the server, centroidkv-retrieval and
# centroidkv-quality, starts a server, and writes into docs/results/
#   quality-long-retrieval.md/.json  retrieval exact match (models/longctx/retrieval_cases.txt)
#       (with streamingllm/h2o/snapkv+outliers: the same outlier heads kept whole, the control)
#       per method, budget, kind, depth and length; outlier heads for centroidkv+outliers
#       calibrated on models/longctx/calibration_cases.txt (training stories, seed 200);
#   quality-long-kl.md/.json         KL / top-1 on fluent text sampled from the model
#       (seeds 1000+, outlier heads calibrated on seeds 5000+);
#   quality-long.png                 the plot (python3-matplotlib, installed if missing).
#   quality-long-merge-tuning.json   "evict, then merge" (h2o/snapkv+merge): KL of snapkv
#       and snapkv+merge per similarity floor, on tuning texts (seeds 3000+, not evaluated);
#   quality-long-merge-retrieval.md/.json, quality-long-merge-kl.md/.json
#       the same evaluation as above, merge methods beside the evictions they extend, at the
#       floor picked on the tuning texts (CKV_MERGE_FLOOR, default 0.8).
# docs/results/quality-long.md discusses them. Usage:
#   scripts/quality_long.sh [retrieval|kl|merge-tuning|merge|plot|all]
# (default all, about 50 minutes on 2 cores); extra arguments after the stage go to that
# stage's tool.
set -euo pipefail
cd "$(dirname "$0")/.."

stage=${1:-all}
[ $# -gt 0 ] && shift
bash scripts/build.sh centroidkv_server centroidkv_retrieval centroidkv_quality
bin=${CKV_BUILD_DIR:-build}/bin
model=models/longctx/model.bin
with_server=(env CKV_SERVER_SOCKET=/tmp/centroidkv-quality-long.sock bash scripts/with_server.sh "$bin")
stamp=(/usr/bin/python3 scripts/stamp_regenerate.py)  # the Regenerate: line under each title

if [ "$stage" = retrieval ] || [ "$stage" = all ]; then
  "${with_server[@]}" "$bin/centroidkv-retrieval" --server "{server}" --model "$model" \
    --cases models/longctx/retrieval_cases.txt \
    --calibration-cases models/longctx/calibration_cases.txt \
    --calibration-budget 0.25 \
    --methods centroidkv,centroidkv+outliers,streamingllm,h2o,snapkv,kmeans,streamingllm+outliers,h2o+outliers,snapkv+outliers \
    --budgets 0.5,0.25,0.1 \
    --report-md docs/results/quality-long-retrieval.md "$@" \
    >docs/results/quality-long-retrieval.json
  "${stamp[@]}" "scripts/quality_long.sh retrieval" docs/results/quality-long-retrieval.md
fi
if [ "$stage" = kl ] || [ "$stage" = all ]; then
  "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --model "$model" \
    --tokenizer ../shared/models/tok512.bin --texts 16 --seed 1000 --prefill 768 \
    --continuation 128 --budgets 0.5,0.25,0.1 --calibration-texts 8 --calibration-seed 5000 \
    --calibration-budget 0.25 \
    --methods centroidkv,centroidkv+outliers,streamingllm,h2o,snapkv,kmeans,streamingllm+outliers,h2o+outliers,snapkv+outliers \
    --report-md docs/results/quality-long-kl.md --report-json docs/results/quality-long-kl.json "$@"
  "${stamp[@]}" "scripts/quality_long.sh kl" docs/results/quality-long-kl.md
fi
merge_methods=snapkv,snapkv+merge,h2o,h2o+merge,snapkv+outliers,snapkv+merge+outliers,h2o+outliers,h2o+merge+outliers
if [ "$stage" = merge-tuning ] || [ "$stage" = all ]; then
  # One JSON object per floor: {"min_similarity": F, "results": [...]} (-1: no floor).
  tuning_json=$(mktemp)
  tuning_md=$(mktemp)
  trap 'rm -f "$tuning_json" "$tuning_md"' EXIT
  for floor in -1 0.5 0.8 0.9; do
    "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --model "$model" \
      --tokenizer ../shared/models/tok512.bin --texts 8 --seed 3000 --prefill 768 \
      --continuation 128 --budgets 0.5,0.25 --calibration-texts 8 --calibration-seed 5000 \
      --calibration-budget 0.25 --merge-min-similarity "$floor" \
      --methods snapkv,snapkv+merge,snapkv+outliers,snapkv+merge+outliers \
      --report-md "$tuning_md" --report-json "$tuning_json" "$@" >/dev/null
    echo "{\"min_similarity\": $floor, \"results\": $(cat "$tuning_json")}"
  done >docs/results/quality-long-merge-tuning.json
fi
if [ "$stage" = merge ] || [ "$stage" = all ]; then
  floor=${CKV_MERGE_FLOOR:-0.8}
  "${with_server[@]}" "$bin/centroidkv-retrieval" --server "{server}" --model "$model" \
    --cases models/longctx/retrieval_cases.txt \
    --calibration-cases models/longctx/calibration_cases.txt \
    --calibration-budget 0.25 --merge-min-similarity "$floor" --methods "$merge_methods" \
    --budgets 0.5,0.25,0.1 \
    --report-md docs/results/quality-long-merge-retrieval.md "$@" \
    >docs/results/quality-long-merge-retrieval.json
  "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --model "$model" \
    --tokenizer ../shared/models/tok512.bin --texts 16 --seed 1000 --prefill 768 \
    --continuation 128 --budgets 0.5,0.25,0.1 --calibration-texts 8 --calibration-seed 5000 \
    --calibration-budget 0.25 --merge-min-similarity "$floor" --methods "$merge_methods" \
    --report-md docs/results/quality-long-merge-kl.md \
    --report-json docs/results/quality-long-merge-kl.json "$@"
  "${stamp[@]}" "scripts/quality_long.sh merge" docs/results/quality-long-merge-retrieval.md \
    docs/results/quality-long-merge-kl.md
fi
[ "$stage" = merge-tuning ] || [ "$stage" = merge ] && exit 0
bash scripts/ensure_matplotlib.sh quality_long
/usr/bin/python3 scripts/plot_quality_long.py docs/results/quality-long-retrieval.json \
  docs/results/quality-long-kl.json docs/results/quality-long.png >&2
