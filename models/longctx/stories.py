"""Fluent filler for the long-context model: stories sampled from stories260K (seeded), cached
as a .npz of token ids so training and evaluation reuse them.

  python stories.py OUT.npz --count N --seed S
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from tasks import sample_stories

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "models")


def load_or_sample(path: str, count: int, seed: int, max_len: int = 256,
                   model_path: str | None = None) -> list[list[int]]:
    if os.path.exists(path):
        data = np.load(path)
        flat, offsets = data["tokens"], data["offsets"]
        return [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    start = time.time()
    stories = sample_stories(model_path or os.path.join(SHARED, "stories260K.bin"), count,
                             max_len, seed)
    offsets = np.cumsum([0] + [len(s) for s in stories])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez(path, tokens=np.concatenate([np.array(s, dtype=np.int16) for s in stories]),
             offsets=offsets)
    print(f"sampled {count} stories (seed {seed}) in {time.time() - start:.0f} s -> {path}",
          flush=True)
    return stories


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    load_or_sample(a.out, a.count, a.seed)
