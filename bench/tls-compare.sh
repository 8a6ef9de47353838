#!/usr/bin/env bash
# The cost of TLS on the service, measured side by side: makes a throwaway CA,
# server and client certificate with openssl, starts three servers on loopback (plaintext,
# TLS, mTLS + bearer token), and runs the same centroidkv-bench workload against each in
# turn, --rounds times (legs alternate so that load on a shared box hits them alike).
# Prints each leg's JSON line, then one JSON line with each leg's median tokens/s and the
# ratios to plaintext. A command, not a test.
#
# Usage: bench/tls-compare.sh [--rounds N] [--backend identity|cpu] [--jobs N] [--context N]
#                             [--concurrency N]
# Environment: CKV_BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5 backend=identity jobs=32 context=4096 concurrency=2
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    *) echo "tls-compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin=${CKV_BUILD_DIR:-build}/bin
[ -x "$bin/centroidkv-server" ] && [ -x "$bin/centroidkv-bench" ] ||
  { echo "tls-compare.sh: build centroidkv_server centroidkv_bench first" >&2; exit 2; }

dir=$(mktemp -d /tmp/ckv-tls-bench-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
(
  cd "$dir"
  ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  openssl req -x509 $ec -keyout ca.key -out ca.pem -days 1 -subj /CN=bench-ca
  for leaf in server client; do
    openssl req $ec -keyout $leaf.key -out $leaf.csr -subj /CN=bench-$leaf
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > $leaf.ext
    openssl x509 -req -in $leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
      -extfile $leaf.ext -out $leaf.pem
  done
  echo "bench-token bench-caller" > tokens
) >/dev/null 2>&1

start_server() {  # name, extra flags...
  local name=$1; shift
  "$bin/centroidkv-server" --listen 127.0.0.1:0 "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    grep -q "dials 127.0.0.1:" "$dir/$name.log" && break
    sleep 0.05
  done
  grep -o "dials 127.0.0.1:[0-9]*" "$dir/$name.log" | cut -d: -f2
}
plain_port=$(start_server plain)
tls_port=$(start_server tls --tls-cert "$dir/server.pem" --tls-key "$dir/server.key")
mtls_port=$(start_server mtls --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" \
  --tls-client-ca "$dir/ca.pem" --auth-tokens-file "$dir/tokens")

common=(--backend "$backend" --jobs "$jobs" --context "$context" -c "$concurrency" --format json)
results="$dir/results.jsonl"
for round in $(seq "$rounds"); do
  for leg in plaintext tls mtls_token; do
    case $leg in
      plaintext) args=(--server "127.0.0.1:$plain_port") ;;
      tls) args=(--server "127.0.0.1:$tls_port" --tls-ca "$dir/ca.pem") ;;
      mtls_token) args=(--server "127.0.0.1:$mtls_port" --tls-ca "$dir/ca.pem"
                        --tls-cert "$dir/client.pem" --tls-key "$dir/client.key") ;;
    esac
    line=$(CENTROIDKV_TOKEN=bench-token "$bin/centroidkv-bench" "${args[@]}" "${common[@]}" | tail -1)
    echo "{\"leg\":\"$leg\",\"round\":$round,\"result\":$line}" | tee -a "$results"
  done
done
/usr/bin/python3 - "$results" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for leg in ("plaintext", "tls", "mtls_token"):
    med[leg] = statistics.median(r["result"]["tokens_per_s"] for r in rows if r["leg"] == leg)
p50 = {leg: statistics.median(r["result"]["latency_ms"]["p50"] for r in rows if r["leg"] == leg)
       for leg in med}
print(json.dumps({"run": "tls-compare", "backend": rows[0]["result"]["run"],
                  "rounds": max(r["round"] for r in rows), "load_1min_end": float(sys.argv[2]),
                  "median_tokens_per_s": med, "median_p50_latency_ms": p50,
                  "ratio_to_plaintext": {k: round(v / med["plaintext"], 3) for k, v in med.items()}}))
PY
