"""One budget over every layer and head (docs/scored-jobs.md, "Budgets"): how many entries
each head of each layer keeps when a whole cache must fit in `total` entries, everything
counted (passthrough heads, sinks, recent entries, exact entries and centroids).

- `global_budgets(scores, total, ...)`: KVzip's allocation, one top-k over all layers x heads
  x entries of the importance scores, sink and recent entries first; heads get very uneven
  shares. numpy in, numpy out.
- `equal_budgets(...)`: the same total spread evenly over the heads that are not kept
  whole (no scores).

Both raise BudgetError naming the option that makes a budget impossible (the passthrough
heads alone exceed it, or the sink and recent entries do): a budget is never exceeded
silently.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np


class BudgetError(ValueError):
    """A budget that cannot be met; `option` names the setting that makes it impossible."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")


def whole_heads(passthrough_heads, layer: int) -> list:
    """The heads of `layer` kept whole: a list for every layer, or a dict {layer: [heads]}."""
    if passthrough_heads is None:
        return []
    if isinstance(passthrough_heads, Mapping):
        return sorted(int(h) for h in passthrough_heads.get(layer, []))
    return sorted(int(h) for h in passthrough_heads)


def total_entries(kept: float, layers: int, heads: int, tokens: int) -> int:
    """Entries a cache of layers x heads x tokens keeps at `kept` (its share)."""
    return int(np.ceil(float(kept) * layers * heads * tokens))


def _protected(tokens: int, sink: int, recent: int) -> int:
    return min(tokens, sink + recent)


def equal_budgets(total: int, layers: int, heads: int, tokens: int, *, sink: int = 0,
                  recent: int = 0, passthrough_heads=None, least_extra: int = 1) -> list:
    """Per layer, [heads] budgets summing to at most `total`: passthrough heads their whole
    length, every other head an equal share of the rest (at least its sink and recent entries
    plus `least_extra`, what a SPEC job needs to merge)."""
    whole = {layer: whole_heads(passthrough_heads, layer) for layer in range(layers)}
    kept_whole = sum(len(w) for w in whole.values())
    others = layers * heads - kept_whole
    rest = total - kept_whole * tokens
    if rest < 0 or (others > 0 and rest < others):
        raise BudgetError("passthrough_heads", f"{kept_whole} heads kept whole take "
                          f"{kept_whole * tokens} entries, the budget is {total}")
    share = rest // others if others else 0
    least = _protected(tokens, sink, recent) + least_extra
    if others and share < min(tokens, least):
        raise BudgetError("passthrough_heads" if kept_whole else "target_ratio",
                          f"leaves each other head {share} entries, below the {least} it "
                          f"keeps at least (sink_tokens {sink} + recent_tokens {recent} + "
                          f"{least_extra} merged)")
    return [np.array([tokens if h in whole[layer] else min(share, tokens)
                      for h in range(heads)], dtype=np.int64) for layer in range(layers)]


def global_budgets(scores: Sequence[np.ndarray], total: int, *, sink: int = 0,
                   recent: int = 0, passthrough_heads=None) -> list:
    """Per layer, [H] budgets: the `total` best entries over all layers x heads x entries of
    `scores` (per layer [H, n], higher kept first; ties go to the earlier layer, head and
    entry), every head's sink and recent entries first, passthrough heads whole."""
    layers = len(scores)
    if layers == 0:
        return []
    flat, owners, budgets = [], [], []
    kept_whole = 0
    for layer, s in enumerate(scores):
        s = np.asarray(s, dtype=np.float64)
        heads, tokens = s.shape
        budgets.append(np.zeros(heads, dtype=np.int64))
        whole = whole_heads(passthrough_heads, layer)
        for h in range(heads):
            if h in whole:
                budgets[layer][h] = tokens
                kept_whole += tokens
                continue
            row = s[h].copy()
            protected = np.zeros(tokens, dtype=bool)
            protected[:min(sink, tokens)] = True
            if recent > 0:
                protected[max(0, tokens - recent):] = True
            row[protected] = np.inf
            flat.append(row)
            owners.append((layer, h))
    if total < kept_whole:
        raise BudgetError("passthrough_heads", f"heads kept whole take {kept_whole} entries, "
                          f"the budget is {total}")
    rest = total - kept_whole
    if not flat:
        return budgets
    lengths = np.array([len(r) for r in flat])
    must = sum(min(len(r), _protected(len(r), sink, recent)) for r in flat)
    if rest < must:
        raise BudgetError("passthrough_heads" if kept_whole else "target_ratio",
                          f"{rest} entries for {len(flat)} heads, below their "
                          f"{must} sink and recent entries")
    everything = np.concatenate(flat)
    head_of = np.repeat(np.arange(len(flat)), lengths)
    take = min(rest, len(everything))
    # Highest first; a stable sort keeps ties in order (layer, head, entry).
    order = np.argsort(-everything, kind="stable")[:take]
    counts = np.bincount(head_of[order], minlength=len(flat))
    for (layer, h), count in zip(owners, counts):
        budgets[layer][h] = count
    return budgets
