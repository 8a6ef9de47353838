"""Writes an exactly equivalent copy of a model whose retrieval head's circuit keys are
scaled by --scale: rows r of layer 3's KV head 0 that the lookup head reads (its slow RoPE
pairs 18-31) are multiplied by s in wk, and the same rows of every query head of that KV
group by 1/s in wq, so every attention score q.k is unchanged (up to float rounding) and
so is everything the model computes. Only the geometry of the cached keys changes: the
cosine similarity that CentroidKV merges by (SPEC section 2) is not invariant to such a
rescaling, attention is. docs/results/quality-long.md compares the two.

  python rescale_keys.py --scale 10 --out cache/keys10/model.bin
"""
from __future__ import annotations

import argparse
import os

import torch

from circuit import HEAD, Circuit
from llama import export_llama2c, load_llama2c

LOOKUP_PAIRS = range(18, 32)  # tag (24-31), digit index (21-23), bins (18-20), sink (21)


def rescale(model, scale: float):
    cfg = model.cfg
    group = cfg.n_heads // cfg.n_kv_heads
    layer = model.layers[2]
    kv = 0
    assert Circuit.LOOKUP_HEAD // group == kv
    rows = [2 * p + c for p in LOOKUP_PAIRS for c in (0, 1)]
    with torch.no_grad():
        for r in rows:
            layer.wk.weight[kv * HEAD + r] *= scale
            for h in range(kv * group, (kv + 1) * group):
                layer.wq.weight[h * HEAD + r] /= scale
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.bin"))
    p.add_argument("--scale", type=float, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    model = rescale(load_llama2c(a.model), a.scale)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    export_llama2c(model, a.out)
    print(f"wrote {a.out} (lookup keys x{a.scale:g})")


if __name__ == "__main__":
    main()
