"""Held-out cases of the long-context model, from stories the training never saw (seed 2):

- test_cases.json: the ctest cases (tests/worker/longctx_model_test.cc): cases of train.py's
  held-out set at the first, middle and last depth of each kind, with the greedy answer the
  PyTorch model decodes (the C++ worker must decode the same tokens) (same seed 7, so the card's accuracy covers them), full context.
- retrieval_cases.txt: the retrieval evaluation (centroidkv-retrieval): every kind with the
  deciding fact at depths 0, 0.25, 0.5, 0.75, 1 of texts of 256, 512 and 1024 tokens
  (--lengths), --per-depth cases each, with their own seed (100), one case a line:
  KIND DEPTH | context | question | answer.
- calibration_cases.txt: the same at the full context from the *training* stories and seed
  200 (--calibration-per-depth each): what `centroidkv-retrieval --calibration-cases` picks
  outlier heads on, never the evaluation's stories or seed.

  python cases.py [--per-depth N]
"""
from __future__ import annotations

import argparse
import json
import os
import random

import torch

from llama import Tokenizer, load_llama2c
from stories import SHARED, load_or_sample
from tasks import FORMATS, KINDS, TaskBuilder
from train import HERE, heldout_cases

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@torch.no_grad()
def greedy(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding in float32 with the full cache, and the logits after the prompt: the
    reference the C++ worker must match."""
    caches = model.new_caches(1, len(prompt) + steps)
    logits = model(torch.tensor([prompt]), caches, 0)[0, -1]
    first = [round(float(x), 5) for x in logits]
    out = []
    for i in range(steps):
        out.append(int(logits.argmax()))
        if i + 1 < steps:
            logits = model(torch.tensor([[out[-1]]]), caches, len(prompt) + i)[0, -1]
    return out, first


def ids(tokens) -> str:
    return " ".join(map(str, tokens))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--per-depth", type=int, default=2)
    p.add_argument("--test-per-kind", type=int, default=3)
    p.add_argument("--heldout-per-kind", type=int, default=8)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--lengths", default="256,512,1024")
    p.add_argument("--calibration-seed", type=int, default=200)
    p.add_argument("--calibration-per-depth", type=int, default=1)
    p.add_argument("--format", default="circuit", choices=sorted(FORMATS),
                   help="the task texts the model was trained on (train.py --format)")
    p.add_argument("--model", default=os.path.join(HERE, "model.bin"))
    a = p.parse_args()
    tok = Tokenizer(os.path.join(SHARED, "tok512.bin"))
    stories = load_or_sample(os.path.join(HERE, "cache", "stories-heldout-s2-n128.npz"), 128, 2)
    builder = TaskBuilder(tok, stories, a.format)
    cases = heldout_cases(builder, a.seq_len, a.heldout_per_kind, 7)
    test = []
    for kind in KINDS:  # evenly spread depths: the first, middle and last of each kind
        of_kind = [c for c in cases if c["kind"] == kind]
        n, k = len(of_kind), a.test_per_kind
        test += [of_kind[round(i * (n - 1) / max(1, k - 1))] for i in range(k)]
    model = load_llama2c(a.model).eval()
    for c in test:
        c["greedy"], c["logits"] = greedy(model, c["prompt"], len(c["answer"]))
    with open(os.path.join(HERE, "test_cases.json"), "w") as f:
        json.dump([{k: c[k] for k in ("kind", "depth", "prompt", "answer", "greedy", "logits")}
                   for c in test], f)
    hits = sum(c["greedy"] == c["answer"] for c in test)
    print(f"PyTorch greedy, full cache: {hits}/{len(test)} test cases answered exactly")
    lines = case_lines(builder, [int(n) for n in a.lengths.split(",")], a.per_depth, a.seed)
    with open(os.path.join(HERE, "retrieval_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    train_stories = load_or_sample(os.path.join(HERE, "cache", "stories-train-s1-n4096.npz"), 4096, 1)
    calibration = case_lines(TaskBuilder(tok, train_stories, a.format), [a.seq_len],
                             a.calibration_per_depth, a.calibration_seed)
    with open(os.path.join(HERE, "calibration_cases.txt"), "w") as f:
        f.write("\n".join(calibration) + "\n")
    print(f"{len(test)} test cases, {len(lines)} retrieval cases, {len(calibration)} calibration cases")


def case_lines(builder: TaskBuilder, lengths, per_depth: int, seed: int) -> list[str]:
    """Cases of every length, kind and depth, all kinds' facts present, one line each."""
    rng = random.Random(seed)
    lines = []
    for length in lengths:
        for kind in KINDS:
            for depth in DEPTHS:
                for _ in range(per_depth):
                    seq, spans = builder.build(rng, length, asked=[kind], present=list(KINDS),
                                               depth=depth)
                    s, e, q = spans[0]
                    lines.append(f"{kind} {depth:g} | {ids(seq[:q])} | {ids(seq[q:s])} | {ids(seq[s:e])}")
    return lines


if __name__ == "__main__":
    main()
