#!/usr/bin/python3
"""Groups `perf report --sort sym` output of centroidkv-server by stage of the data path and
prints a markdown table (used by bench/profile-service.sh).

Usage: profile_stages.py --context N LABEL REPORT.txt BENCH.json [LABEL REPORT.txt BENCH.json ...]
"""
import argparse
import json
import re

# (stage, test on the symbol); the first match wins. "[k]" marks kernel symbols.
STAGES = [
    ("clustering (cpu engine kernels)", lambda s: "centroidkv::cpu::" in s),
    ("input check (NaN/Inf scan, PlanLayer)", lambda s: "NoneHasMaxExponent" in s or "PlanLayer" in s),
    ("identity engine (copy t rows, widen)", lambda s: "IdentityEngine" in s or "WidenRow" in s
     or "HalvesToFloats" in s or "HalfToFloat" in s),
    ("result encoding (float32 -> output dtype)", lambda s: "ResultEncoder" in s
     or "FloatsToHalves" in s or "FloatToHalf" in s or "StoreFromFloat" in s),
    ("memcpy (slab assembly, protobuf copies)", lambda s: "memmove" in s or "memcpy" in s),
    ("memset (zero-fill of new buffers)", lambda s: "memset" in s),
    ("kernel: page faults and allocation", lambda s: s.startswith("[k]") and re.search(
        r"page|fault|memcg|clear_|alloc|folio|lru|mm_|rmqueue|pte|tlb|munmap|mmap|vma|zap", s)),
    ("kernel: socket copies and TCP", lambda s: s.startswith("[k]") and re.search(
        r"copy_(to|from)_iter|tcp|skb|sock|inet|ip_|__dev|net|loopback", s)),
    ("kernel: other (scheduling, futex, syscalls)", lambda s: s.startswith("[k]")),
    ("gRPC, protobuf, malloc, oneTBB, other", lambda s: True),
]


def parse(path):
    rows = []
    for line in open(path):
        m = re.match(r"\s+([0-9.]+)%\s+(\[[.k]\].*)$", line)
        if m:
            rows.append((float(m.group(1)), m.group(2).strip()))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, required=True)
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    runs = [a.runs[i:i + 3] for i in range(0, len(a.runs), 3)]
    table = {}
    summaries = []
    for label, report, bench in runs:
        stats = json.load(open(bench))
        summaries.append((label, stats))
        for pct, sym in parse(report):
            stage = next(name for name, test in STAGES if test(sym))
            table.setdefault(stage, {}).setdefault(label, 0.0)
            table[stage][label] += pct
    labels = [r[0] for r in runs]
    print("| stage (share of the server's CPU samples) | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for name, _ in STAGES:
        if name in table:
            print("| %s | %s |" % (name, " | ".join("%.1f%%" % table[name].get(l, 0.0) for l in labels)))
    print()
    for label, s in summaries:
        print("- %s: %d jobs in %.2f s, %.0f layer-head tokens/s, latency p50 %.0f ms, "
              "mean queue %.0f ms + compute %.0f ms of a mean %.0f ms (context %d)" % (
                  label, s["jobs"], s["wall_s"], s["tokens_per_s"], s["latency_ms"]["p50"],
                  s["queue_ms_mean"], s["compute_ms_mean"], s["latency_ms"]["mean"], a.context))


if __name__ == "__main__":
    main()
