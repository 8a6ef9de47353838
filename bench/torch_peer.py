#!/usr/bin/python3
"""The PyTorch peer of centroidkv-cpu-bench: a straightforward implementation of one pass of
SPEC section 2 (uniform heads, no similarity floor) on the very data the C++ benchmark
wrote (keys.npy, values.npy, meta.json in DIR), timed without start-up.

Per chunk size: widen fp16 to fp32, normalise the keys, one batched matmul of every chunk's
A half against its B half, argmax per source, global top-r per head, count-weighted
scatter_add merge, compaction, assignment. A warm-up run first, then the median of
--reps runs. When DIR holds the engine's assignment_C<chunk>.npy, the fraction of entries
whose assignment agrees with ours is reported too (1.0 up to near-ties in float rounding).

Usage: /usr/bin/python3 bench/torch_peer.py DIR [--reps N] [--threads T] [--out FILE]
Prints one JSON line.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch


def chunk_matches(kn, begin, length, chunk):
    """Best B of every A in `length` entries from `begin`, cut into chunks of `chunk`.

    kn: [H, n, d] normalised keys. Returns (scores, a_pos, b_pos), each [H, sources],
    sources in position order (chunk after chunk)."""
    heads, _, dim = kn.shape
    scores, a_pos, b_pos = [], [], []
    full = length // chunk
    spans = []
    if full > 0:
        spans.append((begin, full, chunk))
    tail = length - full * chunk
    if tail >= 2:  # a last chunk of one entry has no B, hence no edge
        spans.append((begin + full * chunk, 1, tail))
    for start, count, size in spans:
        x = kn[:, start:start + count * size].reshape(heads * count, size, dim)
        a, b = x[:, 0::2], x[:, 1::2]
        sim = torch.bmm(a, b.transpose(1, 2))  # [H * count, |A|, |B|]
        best, index = sim.max(dim=2)  # first maximum on ties: the lowest b
        n_a = a.shape[1]
        base = start + size * torch.arange(count).view(1, count, 1)
        offsets = 2 * torch.arange(n_a).view(1, 1, n_a)
        scores.append(best.view(heads, count * n_a))
        a_pos.append((base + offsets).expand(heads, count, n_a).reshape(heads, -1))
        b_pos.append((base + 1 + 2 * index.view(heads, count, n_a)).reshape(heads, -1))
    if not scores:
        empty = torch.empty(heads, 0)
        return empty, empty.long(), empty.long()
    return torch.cat(scores, 1), torch.cat(a_pos, 1), torch.cat(b_pos, 1)


def compress(keys16, values16, chunk, ratio, sink, recent):
    """One pass of SPEC section 2 over all heads; returns (keys, values, counts, assignment)."""
    keys = keys16.float()
    values = values16.float()
    heads, n, dim = keys.shape
    target = math.ceil(ratio * n)
    counts = torch.ones(heads, n)
    if n <= target:
        return keys, values, counts, torch.arange(n).expand(heads, n)
    norm = keys.norm(dim=2, keepdim=True).clamp_min(1e-6)
    kn = keys / norm
    begin, end = sink, n - recent
    if end - begin < 2:
        return keys, values, counts, torch.arange(n).expand(heads, n)
    scores, a_pos, b_pos = chunk_matches(kn, begin, end - begin, chunk)
    r = min(n - target, scores.shape[1])  # uniform heads: every head has as many candidates
    # Global top-r per head. (Ties at the cut are not ordered by position here; with every
    # source merged, as at ratio 0.5 in one pass, there is no cut.)
    top = torch.topk(scores, r, dim=1, sorted=False).indices
    src = a_pos.gather(1, top)
    dst = b_pos.gather(1, top)
    # Count-weighted merge of each kept a into its b.
    kw = keys * counts.unsqueeze(2)
    vw = values * counts.unsqueeze(2)
    src3 = src.unsqueeze(2).expand(heads, r, dim)
    dst3 = dst.unsqueeze(2).expand(heads, r, dim)
    kw.scatter_add_(1, dst3, kw.gather(1, src3))
    vw.scatter_add_(1, dst3, vw.gather(1, src3))
    merged_counts = counts.scatter_add(1, dst, counts.gather(1, src))
    keep = torch.ones(heads, n, dtype=torch.bool)
    keep.scatter_(1, src, False)
    out_len = n - r
    out_counts = merged_counts[keep].view(heads, out_len)
    out_keys = kw[keep].view(heads, out_len, dim) / out_counts.unsqueeze(2)
    out_values = vw[keep].view(heads, out_len, dim) / out_counts.unsqueeze(2)
    owner = torch.arange(n).expand(heads, n).clone()
    owner.scatter_(1, src, dst)
    new_index = keep.long().cumsum(1) - 1
    assignment = new_index.gather(1, owner)
    return out_keys, out_values, out_counts, assignment


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    with open(os.path.join(args.dir, "meta.json")) as f:
        meta = json.load(f)
    keys16 = torch.from_numpy(np.load(os.path.join(args.dir, "keys.npy")))
    values16 = torch.from_numpy(np.load(os.path.join(args.dir, "values.npy")))
    heads, n, _ = keys16.shape
    results = []
    for chunk in meta["chunks"]:
        def run():
            return compress(keys16, values16, chunk, meta["ratio"], meta["sink"], meta["recent"])

        with torch.inference_mode():
            out = run()  # warm-up (and the result we check)
            samples = []
            cpu_samples = []  # process CPU time (all threads): comparable on a busy machine
            for _ in range(args.reps):
                start = time.perf_counter()
                cpu_start = time.process_time()
                run()
                samples.append(time.perf_counter() - start)
                cpu_samples.append(time.process_time() - cpu_start)
        seconds = statistics.median(samples)
        entry = {"chunk": chunk, "seconds": seconds, "samples": samples,
                 "cpu_seconds": statistics.median(cpu_samples),
                 "tokens_per_s": heads * n / seconds,
                 "entries_per_head": int(out[2].shape[1])}
        total = out[2].sum(dim=1)
        if not bool((total == n).all()):
            sys.exit(f"torch_peer: counts do not sum to {n} at chunk {chunk}")
        reference = os.path.join(args.dir, f"assignment_C{chunk}.npy")
        if os.path.exists(reference):
            ours = torch.from_numpy(np.load(reference).astype(np.int64))
            entry["assignment_agreement"] = float((ours == out[3]).double().mean())
        results.append(entry)
        print(f"torch chunk {chunk}: median {seconds * 1e3:.1f} ms "
              f"({heads * n / seconds / 1e6:.3f} M layer-head tokens/s)", file=sys.stderr)
    summary = {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
               "heads": heads, "tokens": n, "reps": args.reps, "chunks": results}
    line = json.dumps(summary)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
