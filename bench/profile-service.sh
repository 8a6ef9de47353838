#!/usr/bin/env bash
# Where the server's CPU time goes: samples centroidkv-server with `perf record`
# (cpu-clock, all its threads) while centroidkv-bench runs the Llama-3-8B preset through it,
# once with the cpu backend and once with the transport floor (identity), and prints a
# markdown table of the samples by stage (bench/profile_stages.py). Needs perf (Debian
# linux-perf, installed when missing) and permission to attach (root, or
# kernel.perf_event_paranoid <= 1).
#
# Usage: bench/profile-service.sh [--context N] [--jobs N] [--port P]
set -euo pipefail
cd "$(dirname "$0")/.."

context=4096
jobs=32
port=50094
while [ $# -gt 0 ]; do
  case "$1" in
    --context) context=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "profile-service.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# perf is not part of scripts/setup.sh (CI never profiles); install it on demand like
# bench/run-cpu.sh does its packages (CKV_BENCH_NO_INSTALL=1: never call apt-get).
if ! command -v perf >/dev/null && [ "${CKV_BENCH_NO_INSTALL:-0}" != 1 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    --no-install-recommends linux-perf >&2
fi
command -v perf >/dev/null || { echo "profile-service.sh: perf not found (apt-get install linux-perf)" >&2; exit 1; }
build_dir=${CKV_BUILD_DIR:-build}
CKV_BUILD_DIR="$build_dir" scripts/build.sh centroidkv_server centroidkv_bench >&2

work=$(mktemp -d /tmp/centroidkv-profile.XXXXXX)
"$build_dir/bin/centroidkv-server" --listen "127.0.0.1:$port" >"$work/server.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true; [ -n "${CKV_PROFILE_KEEP:-}" ] || rm -rf "$work"' EXIT
# Warm up first: `perf record -p` follows only the threads that exist when it attaches, and
# the server starts its gRPC and oneTBB threads on first use.
for backend in cpu identity; do
  "$build_dir/bin/centroidkv-bench" --server "127.0.0.1:$port" --backend "$backend" \
    --preset llama3-8b --context 1024 --jobs 16 --quiet --format json >/dev/null
done
echo "profile-service.sh: load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for backend in cpu identity; do
  perf record -q -F 999 -e cpu-clock -p "$server_pid" -o "$work/$backend.data" &
  perf_pid=$!
  sleep 0.5
  "$build_dir/bin/centroidkv-bench" --server "127.0.0.1:$port" --backend "$backend" \
    --preset llama3-8b --context "$context" --jobs "$jobs" --distinct-layers 2 --quiet \
    --format json >"$work/$backend.json"
  kill -INT "$perf_pid"
  wait "$perf_pid" 2>/dev/null || true
  perf report -i "$work/$backend.data" --no-children --sort sym --stdio -g none \
    2>/dev/null >"$work/$backend.txt"
done
echo "profile-service.sh: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
/usr/bin/python3 bench/profile_stages.py --context "$context" \
  cpu "$work/cpu.txt" "$work/cpu.json" identity "$work/identity.txt" "$work/identity.json"
