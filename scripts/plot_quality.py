#!/usr/bin/python3
"""Plots the quality report (docs/results/quality.json, written by centroidkv-quality) as
docs/results/quality.png: mean KL(full || compressed) and top-1 agreement per method and budget.

Usage: /usr/bin/python3 scripts/plot_quality.py [results.json] [out.png]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "docs/results/quality.json"
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/results/quality.png"
    with open(src) as f:
        rows = json.load(f)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    budgets = sorted({r["budget"] for r in rows}, reverse=True)
    value = {(r["method"], r["budget"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(methods)
    for m, method in enumerate(methods):
        xs = [b + (m - (len(methods) - 1) / 2) * width for b in range(len(budgets))]
        for ax, key in zip(axes, ("mean_kl", "top1")):
            ys = [value[(method, b)][key] if (method, b) in value else 0 for b in budgets]
            ax.bar(xs, ys, width, label=method)
    labels = ["%g%% of the prefill" % (100 * b) for b in budgets]
    for ax, title in zip(axes, ("mean KL(full || compressed), lower is better",
                                "top-1 agreement with the full cache, higher is better")):
        ax.set_xticks(range(len(budgets)))
        ax.set_xticklabels(labels)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    lows = [r["top1"] for r in rows]
    axes[1].set_ylim(max(0.0, min(lows) - 0.02), 1.0)
    target = axes[1].axhline(0.98, color="gray", linestyle="--", linewidth=1)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles + [target], names + ["top-1 target 0.98"], loc="lower center",
               ncol=len(methods) + 1, fontsize=8, frameon=False)
    fig.suptitle("stories260K, KV cache compressed after prefill (SPEC section 4)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(dst, dpi=120)
    print("wrote", dst)


if __name__ == "__main__":
    main()
