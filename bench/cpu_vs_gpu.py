#!/usr/bin/python3
"""The CPU-versus-GPU report: docs/results/cpu-vs-gpu.md and docs/results/cpu-vs-gpu.png
from measured rows only.

Inputs (missing GPU files make every GPU cell "not yet measured"):
  kernel, CPU:   docs/results/cpu-bench.md (written by bench/run-cpu.sh; its first table)
  kernel, GPU:   docs/results/gpu/bench.json, a list of {"card", "kind": "kernel"|"e2e"|"cpu",
                 "chunk", "tokens", "layer_heads", "dtype", "seconds_median",
                 "tokens_per_s", "kv_gbps", "fraction"} written by the GPU check
                 ("e2e" counts the host-device transfers, "cpu" is the CPU engine on the
                 GPU's host)
  service, CPU:  docs/results/cpu-service.json  (bench/run-service.sh --backend cpu)
  service, GPU:  docs/results/gpu/service.json  (bench/run-service.sh --backend gpu)

The crossover is where a measured GPU row beats the measured CPU row of the same shape:
kernel level with the GPU's "e2e" rows (host transfers counted), service level per context
length at the smallest number of concurrent streams. Nothing is estimated.

Usage: /usr/bin/python3 bench/cpu_vs_gpu.py [--docs DIR]
"""
import argparse
import json
import os
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NOT_MEASURED = "not yet measured"


def load_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def parse_rate(text):
    """'2.52M' -> 2.52e6 (the cpu-bench.md table's tokens/s column)."""
    m = re.fullmatch(r"([0-9.]+)([kMG]?)", text.strip())
    if not m:
        raise ValueError("not a rate: %r" % text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def cpu_kernel_rows(path):
    """The first table of docs/results/cpu-bench.md and its machine line."""
    rows, machine, workload = [], "", ""
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.startswith("<!-- Measured by hand"):
            break  # bench/report.py's HAND_WRITTEN_MARKER: the rest is not the headline run
        if line.startswith("- Machine:"):
            machine = line[len("- Machine:"):].strip().rstrip(".")
        if line.startswith("- Workload:"):
            workload = line[len("- Workload:"):].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].isdigit() and cells[1].replace(".", "").isdigit():
            if rows and int(cells[0]) <= rows[-1]["chunk"]:
                break  # the second table (peers) starts again at the first chunk
            rows.append({"chunk": int(cells[0]), "seconds_median": float(cells[1]) / 1e3,
                         "tokens_per_s": parse_rate(cells[2]), "kv_gbps": float(cells[3])})
    return rows, machine, workload


def fmt_rate(x):
    if x is None:
        return NOT_MEASURED
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return "%.3g%s" % (x / scale, unit)
    return "%.3g" % x


def kernel_section(cpu_rows, machine, workload, gpu_rows):
    out = ["## Kernel level", "",
           "One layer job of SPEC section 5 through `ClusterEngine::CompressInto` "
           "(layer-head tokens/s; median). CPU: " + (machine or "this VM") + ". " +
           ("Workload: " + workload if workload else ""), ""]
    gpu_by = {}
    for r in gpu_rows or []:
        if r.get("match", "tiles") != "tiles":
            continue  # kernel rows of the warp match are for docs/results/gpu only
        gpu_by.setdefault((r["kind"], int(r["chunk"])), r)
    cards = sorted({r["card"] for r in gpu_rows or []})
    out.append("| chunk | CPU (this VM) | CPU on the GPU's host | GPU kernel | GPU end to end "
               "(host transfers counted) | GPU e2e / best CPU | winner |")
    out.append("|---:|---:|---:|---:|---:|---:|---|")
    crossings = []
    for row in cpu_rows:
        c = row["chunk"]
        host = gpu_by.get(("cpu", c))
        kern = gpu_by.get(("kernel", c))
        e2e = gpu_by.get(("e2e", c))
        cpu_best = max(row["tokens_per_s"], host["tokens_per_s"] if host else 0)
        ratio = e2e["tokens_per_s"] / cpu_best if e2e else None
        winner = NOT_MEASURED if ratio is None else ("GPU" if ratio > 1 else "CPU")
        if ratio is not None and ratio > 1:
            crossings.append(c)
        out.append("| %d | %s | %s | %s | %s | %s | %s |" % (
            c, fmt_rate(row["tokens_per_s"]),
            fmt_rate(host["tokens_per_s"]) if host else NOT_MEASURED,
            fmt_rate(kern["tokens_per_s"]) if kern else NOT_MEASURED,
            fmt_rate(e2e["tokens_per_s"]) if e2e else NOT_MEASURED,
            "%.2f" % ratio if ratio is not None else NOT_MEASURED, winner))
    out.append("")
    out.append("GPU card: " + (", ".join(cards) if cards
                               else NOT_MEASURED + " (no docs/results/gpu/bench.json)") + ".")
    if not gpu_rows:
        out.append("Kernel-level crossover: " + NOT_MEASURED + ".")
    elif crossings:
        out.append("Kernel-level crossover: the GPU wins end to end from chunk %d." % min(crossings))
    else:
        out.append("Kernel-level crossover: none measured (the CPU wins at every chunk measured).")
    out.append("")
    return out


def service_section(cpu_rows, gpu_rows):
    out = ["## Service level", "",
           "`centroidkv-bench` against `centroidkv-server` on loopback, Llama-3-8B preset "
           "(one job = one layer: 8 KV heads x context x 128, fp16 in and out, target ratio "
           "0.25), batch size = concurrent streams (2 jobs in flight each). Layer-head tokens/s "
           "over the wall time of the run; latency per layer job p50.", ""]
    key = lambda r: (int(r["context"]), int(r["concurrency"]))
    cpu_by = {key(r): r for r in cpu_rows or []}
    gpu_by = {key(r): r for r in gpu_rows or []}
    shapes = sorted(set(cpu_by) | set(gpu_by))
    out.append("| context | streams | CPU tokens/s | CPU p50 ms | GPU tokens/s | GPU p50 ms "
               "| GPU / CPU | winner |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---|")
    crossover = {}
    for shape in shapes:
        c, g = cpu_by.get(shape), gpu_by.get(shape)
        ratio = g["tokens_per_s"] / c["tokens_per_s"] if c and g and c["tokens_per_s"] > 0 else None
        winner = NOT_MEASURED if ratio is None else ("GPU" if ratio > 1 else "CPU")
        if ratio is not None and ratio > 1:
            crossover.setdefault(shape[0], shape[1])
        out.append("| %d | %d | %s | %s | %s | %s | %s | %s |" % (
            shape[0], shape[1], fmt_rate(c["tokens_per_s"]) if c else NOT_MEASURED,
            "%.0f" % c["latency_ms"]["p50"] if c else NOT_MEASURED,
            fmt_rate(g["tokens_per_s"]) if g else NOT_MEASURED,
            "%.0f" % g["latency_ms"]["p50"] if g else NOT_MEASURED,
            "%.2f" % ratio if ratio is not None else NOT_MEASURED, winner))
    out.append("")
    commands = [r["command"] for r in (cpu_rows or []) + (gpu_rows or []) if "command" in r]
    if commands:
        out.append("Each row is one run of, e.g., `%s` against the one loopback server "
                   "that bench/run-service.sh starts; 4 jobs per stream, so the rows are short and noisy."
                   % commands[0])
        out.append("")
    cards = sorted({r["card"] for r in gpu_rows or []})
    cpus = sorted({r["card"] for r in cpu_rows or []})
    loads = sorted({r.get("load", "") for r in cpu_rows or []})
    out.append("CPU rows: " + (", ".join(cpus) if cpus else NOT_MEASURED) +
               ("; load averages during the runs: " + "; ".join(loads) if loads else "") + ".")
    out.append("GPU rows: " + (", ".join(cards) if cards else
                               NOT_MEASURED + " (no docs/results/gpu/service.json)") + ".")
    if not gpu_rows:
        out.append("Service-level crossover: " + NOT_MEASURED + ".")
    else:
        contexts = sorted({s[0] for s in shapes})
        parts = []
        for ctx in contexts:
            parts.append("%d tokens: %s" % (ctx, "GPU wins from %d streams" % crossover[ctx]
                                            if ctx in crossover else "CPU wins at every batch measured"))
        out.append("Service-level crossover (GPU faster than CPU): " + "; ".join(parts) + ".")
    out.append("")
    return out


def plot(cpu_kernel, gpu_kernel, cpu_service, gpu_service, path):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    chunks = [r["chunk"] for r in cpu_kernel]
    series = [("CPU (this VM)", {r["chunk"]: r["tokens_per_s"] for r in cpu_kernel})]
    for kind, label in (("cpu", "CPU on GPU host"), ("kernel", "GPU kernel"),
                        ("e2e", "GPU end to end")):
        vals = {int(r["chunk"]): r["tokens_per_s"] for r in gpu_kernel or []
                if r["kind"] == kind and r.get("match", "tiles") == "tiles"}
        if vals:
            series.append((label, vals))
    width = 0.8 / len(series)
    for i, (label, vals) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(chunks))]
        ax.bar(xs, [vals.get(c, 0) for c in chunks], width, label=label)
    ax.set_xticks(range(len(chunks)))
    ax.set_xticklabels(["chunk %d" % c for c in chunks])
    ax.set_yscale("log")
    ax.set_ylabel("layer-head tokens/s")
    title = "kernel level" + ("" if gpu_kernel else " (GPU: not yet measured)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    for rows, style, name in ((cpu_service, "-o", "CPU"), (gpu_service, "--s", "GPU")):
        for ctx in sorted({int(r["context"]) for r in rows or []}):
            pts = sorted((int(r["concurrency"]), r["tokens_per_s"]) for r in rows
                         if int(r["context"]) == ctx)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label="%s %dk" % (name, ctx // 1024))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams (batch)")
    ax.set_ylabel("layer-head tokens/s")
    ax.set_title("service level, Llama-3-8B" + ("" if gpu_service else " (GPU: not yet measured)"),
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", default="docs/results")
    args = parser.parse_args()
    d = args.docs
    cpu_kernel, machine, workload = cpu_kernel_rows(os.path.join(d, "cpu-bench.md"))
    gpu_kernel = load_json(os.path.join(d, "gpu", "bench.json"))
    cpu_service = load_json(os.path.join(d, "cpu-service.json"))
    gpu_service = load_json(os.path.join(d, "gpu", "service.json"))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = "unknown"
    lines = ["# CPU versus GPU", "",
             "Regenerate: `/usr/bin/python3 bench/cpu_vs_gpu.py` (from its inputs: see "
             "Reproduce)", "",
             "Generated at revision %s from measured rows only; do not edit by hand. Every GPU "
             "cell says \"%s\" until a run on a GPU has written its JSON." % (rev, NOT_MEASURED),
             ""]
    lines += kernel_section(cpu_kernel, machine, workload, gpu_kernel)
    lines += service_section(cpu_service, gpu_service)
    lines += ["![CPU versus GPU](cpu-vs-gpu.png)", "",
              "## Reproduce", "",
              "```sh",
              "bench/run-cpu.sh                   # kernel, CPU: docs/results/cpu-bench.md",
              "bench/run-service.sh --backend cpu # service, CPU: docs/results/cpu-service.json",
              "# on a GPU machine, scripts/gpu-check.sh: docs/results/gpu/bench.json (kernel)",
              "# and docs/results/gpu/service.json (bench/run-service.sh --backend gpu)",
              "/usr/bin/python3 bench/cpu_vs_gpu.py  # this page and the plot",
              "```", ""]
    with open(os.path.join(d, "cpu-vs-gpu.md"), "w") as f:
        f.write("\n".join(lines))
    plot(cpu_kernel, gpu_kernel, cpu_service, gpu_service, os.path.join(d, "cpu-vs-gpu.png"))
    print("wrote %s and %s" % (os.path.join(d, "cpu-vs-gpu.md"), os.path.join(d, "cpu-vs-gpu.png")),
          file=sys.stderr)


if __name__ == "__main__":
    main()
