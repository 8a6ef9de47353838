#!/usr/bin/env bash
# Runs a command against a CentroidKV server started for it on a fresh unix socket, then
# stops the server. Every "{server}" in the command's arguments becomes the server's
# address. Used by scripts/quality.sh and scripts/quality_long.sh.
# Usage: [CKV_SERVER_SOCKET=PATH] scripts/with_server.sh BIN_DIR COMMAND [ARG ...]
# (a fixed socket path keeps the command line that reports record the same from run to run)
set -euo pipefail
bin=$1
shift

socket_path=${CKV_SERVER_SOCKET:-/tmp/centroidkv-with-server.$$.sock}
rm -f "$socket_path"
log=$(mktemp /tmp/centroidkv-with-server.XXXXXX)
"$bin/centroidkv-server" --listen "unix://$socket_path" >"$log" 2>&1 &
server_pid=$!
cleanup() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  rm -f "$log" "$socket_path"
}
trap cleanup EXIT
for _ in $(seq 1 100); do [ -S "$socket_path" ] && break; sleep 0.1; done

args=()
for arg in "$@"; do args+=("${arg//\{server\}/unix://$socket_path}"); done
"${args[@]}"
