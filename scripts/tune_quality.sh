#!/usr/bin/env bash
# Tunes CentroidKV's defaults for the quality report on CALIBRATION texts only (seeds from
# 5000 by default; the report's evaluation texts use seeds 1000+), through a running server:
# the baselines, a grid over chunk size, recent window and similarity floor, then outlier
# heads (calibrated on seeds 5000.., sharing the budget) for the best grid points. Prints a
# markdown table, also written to docs/results/quality_tuning.md. CKV_TUNE_SECTIONS picks
# sections.
# Usage: scripts/tune_quality.sh SERVER_ADDRESS [extra centroidkv-quality flags]
set -euo pipefail
cd "$(dirname "$0")/.."
server=${1:?usage: scripts/tune_quality.sh SERVER_ADDRESS [flags]}
shift
bin=${CKV_BUILD_DIR:-build}/bin
texts=${CKV_TUNE_TEXTS:-24}
seed=${CKV_TUNE_SEED:-5000}
chunks=${CKV_TUNE_CHUNKS:-"16 32 64 128 384"}
recents=${CKV_TUNE_RECENTS:-"32 48 64"}
floors=${CKV_TUNE_FLOORS:-"off 0.5"}
outlier_configs=${CKV_TUNE_OUTLIER_CONFIGS:-"32:32 64:32 32:48 64:48"}  # chunk:recent
sections=${CKV_TUNE_SECTIONS:-"baselines grid outliers"}
out=${CKV_TUNE_OUT:-docs/results/quality_tuning.md}

rows() {  # JSON line on stdin -> "| budget | mean KL | top-1 | kept |" per budget
  /usr/bin/python3 -c '
import json, sys
for r in json.loads(sys.stdin.read()):
    print("| %s | %s | %g%% | %.5f | %.4f | %.1f%% |" % (sys.argv[1], r["method"], 100 * r["budget"],
          r["mean_kl"], r["top1"], 100 * r["kv_fraction"]))' "$1"
}
run() { "$bin/centroidkv-quality" --server "$server" --texts "$texts" --seed "$seed" \
          --report-md "" --report-json "" --quiet "$@"; }

{
  echo "# Tuning CentroidKV's defaults on calibration texts"
  echo
  echo "Regenerate: \`scripts/tune_quality.sh SERVER_ADDRESS\` (against a running server)"
  echo
  echo "Made by \`scripts/tune_quality.sh\`: $texts texts sampled with seeds $seed..$((seed + texts - 1))"
  echo "(the report's evaluation texts use other seeds), sinks 4, prefill 384, continuation 96."
  echo "Extra flags: \`$*\`."
  echo
  echo "| configuration | method | budget | mean KL | top-1 | KV kept |"
  echo "| --- | --- | ---: | ---: | ---: | ---: |"
  if [[ " $sections " == *" baselines "* ]]; then
    for recent in $recents; do
      run --methods streamingllm,h2o,kmeans --recent-tokens "$recent" "$@" |
        rows "baselines, recent $recent"
    done
  fi
  if [[ " $sections " == *" grid "* ]]; then
    for floor in $floors; do
      for chunk in $chunks; do
        for recent in $recents; do
          floor_flag=()
          if [ "$floor" != off ]; then floor_flag=(--min-similarity "$floor"); fi
          run --methods centroidkv --chunk-size "$chunk" --recent-tokens "$recent" \
            "${floor_flag[@]}" "$@" | rows "chunk $chunk, recent $recent, floor $floor"
        done
      done
    done
  fi
  if [[ " $sections " == *" outliers "* ]]; then
    for config in $outlier_configs; do
      chunk=${config%%:*}
      recent=${config##*:}
      run --methods centroidkv+outliers --chunk-size "$chunk" --recent-tokens "$recent" \
        --calibration-texts 16 --calibration-seed 5000 --outlier-heads 3 "$@" |
        rows "chunk $chunk, recent $recent, outlier heads (up to 3, shared budget)"
    done
  fi
} | tee "$out"
