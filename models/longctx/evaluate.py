"""Held-out exact-match of the long-context model with the full cache, at its full context:
--per-kind cases of each kind (pass key, multi-key, variable tracking) with the deciding fact
at evenly spread depths 0..1, all kinds' facts present, on stories the training never saw
(seed 2) and a case seed of its own (7). Greedy exact match (teacher-forced argmax over the
answer tokens, which is the same thing). Also the language model's mean next-token loss on
those 128 held-out stories, each read from BOS (nats per token).

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


def story_loss(model, stories: list[list[int]], bos: int = 1) -> float:
    """Mean next-token cross-entropy over every story token, each story read from BOS."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for story in stories:
            seq = torch.tensor([[bos] + list(story)])
            logits = model(seq[:, :-1])[0]
            total += torch.nn.functional.cross_entropy(logits, seq[0, 1:], reduction="sum").item()
            count += len(story)
    return total / count


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
                      "context": model.cfg.seq_len, "exact_match": result,
                      "heldout_story_loss": round(story_loss(model, stories), 4)}))


if __name__ == "__main__":
    main()
