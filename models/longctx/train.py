"""Trains the long-context test model (head dim 64, GQA, RoPE, context 1024) on stories260K
stories with pass-key, multi-key and variable-tracking tasks embedded (tasks.py), on CPU, with
fixed seeds; exports llama2.c format (the C++ worker), a transformers folder and held-out cases.

  python train.py --out OUT_DIR        (see README.md for the exact command and its results)

The committed model is `--circuit`: its retrieval circuit is set by hand
(circuit.py) and held while everything else trains.

The schedule is by step (so a rerun repeats it): a length curriculum (short sequences first,
where the retrieval circuit forms cheaply, then the full context), a fixed number of tokens per
step, AdamW with warmup and cosine decay. Every --eval-every steps it measures held-out
exact-match (teacher-forced argmax over the answer tokens, which equals greedy decoding's exact
match) and writes a checkpoint, so a partial run is usable.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F

import circuit
from llama import (Config, Tokenizer, Transformer, export_llama2c, export_transformers,
                   load_llama2c, save_config)
from stories import SHARED, load_or_sample
from tasks import (CIRCUIT_VARIABLES, COLON_OBJECTS, FORMATS, KINDS, PASSKEY_NAME, TaskBuilder,
                   batch, copy_batch)

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_schedule(text: str):
    """'256:0.4,512:0.25,1024:0.35' -> [(256, 0.4), ...] (fractions of the steps)."""
    phases = [(int(a), float(b)) for a, b in (p.split(":") for p in text.split(","))]
    total = sum(f for _, f in phases)
    return [(n, f / total) for n, f in phases]


def length_at(schedule, step: int, steps: int) -> int:
    acc = 0.0
    for n, f in schedule:
        acc += f
        if step < acc * steps:
            return n
    return schedule[-1][0]


def heldout_cases(builder: TaskBuilder, length: int, per_kind: int, seed: int, distractors=True):
    """Cases with the deciding fact at evenly spread depths 0..1, one asked kind each, all three
    kinds' facts present (the others as distractors)."""
    rng = random.Random(seed)
    cases = []
    for kind in KINDS:
        for i in range(per_kind):
            depth = i / max(1, per_kind - 1)
            seq, spans = builder.build(rng, length, asked=[kind], present=list(KINDS) if distractors else [kind],
                                        depth=depth)
            s, e, q = spans[0]
            cases.append({"kind": kind, "depth": depth, "prompt": seq[:s], "answer": seq[s:e],
                          "question_start": q})
    return cases


@torch.no_grad()
def exact_match(model: Transformer, cases, bf16: bool):
    """Per kind: the fraction of cases whose answer tokens are all the argmax (teacher-forced)."""
    model.eval()
    hits = {k: [0, 0] for k in KINDS}
    for c in cases:
        device = model.embedding.weight.device
        seq = torch.tensor([c["prompt"] + c["answer"][:-1]], device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(seq)
        pred = logits[0, len(c["prompt"]) - 1:].argmax(-1).tolist()
        hits[c["kind"]][0] += int(pred == c["answer"])
        hits[c["kind"]][1] += 1
    model.train()
    out = {k: h / n for k, (h, n) in hits.items() if n}
    out["all"] = sum(h for h, _ in hits.values()) / max(1, sum(n for _, n in hits.values()))
    return out


def prev_token_init(model: Transformer, offsets, pairs: int = 8, const: float = 0.5,
                    amp: float = 30.0):
    """Initializes query heads 0..len(offsets)-1 of the first layer as previous-token heads:
    head h attends to the token offsets[h] positions back, whatever the tokens are.

    How: embedding dimension 0 is set to `const` for every token, a constant direction after
    RMSNorm (the tied classifier adds the same logit to every token from it, so it changes no
    prediction). The first `pairs` RoPE pairs (the fastest-turning ones) of those heads' queries
    and of their KV heads' keys read only that direction, keys with phase 0 and queries with
    phase -offset * theta, so the score sum_p cos(theta_p * (i - j - offset)) peaks at
    j = i - offset; `amp` makes the softmax sharp (all but exactly on that token), with room
    for the embeddings' growth in training, which shrinks the constant after RMSNorm. Every weight is
    trained except these entries, which `hold` (returned) restores after every optimizer step:
    they give the copy ("induction") circuit the tasks need the previous-token heads it is
    otherwise slow to discover, and Adam would otherwise wash the constant direction out.

    Returns a function that puts the held entries back."""
    cfg = model.cfg
    hs = cfg.head_size
    group = cfg.n_heads // cfg.n_kv_heads
    with torch.no_grad():
        model.embedding.weight[:, 0] = const
        h0 = (const / model.embedding.weight.pow(2).mean(-1).sqrt()).mean().item()
        layer = model.layers[0]
        theta = cfg.rope_theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        for kv in sorted({h // group for h in range(len(offsets))}):
            layer.wk.weight[kv * hs:kv * hs + 2 * pairs] = 0
            layer.wk.weight[kv * hs:kv * hs + 2 * pairs:2, 0] = amp / h0
        for h, d in enumerate(offsets):
            layer.wq.weight[h * hs:h * hs + 2 * pairs] = 0
            for p in range(pairs):
                phi = -d * theta[p].item()
                layer.wq.weight[h * hs + 2 * p, 0] = amp / h0 * math.cos(phi)
                layer.wq.weight[h * hs + 2 * p + 1, 0] = amp / h0 * math.sin(phi)
    held = []
    for param, rows in ((model.embedding.weight, None), (layer.rms_att, [0]),
                        (layer.wk.weight, [kv * hs + r for kv in sorted({h // group for h in range(len(offsets))})
                                           for r in range(2 * pairs)]),
                        (layer.wq.weight, [h * hs + r for h in range(len(offsets)) for r in range(2 * pairs)])):
        mask = torch.zeros_like(param, dtype=torch.bool)
        if rows is None:  # the embedding's column 0
            mask[:, 0] = True
        else:
            mask[rows] = True
        held.append((param, mask, param.detach()[mask].clone()))

    def hold():
        with torch.no_grad():
            for param, mask, values in held:
                param[mask] = values
    return hold


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--tokens-per-step", type=int, default=2048)
    p.add_argument("--schedule", default="128:0.3,256:0.25,512:0.15,1024:0.3")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--answer-weight", type=float, default=10.0)
    p.add_argument("--copy-prob", type=float, default=0.5,
                   help="chance per sequence of a repeated random block (tasks.py)")
    p.add_argument("--format", default="v0", choices=sorted(FORMATS),
                   help="the fact/question texts (tasks.FORMATS); v0 is the committed model's")
    p.add_argument("--dense-frac", type=float, default=0.0,
                   help="share of training sequences with every present fact asked (tasks.py)")
    p.add_argument("--text-weight", type=float, default=1.0,
                   help="loss weight of the non-answer tokens (answers weigh --answer-weight)")
    p.add_argument("--short-eval-len", type=int, default=0,
                   help="length of the short held-out cases (default: the first schedule length)")
    p.add_argument("--copy-steps", type=int, default=0,
                   help="first steps on copy_batch (random blocks stated twice) only")
    p.add_argument("--copy-len", type=int, default=128)
    p.add_argument("--init-from", default="", help="a checkpoint.pt to start from (same shapes)")
    p.add_argument("--prev-token-heads", default="",
                   help="offsets, e.g. 1,2,3: first-layer heads initialized as previous-token "
                        "heads (prev_token_init)")
    p.add_argument("--circuit", action="store_true",
                   help="the committed model: 3 layers, 6 heads / 2 KV heads, RoPE base "
                        "500000, the retrieval circuit set by hand and held (circuit.py); use "
                        "--format circuit")
    p.add_argument("--rms-cap", type=float, default=0.0,
                   help="with --circuit: penalize layer inputs whose RMS exceeds this multiple of "
                        "the circuit's nominal one (the circuit's attention scores scale with "
                        "1/RMS^2); 0: no penalty")
    p.add_argument("--rms-weight", type=float, default=1.0)
    p.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is lent")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden-dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--train-stories", type=int, default=384)
    p.add_argument("--train-stories-seed", type=int, default=1)
    p.add_argument("--heldout-stories", type=int, default=128)
    p.add_argument("--heldout-stories-seed", type=int, default=2)
    p.add_argument("--heldout-per-kind", type=int, default=4)
    p.add_argument("--heldout-seed", type=int, default=7)
    p.add_argument("--eval-every", type=int, default=150)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-bf16", action="store_true")
    p.add_argument("--export-hf", action="store_true")
    a = p.parse_args()

    if a.circuit and a.format != "circuit":
        p.error("--circuit reads the names of --format circuit's facts")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    bf16 = not a.no_bf16
    os.makedirs(a.out, exist_ok=True)
    tok = Tokenizer(os.path.join(SHARED, "tok512.bin"))
    cache = os.path.join(HERE, "cache")
    train_stories = load_or_sample(
        os.path.join(cache, f"stories-train-s{a.train_stories_seed}-n{a.train_stories}.npz"),
        a.train_stories, a.train_stories_seed)
    heldout_stories = load_or_sample(
        os.path.join(cache, f"stories-heldout-s{a.heldout_stories_seed}-n{a.heldout_stories}.npz"),
        a.heldout_stories, a.heldout_stories_seed)
    builder = TaskBuilder(tok, train_stories, a.format)
    heldout = TaskBuilder(tok, heldout_stories, a.format)
    schedule = parse_schedule(a.schedule)
    eval_full = heldout_cases(heldout, a.seq_len, a.heldout_per_kind, a.heldout_seed)
    eval_short = heldout_cases(heldout, a.short_eval_len or schedule[0][0], a.heldout_per_kind,
                               a.heldout_seed + 1, distractors=False)

    if a.circuit:  # the retrieval circuit set by hand (circuit.py), then held
        cfg = circuit.config(len(tok.pieces), a.seq_len, a.dim, a.hidden_dim)
    else:
        cfg = Config(a.dim, a.hidden_dim, a.layers, a.heads, a.kv_heads, len(tok.pieces), a.seq_len)
    model = Transformer(cfg)
    model.init_weights(torch.Generator().manual_seed(a.seed))
    hold = lambda: None  # noqa: E731
    mask_grads = lambda: None  # noqa: E731
    if a.circuit:
        circ = circuit.Circuit(model, circuit.vocab_of(tok, PASSKEY_NAME, COLON_OBJECTS,
                                                        CIRCUIT_VARIABLES))
        hold, mask_grads = circ.hold, circ.mask_grads
        print(f"circuit: {circ.held_count()} entries held", flush=True)
    layer_inputs = []
    if a.circuit and a.rms_cap > 0:
        nominal_rms = circuit.nominal_rms(cfg.dim)
        for layer in model.layers:
            layer.register_forward_pre_hook(lambda mod, args: layer_inputs.append(args[0]))
    if a.prev_token_heads:
        hold = prev_token_init(model, [int(d) for d in a.prev_token_heads.split(",")])
    if a.init_from:  # the held entries are the same: the circuit is deterministic
        if a.init_from.endswith(".bin"):
            model.load_state_dict(load_llama2c(a.init_from).state_dict())
        else:
            model.load_state_dict(torch.load(a.init_from)["model"])
        hold()
    model.to(a.device)
    decay = [p_ for p_ in model.parameters() if p_.dim() == 2]
    no_decay = [p_ for p_ in model.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    data_rng = random.Random(a.seed)
    log = open(os.path.join(a.out, "train_log.jsonl"), "a")
    params = sum(p_.numel() for p_ in model.parameters())
    print(f"{params} parameters, config {cfg}", flush=True)
    log.write(json.dumps({"args": vars(a), "parameters": params}) + "\n")
    start = time.time()
    for step in range(a.steps + 1):
        if (step > 0 and step % a.eval_every == 0) or step == a.steps:
            record = {"step": step, "elapsed_s": round(time.time() - start),
                      "em_full": exact_match(model, eval_full, bf16),
                      "em_short": exact_match(model, eval_short, bf16)}
            print(json.dumps(record), flush=True)
            log.write(json.dumps(record) + "\n")
            log.flush()
            torch.save({"config": cfg.__dict__, "model": model.state_dict(), "step": step},
                       os.path.join(a.out, "checkpoint.pt"))
            export_llama2c(model, os.path.join(a.out, "model.bin"))
        if step == a.steps:
            break
        length = a.copy_len if step < a.copy_steps else length_at(schedule, step, a.steps)
        size = max(1, a.tokens_per_step // length)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        if step < a.copy_steps:
            data = copy_batch(data_rng, size, length, cfg.vocab_size, a.answer_weight, a.text_weight)
        else:
            data = batch(builder, data_rng, size, length, a.answer_weight, a.copy_prob, a.dense_frac,
                         a.text_weight)
        x, y, w = (t.to(a.device) for t in data)
        layer_inputs.clear()  # the evaluations' forward passes also went through the hooks
        with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        ce = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1),
                             reduction="none").view_as(w)
        loss = (ce * w).sum() / w.sum()
        penalty = torch.zeros(())
        if layer_inputs:
            for x_in in layer_inputs:
                rms = x_in.float().pow(2).mean(-1).sqrt() / nominal_rms
                penalty = penalty + torch.relu(rms - a.rms_cap).pow(2).mean()
            loss = loss + a.rms_weight * penalty
            layer_inputs.clear()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        mask_grads()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        hold()
        answer = w == a.answer_weight
        record = {"step": step, "len": length, "lr": round(lr, 6),
                  "loss_text": round(ce[~answer].mean().item(), 4),
                  "loss_answer": round(ce[answer].mean().item(), 4) if answer.any() else None,
                  "rms_penalty": round(penalty.item(), 5),
                  "elapsed_s": round(time.time() - start, 1)}
        log.write(json.dumps(record) + "\n")
        if step % 10 == 0:
            log.flush()
            print(json.dumps(record), flush=True)
    save_config(cfg, os.path.join(a.out, "config.json"))
    with open(os.path.join(a.out, "heldout_cases.json"), "w") as f:
        json.dump(eval_full, f)
    if a.export_hf:
        export_transformers(model, os.path.join(a.out, "hf"))
    print(f"done in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
