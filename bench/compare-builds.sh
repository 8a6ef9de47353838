#!/usr/bin/env bash
# A/B of two builds of the service, alternated in one run: for each round, each build's
# centroidkv-server is started on loopback and that build's `centroidkv-bench --compare`
# (service over slabs, transport floor, in-process engine) runs against it; the medians of
# tokens/s per build and leg (and of --compare's ratio to the serial bound), and the ratio of
# B to A, come last as one JSON line.
# Used to show that a refactor costs no throughput.
#
# Usage: bench/compare-builds.sh BIN_DIR_A BIN_DIR_B [--rounds N] [--context N] [--jobs N]
#   e.g. bench/compare-builds.sh ../main/build/bin build/bin --rounds 5
# Environment: CKV_PORT (default 50197), CKV_SERVER_FLAGS (extra server flags, both builds).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BIN_DIR_A BIN_DIR_B [--rounds N] [--context N] [--jobs N]" >&2; exit 2; }
bin_a=$(cd "$1" && pwd); bin_b=$(cd "$2" && pwd); shift 2
rounds=5; context=4096; jobs=32
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "compare-builds.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
port=${CKV_PORT:-50197}
out=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$out"' EXIT

run_one() {  # $1 = A|B, $2 = bin dir, $3 = round
  "$2/centroidkv-server" --listen "127.0.0.1:$port" ${CKV_SERVER_FLAGS:-} > "$out/server.log" 2>&1 &
  server=$!
  "$2/centroidkv-bench" --server "127.0.0.1:$port" --compare --preset llama3-8b \
      --context "$context" --jobs "$jobs" --rounds 1 --quiet --format json \
      | sed "s/^{/{\"build\":\"$1\",\"round\":$3,/" >> "$out/rows.jsonl"
  kill -TERM "$server"; wait "$server" || true; server=""
}

echo "compare-builds: A=$bin_a B=$bin_b, $rounds rounds, context $context, $jobs jobs, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi  # alternate who goes first
  for build in $order; do
    if [ "$build" = A ]; then run_one A "$bin_a" "$round"; else run_one B "$bin_b" "$round"; fi
    echo "  round $round build $build done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
done
/usr/bin/python3 - "$out/rows.jsonl" "$rounds" "$context" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
medians = {}
for row in rows:
    if "run" in row:  # one leg: service:cpu, service:identity (the floor), in-process:cpu
        medians.setdefault(row["build"], {}).setdefault(row["run"], []).append(row["tokens_per_s"])
    else:  # the --compare summary of the round
        medians.setdefault(row["build"], {}).setdefault("ratio_to_serial_bound", []).append(
            row["ratio_to_serial_bound"])
summary = {"rounds": int(sys.argv[2]), "context": int(sys.argv[3]), "tokens_per_s": {}, "b_over_a": {}}
for build, runs in medians.items():
    summary["tokens_per_s"][build] = {run: round(statistics.median(v), 4) for run, v in runs.items()}
for run, value in summary["tokens_per_s"].get("A", {}).items():
    b = summary["tokens_per_s"].get("B", {}).get(run)
    if b:
        summary["b_over_a"][run] = round(b / value, 3)
for run in sorted(summary["b_over_a"]):
    a, b = summary["tokens_per_s"]["A"][run], summary["tokens_per_s"]["B"][run]
    print(f"  {run:24s} A {a:>12.4g}  B {b:>12.4g}  B/A {summary['b_over_a'][run]:.3f}",
          file=sys.stderr)
print(json.dumps(summary))
PY
