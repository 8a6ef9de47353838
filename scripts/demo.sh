#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine: install what is missing, build, start a
# server, and compress real and synthetic KV caches through it with the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh centroidkv_server centroidkv_cli centroidkv_quality
bin=${CKV_BUILD_DIR:-build}/bin

work=$(mktemp -d /tmp/centroidkv-demo.XXXXXX)
socket="unix://$work/ckv.sock"
"$bin/centroidkv-server" --listen "$socket" --metrics-listen 127.0.0.1:0 >"$work/server.log" 2>&1 &
server_pid=$!
cleanup() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 1 100); do
  if "$bin/centroidkv" info --server "$socket" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
echo "== server"
"$bin/centroidkv" info --server "$socket"

golden=../shared/golden/stories260K_layer2
if [ -f "$golden/keys.npy" ]; then
  echo
  echo "== real KV: stories260K layer 2 after 320 tokens (SPEC section 4 settings, 25% budget)"
  "$bin/centroidkv" compress --server "$socket" --in "$golden" --target-ratio 0.25 \
    --chunk-size 64 --sink-tokens 4 --recent-tokens 32 --out "$work/stories"
  if cmp -s "$work/stories/out_counts.npy" "$golden/out_counts.npy" &&
     cmp -s "$work/stories/assignment.npy" "$golden/assignment.npy"; then
    echo "  counts and assignment equal ../shared/golden/stories260K_layer2 exactly"
  else
    echo "  MISMATCH against ../shared/golden/stories260K_layer2" >&2
    exit 1
  fi
else
  echo "(../shared/golden not found: skipping the real-KV example)"
fi

model=../shared/models/stories260K.bin
if [ -f "$model" ]; then
  echo
  echo "== a real inference worker: stories260K prefills 384 tokens, compresses every layer's KV"
  echo "   through the server, then teacher-forces 96 more tokens (SPEC section 4, 4 texts;"
  echo "   outlier heads 2:3;4:0,2 as calibrated on separate texts, see docs/results/quality.md)"
  "$bin/centroidkv-quality" --server "$socket" --model "$model" \
    --tokenizer ../shared/models/tok512.bin --texts 4 --calibration-texts 0 \
    --passthrough-heads "2:3;4:0,2" \
    --report-md "" --report-json "" 2>&1 | grep -E "budget|^\[" | grep -v '^\[{' || true
else
  echo "(../shared/models not found: skipping the real-model worker)"
fi

echo
echo "== the Python client (client/python/examples/compress.py, as in README.md; .venv)"
CKV_TARGET="$socket" .venv/bin/python client/python/examples/compress.py
if [ -f "$model" ]; then
  echo "== transformers generate() with a CentroidKV cache (client/python/examples/generate.py)"
  CKV_TARGET="$socket" .venv/bin/python client/python/examples/generate.py "$model"
  echo "== kvpress's pipeline with the CentroidKV press and kvpress's StreamingLLM (client/python/examples/kvpress_pipeline.py)"
  CKV_TARGET="$socket" .venv/bin/python client/python/examples/kvpress_pipeline.py "$model" \
    ../shared/models/tok512.bin
fi

echo
echo "== synthetic KV (labelled synthetic): 8 heads x 4096 tokens x 128, fp16, paper defaults"
"$bin/centroidkv" generate --out "$work/synthetic" --heads 8 --tokens 4096 --key-dim 128 \
  --value-dim 128 --dtype float16 --seed 7 >/dev/null
"$bin/centroidkv" compress --server "$socket" --in "$work/synthetic" --target-ratio 0.25 \
  --output-dtype float16 --out "$work/synthetic-out"

echo
metrics_port=$(sed -n 's/.*metrics: .*(port \([0-9]*\)).*/\1/p' "$work/server.log" | head -1)
if [ -n "$metrics_port" ]; then
  echo "== the server's Prometheus /metrics (http://127.0.0.1:$metrics_port/metrics), a few lines"
  /usr/bin/python3 -c 'import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
keep = ("centroidkv_jobs_total", "centroidkv_tokens_total", "centroidkv_entries_total",
        "centroidkv_received_bytes_total", "centroidkv_sent_bytes_total",
        "centroidkv_streams_total", "centroidkv_clustering_seconds_count", "centroidkv_queue_depth")
print("\n".join(line for line in text.splitlines() if line.startswith(keep)))' \
    "http://127.0.0.1:$metrics_port/metrics"
  echo
fi
echo "== stopping the server (SIGTERM: drain, then exit)"
kill -TERM "$server_pid"
wait "$server_pid"
tail -n 3 "$work/server.log"
echo "demo done"
