"""Tables and plot of scripts/quality_kvpress.sh: reads PREFIX.json (bench/kvpress_quality.py)
and PREFIX-cpp.json (centroidkv-quality on the same texts) for each model and writes the
markdown tables (per model: KL / top-1, retrieval, prefill time, KV kept; the agreement of
our press with the C++ worker and of kvpress's StreamingLLM with ours) and one plot.
Needs only the standard library and matplotlib (/usr/bin/python3).

  python3 bench/kvpress_report.py PREFIX... --md OUT.md --png OUT.png
"""
from __future__ import annotations

import argparse
import json
import os


def load(prefix):
    with open(prefix + ".json") as f:
        run = json.load(f)
    cpp = []
    if os.path.exists(prefix + "-cpp.json"):
        with open(prefix + "-cpp.json") as f:
            cpp = json.load(f)
    return run, cpp


def cell(row, key, fmt):
    if "error" in row:
        return "did not run"
    return fmt.format(row[key]) if key in row else "-"


def model_tables(run, cpp) -> str:
    rows = run["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"] != "full"))
    budgets = sorted({r["budget"] for r in rows if r["method"] != "full"}, reverse=True)
    at = {(r["method"], r["budget"]): r for r in rows}
    full = at[("full", 1.0)]
    name = os.path.basename(run["model"])
    out = [f"## `{run['model']}`", "",
           f"{run['texts']} texts sampled from the model (seeds {run['seed']}..{run['seed'] + run['texts'] - 1}, "
           f"temperature 0.8), prefill {run['prefill']}, continuation {run['continuation']}; "
           f"kvpress {run['kvpress']}; outlier heads of centroidkv+outliers (ranked): "
           f"`{run['outlier_heads'] or 'none'}`.", ""]
    out += ["Mean KL(full || compressed) / top-1 agreement on fluent text (lower KL is better):", "",
            "| method | " + " | ".join(f"{100 * b:g}% kept" for b in budgets) + " |",
            "| --- | " + " | ".join("---:" for _ in budgets) + " |"]
    for m in methods:
        out.append(f"| {m} | " + " | ".join(
            cell(at[(m, b)], "mean_kl", "{:.5f}") +
            ("" if "error" in at[(m, b)] else f" / {at[(m, b)]['top1']:.4f}") for b in budgets) + " |")
    if run["cases_count"]:
        out += ["", f"Retrieval exact match ({run['cases_count']} cases of `{run['cases']}`, "
                "compressed before the question; full cache: "
                f"{full['exact_match']:.3f}):", "",
                "| method | " + " | ".join(f"{100 * b:g}% kept" for b in budgets) + " |",
                "| --- | " + " | ".join("---:" for _ in budgets) + " |"]
        for m in methods:
            out.append(f"| {m} | " + " | ".join(cell(at[(m, b)], "exact_match", "{:.3f}")
                                                for b in budgets) + " |")
    out += ["", "Prefill wall time (median over the texts, ms; full cache "
            f"{full['prefill_ms']:.1f}) and KV kept (entries after / before):", "",
            "| method | " + " | ".join(f"{100 * b:g}%: ms, kept" for b in budgets) + " |",
            "| --- | " + " | ".join("---:" for _ in budgets) + " |"]
    for m in methods:
        out.append(f"| {m} | " + " | ".join(
            "did not run" if "error" in at[(m, b)] else
            f"{at[(m, b)]['prefill_ms']:.1f}, {100 * at[(m, b)]['kv_fraction']:.1f}%"
            for b in budgets) + " |")
    errors = sorted({f"{r['method']}: {r['error']}" for r in rows if "error" in r})
    if errors:
        out += ["", "Did not run here:", ""] + [f"- {e}" for e in errors]
    if cpp:
        out += ["", "Agreement with `centroidkv-quality` (the C++ worker) on the same texts:", "",
                "| budget | our press (Python, kvpress) | centroidkv-quality | relative | "
                "kvpress StreamingLLM | our C++ StreamingLLM | relative |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        theirs = {(r["method"], r["budget"]): r for r in cpp}
        for b in budgets:
            ours, c = at.get(("centroidkv", b)), theirs.get(("centroidkv", b))
            s, cs = at.get(("streamingllm", b)), theirs.get(("streamingllm", b))
            if not (ours and c and s and cs) or "error" in ours or "error" in s:
                continue
            out.append(f"| {100 * b:g}% | {ours['mean_kl']:.5f} | {c['mean_kl']:.5f} | "
                       f"{ours['mean_kl'] / c['mean_kl'] - 1:+.2%} | {s['mean_kl']:.5f} | "
                       f"{cs['mean_kl']:.5f} | {s['mean_kl'] / cs['mean_kl'] - 1:+.2%} |")
    return "\n".join(out) + "\n"


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(run, "mean_kl", "mean KL (log)") for run, _ in runs]
    panels += [(run, "exact_match", "retrieval exact match") for run, _ in runs
               if run["cases_count"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    axes = axes if len(panels) > 1 else [axes]
    for ax, (run, key, label) in zip(axes, panels):
        rows = [r for r in run["rows"] if r["method"] != "full" and "error" not in r]
        for m in dict.fromkeys(r["method"] for r in rows):
            pts = sorted((100 * r["kv_fraction"], r[key]) for r in rows if r["method"] == m)
            style = dict(lw=2.5, marker="o") if m.startswith("centroidkv") else dict(lw=1, marker=".")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=m, **style)
        if key == "mean_kl":
            ax.set_yscale("log")
        else:
            full = [r for r in run["rows"] if r["method"] == "full"][0]
            ax.axhline(full["exact_match"], color="k", ls="--", label="full")
        ax.set_xlabel("KV kept (%)")
        ax.set_ylabel(label)
        ax.set_title(os.path.basename(os.path.dirname(run["model"])) + "/" +
                     os.path.basename(run["model"]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("CentroidKV's press among kvpress's presses")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefixes", nargs="+")
    ap.add_argument("--md", required=True)
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    runs = [load(p) for p in args.prefixes if os.path.exists(p + ".json")]
    text = ["# CentroidKV among kvpress's presses: the tables", "",
            "Regenerate: `scripts/quality_kvpress.sh`", "",
            "Generated by `scripts/quality_kvpress.sh` (bench/kvpress_quality.py, "
            "bench/kvpress_report.py); discussed in `quality-kvpress.md`. Every method runs "
            "through kvpress (`with press(model)` during prefill); CentroidKV through a server.", ""]
    text += [model_tables(run, cpp) for run, cpp in runs]
    with open(args.md, "w") as f:
        f.write("\n".join(text))
    plot(runs, args.png)
    print(f"wrote {args.md} and {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
