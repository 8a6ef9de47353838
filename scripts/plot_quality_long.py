#!/usr/bin/python3
"""Plots the long-context report as docs/results/quality-long.png: retrieval exact match against the
deciding fact's depth per method at 25%, exact match against the budget, and fluent-text
mean KL against the budget (docs/results/quality-long-retrieval.json from centroidkv-retrieval,
docs/results/quality-long-kl.json from centroidkv-quality).

Usage: /usr/bin/python3 scripts/plot_quality_long.py RETRIEVAL.json KL.json OUT.png
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def accuracy(cells, key):
    hits, cases = defaultdict(int), defaultdict(int)
    for c in cells:
        k = key(c)
        if k is None:
            continue
        hits[k] += c["hits"]
        cases[k] += c["cases"]
    return {k: hits[k] / cases[k] for k in cases}


def style(method):
    """Dashed for the eviction controls that keep the outlier heads whole."""
    return "s--" if method.endswith("+outliers") and not method.startswith("centroidkv") else "o-"


def main():
    retrieval_path, kl_path, out = sys.argv[1:4]
    with open(retrieval_path) as f:
        cells = json.loads(f.read().strip().splitlines()[-1])
    with open(kl_path) as f:
        kl = json.load(f)
    methods = [m for m in dict.fromkeys(c["method"] for c in cells) if m != "full"]
    full = accuracy(cells, lambda c: "full" if c["method"] == "full" else None).get("full", 0)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    by_depth = accuracy(cells, lambda c: (c["method"], c["depth"]) if c["budget"] == 0.25 else None)
    depths = sorted({c["depth"] for c in cells})
    full_depth = accuracy(cells, lambda c: c["depth"] if c["method"] == "full" else None)
    axes[0].plot([100 * d for d in depths], [full_depth[d] for d in depths], "k--", label="full")
    for m in methods:
        axes[0].plot([100 * d for d in depths], [by_depth.get((m, d), 0) for d in depths],
                     style(m), label=m)
    axes[0].set(xlabel="depth of the deciding fact (%)", ylabel="exact match",
                title="retrieval at 25% of the KV cache", ylim=(-0.03, 1.03))
    by_budget = accuracy(cells, lambda c: (c["method"], c["budget"]) if c["method"] != "full" else None)
    budgets = sorted({c["budget"] for c in cells if c["method"] != "full"})
    axes[1].axhline(full, color="k", linestyle="--", label="full")
    for m in methods:
        axes[1].plot([100 * b for b in budgets], [by_budget.get((m, b), 0) for b in budgets],
                     style(m), label=m)
    axes[1].set(xlabel="KV kept (%)", ylabel="exact match", title="retrieval against budget",
                ylim=(-0.03, 1.03))
    kl_methods = list(dict.fromkeys(r["method"] for r in kl))
    for m in kl_methods:
        rows = sorted((r for r in kl if r["method"] == m), key=lambda r: r["budget"])
        axes[2].plot([100 * r["budget"] for r in rows], [r["mean_kl"] for r in rows], "o-", label=m)
    axes[2].set(xlabel="KV kept (%)", ylabel="mean KL(full || compressed)", yscale="log",
                title="fluent text")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=8)
    fig.suptitle("models/longctx (head dim 64): merging vs eviction, query-agnostic compression")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
