"""Held-out exact-match of the long-context model with the full cache, at its full context:
--per-kind cases of each kind (pass key, multi-key, variable tracking) with the deciding fact
at evenly spread depths 0..1, all kinds' facts present, on stories the training never saw
(seed 2) and a case seed of its own (7). Greedy exact match (teacher-forced argmax over the
answer tokens, which is the same thing).

  python evaluate.py [--model model.bin] [--per-kind 20]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from llama import Tokenizer, load_llama2c
from stories import SHARED, load_or_sample
from tasks import FORMATS, TaskBuilder
from train import HERE, exact_match, heldout_cases


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--format", default="circuit", choices=sorted(FORMATS),
                   help="the task texts the model was trained on (train.py --format)")
    p.add_argument("--model", default=os.path.join(HERE, "model.bin"))
    p.add_argument("--per-kind", type=int, default=20)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = load_llama2c(a.model)
    tok = Tokenizer(os.path.join(SHARED, "tok512.bin"))
    stories = load_or_sample(os.path.join(HERE, "cache", "stories-heldout-s2-n128.npz"), 128, 2)
    cases = heldout_cases(TaskBuilder(tok, stories, a.format), model.cfg.seq_len, a.per_kind, a.seed)
    result = exact_match(model, cases, bf16=False)
    print(json.dumps({"model": a.model, "cases_per_kind": a.per_kind,
                      "context": model.cfg.seq_len, "exact_match": result}))


if __name__ == "__main__":
    main()
