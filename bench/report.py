#!/usr/bin/python3
"""Joins the C++ benchmark's summary and the PyTorch peer's result into the markdown table of
docs/results/cpu-bench.md (keeping its hand-written sections, from HAND_WRITTEN_MARKER on) and
prints, last, one JSON line: a list with one object per chunk size
holding exactly chunk, tokens_per_s, gflops, peak_gflops, fraction_of_peak, faiss_ratio,
torch_ratio. Standard library only.

Usage: report.py --summary FILE --torch FILE --doc FILE --command "CMD" [--load "LOADAVG"]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

SPEC_WORKLOAD = {"heads": 8, "tokens": 32768, "dim": 128, "ratio": 0.5}


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def git_revision(root):
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt(value, digits=3):
    if value is None:
        return "n/a"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.{digits}g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.{digits}g}k"
    return f"{value:.{digits}g}"


def result_dtype_lines(summary):
    """The section comparing result dtypes (--result_dtype with several), or nothing."""
    by_dtype = summary.get("by_result_dtype", [])
    if len(by_dtype) < 2:
        return []
    threads = summary["threads"]
    lines = [
        "## Result rows in fp16 / bf16",
        "",
        "The same jobs with `CompressOptions::result_dtype` set (`--result_dtype`): the engine",
        "rounds each float32 row once as it streams it out, so half the result bytes are",
        "written; the memory floor then writes the result in that dtype too.",
        "",
        "| chunk | result dtype | ms / layer job | CPU busy | memory floor"
        " | fraction of memory floor |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    chunks = [c["chunk"] for c in by_dtype[0]["chunks"]]
    for chunk in chunks:
        for entry in by_dtype:
            floor = entry["memory_floor"]
            for c in entry["chunks"]:
                if c["chunk"] != chunk or c["seconds"] <= 0:
                    continue
                busy = c["cpu_seconds"] / (threads * c["seconds"]) if c.get("cpu_seconds") else 0
                lines.append(
                    f"| {chunk} | {entry['result_dtype']} | {c['seconds'] * 1e3:.1f}"
                    f" | {busy:.0%} | {floor['seconds'] * 1e3:.1f} ms"
                    f" ({floor['bytes'] / 1e6:.0f} MB) | {c['fraction_of_memory_floor']:.0%} |")
    return lines + [""]


# Everything from this line on in the existing doc is written by hand (runs pinned to one CPU,
# A/B of builds, other machines) and kept by a rerun.
HAND_WRITTEN_MARKER = "<!-- Measured by hand: bench/report.py keeps everything below. -->"


def hand_written_part(doc):
    """The existing doc's lines from HAND_WRITTEN_MARKER on, or none."""
    if not os.path.exists(doc):
        return []
    with open(doc) as f:
        old = f.read().split("\n")
    return old[old.index(HAND_WRITTEN_MARKER):] if HAND_WRITTEN_MARKER in old else []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--summary", required=True)
    parser.add_argument("--torch", default="")
    parser.add_argument("--doc", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--load", default="")
    args = parser.parse_args()

    with open(args.summary) as f:
        summary = json.load(f)
    torch_by_chunk, torch_meta = {}, {}
    if args.torch and os.path.exists(args.torch):
        with open(args.torch) as f:
            torch_meta = json.load(f)
        torch_by_chunk = {c["chunk"]: c for c in torch_meta["chunks"]}

    rows, final = [], []
    for c in summary["chunks"]:
        chunk = c["chunk"]
        t = torch_by_chunk.get(chunk)
        torch_ratio = t["seconds"] / c["seconds"] if t else None
        final.append({
            "chunk": chunk,
            "tokens_per_s": c["tokens_per_s"],
            "gflops": c["gflops"],
            "peak_gflops": c["peak_gflops"],
            "fraction_of_peak": c["fraction_of_peak"],
            "faiss_ratio": c.get("faiss_ratio"),
            "torch_ratio": torch_ratio,
        })
        rows.append((c, t, torch_ratio))

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    spec_ok = all(summary.get(k) == v for k, v in SPEC_WORKLOAD.items())
    engine = summary["engine"]
    peak = summary["peak"]
    lines = [
        "# CPU kernel benchmark",
        "",
        "Regenerate: `bench/run-cpu.sh` (this headline run, down to \"Measured by hand\"; do not",
        "edit it by hand). SPEC section 5, kernel level. The sections from \"Measured by hand\"",
        "on are kept as they are by a rerun, and each names its own command.",
        "",
    ]
    if engine != "cpu":
        lines += [
            f"> **Engine measured: `{engine}`**, not the fast CPU backend: these numbers are the",
            "> scalar reference engine's and say nothing about the fast backend's speed.",
            "",
        ]
    try:
        load1 = float(args.load.split()[0]) if args.load else 0.0
    except ValueError:
        load1 = 0.0
    if load1 > 0.7 * (os.cpu_count() or 1) / 2:
        lines += [
            f"> **Busy machine**: load average {args.load} at the start (other work was",
            "> running). Every number here shares the CPUs with it: absolute rates and the",
            "> peer ratios are noisy; the fraction of peak is against a peak measured in the",
            "> same process, under similar load. Rerun on a quiet machine for the record.",
            "",
        ]
    if not spec_ok:
        lines += [
            "> **Not the SPEC section 5 workload** (8 heads x 32768 tokens, d 128, ratio 0.5):",
            "> a reduced run, for checking the tooling only.",
            "",
        ]
    lines += [
        "| chunk | ms / layer job | layer-head tokens/s | GB/s KV | similarity GFLOP/s "
        "| peak GFLOP/s | fraction of peak | FAISS ratio | PyTorch ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, t, torch_ratio in rows:
        lines.append(
            f"| {c['chunk']} | {c['seconds'] * 1e3:.1f} | {fmt(c['tokens_per_s'])} "
            f"| {c['gb_per_s']:.3g} | {c['gflops']:.3g} | {c['peak_gflops']:.4g} "
            f"| {c['fraction_of_peak']:.1%} | {fmt(c.get('faiss_ratio'))} | {fmt(torch_ratio)} |")
    lines += [""]
    lines += [
        "Peers at the same chunk sizes (median seconds per layer job):",
        "",
        "| chunk | ours | ours, fresh result | CPU busy | FAISS search only "
        "(internal threads / over chunks) | PyTorch | agreement with ours: FAISS / PyTorch |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, t, _ in rows:
        fi = c.get("faiss_internal_seconds")
        fo = c.get("faiss_over_chunks_seconds")
        faiss_cell = (f"{fi * 1e3:.1f} ms / {fo * 1e3:.1f} ms" if fi and fo else "n/a")
        torch_cell = f"{t['seconds'] * 1e3:.1f} ms" if t else "n/a"
        agree_f = c.get("faiss_agreement")
        agree_t = t.get("assignment_agreement") if t else None
        agree = (f"{agree_f:.5f}" if agree_f is not None else "n/a") + " / " + \
                (f"{agree_t:.5f}" if agree_t is not None else "n/a")
        fresh = c.get("fresh_result_seconds")
        fresh_cell = f"{fresh * 1e3:.1f} ms" if fresh else "n/a"
        cpu = c.get("cpu_seconds")
        busy_cell = (f"{cpu / (c['seconds'] * summary['threads']):.0%}" if cpu else "n/a")
        lines.append(f"| {c['chunk']} | {c['seconds'] * 1e3:.1f} ms | {fresh_cell} | {busy_cell} "
                     f"| {faiss_cell} | {torch_cell} | {agree} |")
    lines += [
        "",
        "## Run",
        "",
        f"- Date: {now}; revision {git_revision(root)}.",
        f"- Machine: {summary.get('cpu_model') or cpu_model()}, {os.cpu_count()} logical CPUs"
        + (f" (ISA: {summary['isa_features']})" if summary.get("isa_features") else "")
        + (f"; load average at start: {args.load}" if args.load else "") + ".",
        f"- Engine: `{engine}` (what `EngineSet::Select(BackendKind::kCpu)` returned).",
        f"- fp32 FMA peak: {peak['gflops']:.4g} GFLOP/s ({peak['isa']}, {summary['threads']} "
        f"threads; best of the measurements before ({peak['before_gflops']:.4g}) and after "
        f"({peak['after_gflops']:.4g}) the runs, each the best of several repetitions).",
        f"- Kernel level: `{summary.get('kernel_level', 'n/a')}` (kernels/cpu/simd_dispatch.h)."
        + (f" On `amx`, chunks of 192 and more are matched on the AMX matrix engine in bf16x3"
           f" (three bf16 products per fp32-equivalent one, exact decisions kept by a rigorous"
           f" error bound); its own bf16 peak here, for context: "
           f"{summary['amx_bf16_peak_gflops']:.4g} GFLOP/s. The fraction of peak below stays"
           f" against the fp32 FMA peak, as SPEC section 5 defines it."
           if summary.get('amx_bf16_peak_gflops') else "")
        + (f" Chunks of {summary['int16_min_chunk']} rows and more are matched in 16-bit"
           f" integers (AVX2 `vpmaddwd`, AVX-512 VNNI `vpdpwssd`; exact decisions kept by a"
           f" rigorous error bound); the fraction of peak stays against the fp32 FMA peak."
           + (f" Their multiply-add ceiling here, for context (`bench/cpu_peak.cc`, 2 ops per"
              f" product): {summary['int16_peak_gops']:.4g} Gop/s, "
              f"{summary['int16_peak_gops'] / peak['gflops']:.2f}x the fp32 FMA peak."
              if summary.get('int16_peak_gops') else "")
           if summary.get('int16_min_chunk') else ""),
        (f"- Memory floor: {summary['memory_floor']['seconds'] * 1e3:.3g} ms per job: reading"
         f" the input once and writing the {summary.get('result_dtype', 'float32')} result once"
         f" ({summary['memory_floor']['bytes'] / 1e6:.0f} MB) at"
         f" {summary['memory_floor']['gb_per_s']:.3g} GB/s, all threads, nothing else. Per"
         f" chunk size: " + ", ".join(
             f"C={c['chunk']}: {c['fraction_of_memory_floor']:.0%} of it"
             for c in summary['chunks'] if 'fraction_of_memory_floor' in c)
         + " (floor / our time)." if summary.get('memory_floor') else "- Memory floor: n/a."),
        f"- Workload: {summary['heads']} heads x {summary['tokens']} tokens, head dim "
        f"{summary['dim']} (keys and values), {summary['dtype']}, head-major, one layer job; "
        f"max_passes {summary.get('max_passes', 1)} at target_ratio {summary['ratio']}, "
        f"sink {summary['sink']}, recent {summary['recent']}, uniform heads, no similarity floor, assignment computed. "
        f"Synthetic clustered keys and values (seed {summary['seed']}: 32 shared directions "
        "per head, runs of tokens near one direction, Gaussian noise 0.35).",
        f"- PyTorch {torch_meta.get('torch_version', 'n/a')}, "
        f"{torch_meta.get('threads', 'n/a')} threads; FAISS from Debian libfaiss-dev.",
        "",
        "Reproduce:",
        "",
        "```",
        args.command,
        "```",
        "",
    ] + result_dtype_lines(summary) + [
        "## Definitions",
        "",
        "- Time T: median wall-clock seconds of one whole layer job through",
        "  `ClusterEngine::CompressInto` (check the input for NaN/Inf, widen fp16, normalise,",
        "  match, select, merge, compact, write the float32 result and the assignment) into",
        "  one result kept across jobs, as a server thread would keep one: its memory is",
        "  faulted in once, before timing. Median over the repetitions (Google Benchmark,",
        "  `UseRealTime`).",
        "- Ours, fresh result: the same through `ClusterEngine::Compress`, which returns a new",
        "  result every job (page faults and zero-fill of ~134 MB of fresh memory each job).",
        "- CPU busy: process CPU time per job / (threads x T): how much of the machine our",
        "  threads used (100% = every thread busy the whole job).",
        "- layer-head tokens/s = H x n / T: every head's n input tokens count once (a layer",
        "  job of 8 heads x 32768 tokens is 262144 layer-head tokens). One head's own rate is",
        "  this divided by H.",
        "- GB/s KV = input bytes of keys and values (H x n x (dk + dv) x 2 for fp16) / T.",
        "- Similarity GFLOP/s = H x sum over chunks of |A| x |B| x 2d / T: the dot products",
        "  of the A-B matching (2d flops per pair), divided by the time of the whole pipeline,",
        "  not only of the matching. Fraction of peak = that / the fp32 FMA peak of all cores,",
        "  measured by `bench/cpu_peak.cc` in the same process.",
        "- FAISS ratio = FAISS matching time / our pipeline time (= our tokens/s / FAISS",
        "  tokens/s). FAISS does only the matching: `IndexFlatIP` over each chunk's normalised",
        "  B half, searched with its A half, k = 1; widening, normalising, de-interleaving and",
        "  building the indexes are done before timing, and the better of two threadings",
        "  counts (FAISS's own OpenMP + BLAS threads, one chunk after another; or an OpenMP",
        "  loop over chunks with single-threaded searches). > 1 means we are faster while",
        "  doing more work.",
        "- PyTorch ratio = PyTorch time / our time, for `bench/torch_peer.py`: a",
        "  straightforward implementation of the same pass (widen, normalise, batched matmul",
        "  of every chunk's A against its B, argmax, top-r per head, scatter_add merge,",
        "  compaction, assignment) on the same bytes, all cores, median after a warm-up run.",
        "- Agreement: the fraction of sources (FAISS) or entries (PyTorch assignment) that",
        "  land where ours do; below 1 only where two scores are within float rounding.",
        "",
    ]
    lines += hand_written_part(args.doc)
    os.makedirs(os.path.dirname(os.path.abspath(args.doc)), exist_ok=True)
    with open(args.doc, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.doc} (engine {engine}, kernel level "
          f"{summary.get('kernel_level', 'n/a')}, fp32 FMA peak {peak['gflops']:.4g} GFLOP/s "
          f"{peak['isa']}, CPU {summary.get('cpu_model') or cpu_model()})", file=sys.stderr)
    print(json.dumps(final))


if __name__ == "__main__":
    main()
