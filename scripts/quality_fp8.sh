#!/usr/bin/env bash
# fp8 centroids against fp16 ones: centroidkv-quality through a server on
# stories260K and models/longctx, CentroidKV (defaults, and with heads kept whole: those of
# docs/results/quality.md, and models/longctx's lookup head 2:0) at budgets 100% (no merging: the
# uncompressed cache in that dtype), 50% and 25%, its centroids returned as float16, as
# fp8_e4m3 with per-head dynamic scales, as fp8_e4m3 with vLLM's default static scale 1.0,
# and as fp8_e5m2 (dynamic); then bench/fp8_quality_report.py writes docs/results/quality-fp8.md
# from the runs' JSON (kept in docs/results/quality-fp8/). About 6 minutes on 2 cores.
# Extra arguments go to every centroidkv-quality run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh centroidkv_server centroidkv_quality
bin=${CKV_BUILD_DIR:-build}/bin
out=docs/results/quality-fp8
mkdir -p "$out"
with_server=(env CKV_SERVER_SOCKET=/tmp/centroidkv-quality-fp8.sock bash scripts/with_server.sh "$bin")
dtypes=("float16" "fp8_e4m3" "fp8_e4m3 --output-scales 1.0" "fp8_e5m2")
names=(fp16 e4m3-dynamic e4m3-static1 e5m2-dynamic)

run() {  # MODEL-NAME then centroidkv-quality arguments
  local model=$1
  shift
  for i in "${!dtypes[@]}"; do
    # shellcheck disable=SC2086  # the dtype entry holds its own flags
    "${with_server[@]}" "$bin/centroidkv-quality" --server "{server}" --quiet \
      --methods centroidkv,centroidkv+outliers --budgets 1.0,0.5,0.25 \
      --calibration-texts 0 --output-dtype ${dtypes[$i]} \
      --report-md "" --report-json "$out/$model-${names[$i]}.json" "$@" >/dev/null
    echo "quality_fp8: $model ${names[$i]} done" >&2
  done
}

run stories260k --model ../shared/models/stories260K.bin --tokenizer ../shared/models/tok512.bin \
  --passthrough-heads "2:3;4:0,2" "$@"
run longctx --model models/longctx/model.bin --tokenizer ../shared/models/tok512.bin \
  --texts 8 --seed 1000 --prefill 768 --continuation 128 --passthrough-heads "2:0" "$@"
.venv/bin/python bench/fp8_quality_report.py "$out" docs/results/quality-fp8.md
