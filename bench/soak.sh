#!/usr/bin/env bash
# The soak: builds centroidkv-server and centroidkv-soak, starts a server
# on a free loopback port with a bounded budget and short job timeouts, runs 64 streams of
# mixed job sizes against it for the given time (clients among them cancel jobs, disconnect
# mid-job, send garbage and let 1 ms deadlines pass; every completed result is compared with
# the in-process cpu engine's), samples the server's RSS, then SIGTERMs the server. Prints
# centroidkv-soak's JSON line with the server's exit code and the load added.
#
# Usage: bench/soak.sh [--seconds 300] [--streams 64] [--connections 8] [--seed 1]
# Environment: CKV_BIN_DIR (prebuilt binaries: no build), CKV_BUILD_DIR (default build),
# CKV_SERVER_FLAGS (flags for centroidkv-server; default: the budget flags below).
# Exit code 0 only if nothing unexpected happened: no unexpected status, every checked
# result identical, and the server exited 0 on SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=300
streams=64
connections=8
seed=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -n "${CKV_BIN_DIR:-}" ]; then
  bin_dir=$CKV_BIN_DIR
else
  build_dir=${CKV_BUILD_DIR:-build}
  CKV_BUILD_DIR="$build_dir" scripts/build.sh centroidkv_server centroidkv_soak >&2
  bin_dir="$build_dir/bin"
fi

server_flags=${CKV_SERVER_FLAGS:---max-total-bytes 256MiB --max-stream-bytes 64MiB --max-pooled-result-bytes 128MiB --incomplete-job-timeout 5 --idle-stream-timeout 30 --grace-period 2}
log=$(mktemp /tmp/centroidkv-soak.XXXXXX.log)
# shellcheck disable=SC2086
"$bin_dir/centroidkv-server" --listen 127.0.0.1:0 --metrics-listen off $server_flags >"$log" 2>&1 &
server_pid=$!
trap 'kill -9 "$server_pid" 2>/dev/null || true; rm -f "$log"' EXIT
target=""
for _ in $(seq 200); do
  target=$(sed -n 's/.*this host dials \([^)]*\)).*/\1/p' "$log" | head -1)
  [ -n "$target" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$target" ] || { echo "soak.sh: the server did not start" >&2; cat "$log" >&2; exit 1; }

load_before=$(cut -d' ' -f1 /proc/loadavg)
soak_rc=0
line=$("$bin_dir/centroidkv-soak" --target "$target" --server-pid "$server_pid" \
  --seconds "$seconds" --streams "$streams" --connections "$connections" --seed "$seed") \
  || soak_rc=$?
load_after=$(cut -d' ' -f1 /proc/loadavg)
kill -TERM "$server_pid"
server_rc=0
wait "$server_pid" || server_rc=$?
trap 'rm -f "$log"' EXIT
[ -n "$line" ] || { echo "soak.sh: centroidkv-soak printed nothing" >&2; tail -20 "$log" >&2; exit 1; }
echo "${line%\}},\"server_flags\":\"$server_flags\",\"server_exit_code\":$server_rc,\"load_before\":$load_before,\"load_after\":$load_after}"
[ "$soak_rc" = 0 ] && [ "$server_rc" = 0 ]
