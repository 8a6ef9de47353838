#!/usr/bin/env bash
# The service-level benchmark for the CPU-versus-GPU report: builds
# centroidkv-server and centroidkv-bench, starts a server on loopback, runs the Llama-3-8B
# preset through it with one backend across context lengths and concurrent streams (batch
# sizes), and writes one JSON list of rows (centroidkv-bench --format json, plus the card or
# CPU that ran it and the load). bench/cpu_vs_gpu.py turns the CPU and GPU files into
# docs/results/cpu-vs-gpu.md.
#
# Usage: bench/run-service.sh [--backend cpu|gpu] [--out FILE] [--contexts 4096,8192,32768]
#                             [--concurrency 1,2,4,8] [--jobs-per-stream N]
#   CPU (here):   bench/run-service.sh --backend cpu --out docs/results/cpu-service.json
#   GPU machine:  bench/run-service.sh --backend gpu --out docs/results/gpu/service.json
# Environment: CKV_BIN_DIR (prebuilt binaries: no build), CKV_BUILD_DIR (default build), CKV_JOBS (compile jobs), CKV_PORT (default
# 50093), CKV_SERVER_FLAGS (extra flags for centroidkv-server).
set -euo pipefail
cd "$(dirname "$0")/.."

backend=cpu
out=""
contexts=4096,8192,32768
concurrency=1,2,4,8
jobs_per_stream=4
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --jobs-per-stream) jobs_per_stream=$2; shift 2 ;;
    *) echo "run-service.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$backend" in cpu|gpu) ;; *) echo "run-service.sh: --backend cpu|gpu" >&2; exit 2 ;; esac
if [ -z "$out" ] && [ "$backend" = gpu ]; then
  out=docs/results/gpu/service.json
elif [ -z "$out" ]; then
  out=docs/results/cpu-service.json
fi

if [ -n "${CKV_BIN_DIR:-}" ]; then  # prebuilt binaries (scripts/gpu-check.sh's bundle)
  bin_dir=$CKV_BIN_DIR
else
  build_dir=${CKV_BUILD_DIR:-build}
  CKV_BUILD_DIR="$build_dir" scripts/build.sh centroidkv_server centroidkv_bench >&2
  bin_dir="$build_dir/bin"
fi
server_bin="$bin_dir/centroidkv-server"
bench_bin="$bin_dir/centroidkv-bench"

if [ "$backend" = gpu ]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  [ -n "$card" ] || { echo "run-service.sh: no GPU (nvidia-smi found none)" >&2; exit 1; }
else
  card=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
  card="$card, $(nproc) logical CPUs"
fi

port=${CKV_PORT:-50093}
log=$(mktemp /tmp/centroidkv-run-service.XXXXXX.log)
# shellcheck disable=SC2086
"$server_bin" --listen "127.0.0.1:$port" ${CKV_SERVER_FLAGS:-} >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT

rows=$(mktemp /tmp/centroidkv-run-service.XXXXXX.jsonl)
IFS=, read -r -a context_list <<<"$contexts"
IFS=, read -r -a stream_list <<<"$concurrency"
for context in "${context_list[@]}"; do
  for streams in "${stream_list[@]}"; do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    jobs=$((streams * jobs_per_stream))
    echo "run-service.sh: $backend context $context, $streams streams, $jobs jobs (load $load)" >&2
    "$bench_bin" --server "127.0.0.1:$port" --preset llama3-8b --context "$context" \
      --concurrency "$streams" --jobs "$jobs" --distinct-layers 2 --backend "$backend" \
      --format json --quiet |
      /usr/bin/python3 -c '
import json, sys
row = json.loads(sys.stdin.readline())
row.update(card=sys.argv[1], kind="service", backend=sys.argv[2], load=sys.argv[3],
           command=sys.argv[4])
print(json.dumps(row))' "$card" "$backend" "$load" \
        "centroidkv-bench --preset llama3-8b --context $context --concurrency $streams --jobs $jobs --distinct-layers 2 --backend $backend --format json" \
        >>"$rows"
  done
done
mkdir -p "$(dirname "$out")"
/usr/bin/python3 -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print("wrote %s (%d rows)" % (sys.argv[2], len(rows)), file=sys.stderr)' "$rows" "$out"
rm -f "$rows" "$log"
