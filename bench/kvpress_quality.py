"""One evaluation loop for CentroidKV's kvpress press and kvpress's own presses:
the same model, texts, cases and budgets for every method, each applied the kvpress way
(`with press(model): model.model(context, past_key_values=cache)`).

Measures, per method and budget (the share of the cache kept):
- fluent text, SPEC section 4: texts sampled from the model (seeded, temperature 0.8,
  BOS/EOS suppressed); prefill --prefill tokens under the press, teacher-force the next
  --continuation tokens at their true positions, and compare each next-token distribution
  with the uncompressed run: mean KL(full || compressed) and top-1 agreement;
- retrieval (--cases, models/longctx's format): the context compressed before the
  question arrives, then the question and the answer teacher-forced; a case counts when
  every answer token is the argmax;
- prefill wall time (median over texts, ms) and the KV kept (entries after / before;
  presses that mask entries in place, AdaKV and KVzip, count the unmasked ones).

KVzip reads the tokenizer with AutoTokenizer.from_pretrained(model.config.name_or_path): the
--tokenizer is saved to a temporary folder, and the model's name_or_path names it.

Run by scripts/quality_kvpress.sh, which also runs centroidkv-quality on the same texts
(--tokens-out) for the agreement check and then writes docs/results/quality-kvpress-tables.md
(bench/kvpress_report.py).

  python bench/kvpress_quality.py --server unix:///tmp/ckv.sock --model M.bin \\
      [--tokenizer tok512.bin] --texts 16 --prefill 384 --continuation 96 --budgets 0.5,0.25,0.1 \\
      [--cases retrieval_cases.txt] [--outlier-heads 2:0,0:1] --json-out R.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time

import torch
from transformers import DynamicCache

import kvpress
import centroidkv
from centroidkv.convert_llama2c import to_transformers, tokenizer_to_transformers
from centroidkv.kvpress import CentroidKVPress
from centroidkv.presets import SMALL_MODEL
from centroidkv.transformers import enable

# centroidkv-quality's preset; kvpress's n_sink is 4 too.
PRESET = "small-model"
SINKS, RECENT, CHUNK = (SMALL_MODEL[k] for k in ("sink_tokens", "recent_tokens", "chunk_size"))


# ---- budgets as the C++ tools count them (worker/quality/methods.cc) ----------------------

def budget_entries(n: int, kept: float) -> int:
    return min(n, max(1, math.ceil(kept * n)))


def shared_target(heads: int, whole: int, n: int, kept: float) -> int:
    return max(1, (heads * budget_entries(n, kept) - whole * n) // max(1, heads - whole))


def heads_that_fit(heads: int, n: int, kept: float) -> int:
    count = 0
    while count + 1 < heads and shared_target(heads, count + 1, n, kept) >= SINKS + RECENT:
        count += 1
    return count


def parse_ranking(text: str) -> list:
    return [tuple(int(x) for x in item.split(":")) for item in text.split(",") if item]


# ---- the methods ---------------------------------------------------------------------------

def centroidkv_press(client, kept, n, config, ranking, output_dtype):
    """CentroidKV's press; with a ranking, as many of its heads kept whole as the budget
    affords at this length, the others shrunk to keep the total (centroidkv+outliers)."""
    common = dict(chunk_size=CHUNK, sink_tokens=SINKS, recent_tokens=RECENT)
    if output_dtype:
        common["output_dtype"] = output_dtype
    heads = config.num_hidden_layers * config.num_key_value_heads
    fit = min(heads_that_fit(heads, n, kept), len(ranking))
    if fit == 0:
        return CentroidKVPress(client, target_ratio=kept, **common)
    whole = {}
    for layer, head in ranking[:fit]:
        whole.setdefault(layer, []).append(head)
    return CentroidKVPress(client, target_tokens=shared_target(heads, fit, n, kept),
                           passthrough_heads=whole, **common)


def kvpress_presses():
    """kvpress's presses, at their authors' defaults except the sinks (4, as ours)."""
    p = kvpress
    return {
        "streamingllm": lambda r: p.StreamingLLMPress(compression_ratio=r, n_sink=SINKS),
        "snapkv": lambda r: p.SnapKVPress(compression_ratio=r),
        "knorm": lambda r: p.KnormPress(compression_ratio=r),
        "tova": lambda r: p.TOVAPress(compression_ratio=r),
        "expected_attention": lambda r: p.ExpectedAttentionPress(compression_ratio=r),
        "merging(snapkv)": lambda r: p.MergingPress(press=p.SnapKVPress(compression_ratio=r)),
        "adakv(snapkv)": lambda r: p.AdaKVPress(press=p.SnapKVPress(compression_ratio=r)),
        "adakv(expected_attention)":
            lambda r: p.AdaKVPress(press=p.ExpectedAttentionPress(compression_ratio=r)),
        "kvzip": lambda r: p.KVzipPress(compression_ratio=r),
    }


OURS = ("centroidkv", "centroidkv+outliers")
FP8 = "(fp8_e4m3)"  # the centroids come back as E4M3 codes with per-head scales

# Scored presses (docs/scored-jobs.md): a kvpress scorer's scores in the model, one budget
# over all layers x heads (or, "/equal", every head the same), scored jobs on the server.
#   centroidkv+kvzip             KVzip's scores, tail centroids at the best share measured
#   centroidkv+kvzip+fit         the same, fitted to KVzip's replay queries
#   centroidkv+SCORER@SHARE      a scorer (kvzip, snapkv) at a given centroid share
#   centroidkv+SCORER@SHARE/equal  equal per-head budgets instead of the global one
SCORED_SINKS, SCORED_RECENT = 4, 0  # KVzip's: 4 sinks, no recent window
SCORED_OPTIONS: dict = {}  # --scored-options: more Client.compress keywords for scored presses
BEST_SHARE = 0.15  # the server's default, calibrated on calibration texts (docs/scored-jobs.md)
SCORERS = {"kvzip": lambda: kvpress.KVzipPress(compression_ratio=0.5),
           "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=0.5)}


def scored_press(method, kept, client):
    """The press of a centroidkv+SCORER[@SHARE][/equal][+fit] method."""
    spec = method[len("centroidkv+"):]
    fit = spec.endswith("+fit")
    spec = spec.removesuffix("+fit")
    allocation = "global"
    if spec.endswith("/equal"):
        spec, allocation = spec.removesuffix("/equal"), "equal"
    scorer, _, share = spec.partition("@")
    return CentroidKVPress(client, target_ratio=kept, scorer=SCORERS[scorer](), fit=fit,
                           allocation=allocation, **SCORED_OPTIONS,
                           centroid_share=float(share) if share else BEST_SHARE,
                           chunk_size=CHUNK, sink_tokens=SCORED_SINKS,
                           recent_tokens=SCORED_RECENT)


def make_press(method, kept, n, config, client, ranking):
    base = method.removesuffix(FP8)
    if base in OURS:
        return centroidkv_press(client, kept, n, config, ranking if base == OURS[1] else [],
                                "fp8_e4m3" if method.endswith(FP8) else None)
    if base.startswith("centroidkv+") and base.split("+")[1].split("@")[0].split("/")[0] in SCORERS:
        return scored_press(method, kept, client)
    return kvpress_presses()[method](1.0 - kept)


# ---- one prefill under a press, and what comes after ---------------------------------------

def prefill(model, press, ids):
    """The context through the model (no LM head) under `press`; the cache, the seconds."""
    cache = DynamicCache()
    start = time.perf_counter()
    # no_grad outermost: KVzip runs its scoring passes as its press's block exits.
    with torch.no_grad(), (press(model) if press is not None else contextlib.nullcontext()):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    return cache, time.perf_counter() - start


def entries(model, cache) -> int:
    """Entries held over every layer and head (count-aware layers: every real row), less
    those a head-wise press masked (kvpress's masked_key_indices, set during the prefill)."""
    total = 0
    for attention in (layer.self_attn for layer in model.model.layers):
        masked = getattr(attention, "masked_key_indices", None)
        if masked is not None:
            total -= len(masked[0])
    for layer in cache.layers:
        keys = layer.keys[0]
        if keys.shape[-1] > layer.values.shape[-1]:  # ln(count) column: -inf marks padding
            total += int(torch.isfinite(keys[..., -1]).sum())
        else:
            total += keys.shape[0] * keys.shape[1]
    return total


def forward_after(model, cache, tokens, start):
    """Logits of `tokens` fed after the cache at true positions start, start + 1, ..."""
    positions = torch.arange(start, start + len(tokens))[None]
    with torch.no_grad():
        return model(torch.tensor([tokens]), past_key_values=cache,
                     position_ids=positions).logits[0]


def sample_texts(model, count, length, seed):
    """`count` texts of `length` tokens (BOS first), temperature 0.8, BOS/EOS suppressed,
    sampled together (one batched forward per step)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.ones(count, 1, dtype=torch.long)
    cache, step = DynamicCache(), ids
    with torch.no_grad():
        while ids.shape[1] < length:
            logits = model(step, past_key_values=cache).logits[:, -1]
            logits[:, [1, 2]] = -math.inf
            step = torch.multinomial(torch.softmax(logits / 0.8, -1), 1, generator=g)
            ids = torch.cat([ids, step], dim=1)
    return ids.tolist()


def read_cases(path):
    """models/longctx/cases.py's lines: KIND DEPTH | context | question | answer."""
    cases = []
    for line in open(path):
        if line.strip():
            head, context, question, answer = line.split("|")
            kind, depth = head.split()
            cases.append(dict(kind=kind, depth=float(depth), context=[int(t) for t in context.split()],
                              question=[int(t) for t in question.split()],
                              answer=[int(t) for t in answer.split()]))
    return cases


def evaluate(model, client, args, methods, texts, cases, ranking):
    config = model.config
    rows = []
    full_logits = []
    with torch.no_grad():
        for ids in texts:
            full_logits.append(model(torch.tensor([ids])).logits[0, args.prefill:])
    for kept in args.budgets:
        for method in methods:
            row = dict(method=method, budget=kept)
            try:
                kl_sum, top1, steps, seconds, before, after = 0.0, 0, 0, [], 0, 0
                for ids, full in zip(texts, full_logits):
                    press = make_press(method, kept, args.prefill, config, client, ranking)
                    cache, s = prefill(model, press, ids[:args.prefill])
                    seconds.append(s)
                    after += entries(model, cache)
                    before += args.prefill * config.num_hidden_layers * config.num_key_value_heads
                    logits = forward_after(model, cache, ids[args.prefill:], args.prefill)
                    p = torch.log_softmax(full.double(), -1)
                    q = torch.log_softmax(logits.double(), -1)
                    kl_sum += float((p.exp() * (p - q)).sum())
                    top1 += int((full.argmax(-1) == logits.argmax(-1)).sum())
                    steps += full.shape[0]
                row.update(mean_kl=kl_sum / steps, top1=top1 / steps, kv_fraction=after / before,
                           prefill_ms=1000 * statistics.median(seconds))
                hits = {}
                for c in cases:
                    press = make_press(method, kept, len(c["context"]), config, client, ranking)
                    cache, _ = prefill(model, press, c["context"])
                    fed = c["question"] + c["answer"][:-1]
                    logits = forward_after(model, cache, fed, len(c["context"]))
                    got = logits[len(c["question"]) - 1:].argmax(-1).tolist()
                    hits.setdefault(c["kind"], []).append(got == c["answer"])
                if cases:
                    row["exact_match"] = sum(sum(h) for h in hits.values()) / len(cases)
                    row["exact_match_by_kind"] = {k: sum(h) / len(h) for k, h in hits.items()}
            except Exception as error:  # a press that does not run here: reported, not hidden
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    # full cache, once
    row = dict(method="full", budget=1.0, mean_kl=0.0, top1=1.0, kv_fraction=1.0)
    row["prefill_ms"] = 1000 * statistics.median(prefill(model, None, ids[:args.prefill])[1]
                                                 for ids in texts)
    if cases:
        hits = 0
        for c in cases:
            logits = forward_after(model, DynamicCache(), c["context"] + c["question"] +
                                   c["answer"][:-1], 0)
            start = len(c["context"]) + len(c["question"]) - 1
            hits += logits[start:].argmax(-1).tolist() == c["answer"]
        row["exact_match"] = hits / len(cases)
    rows.insert(0, row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True, help="a llama2.c checkpoint (.bin)")
    ap.add_argument("--tokenizer", default="../shared/models/tok512.bin",
                    help="its llama2.c tokenizer.bin (KVzip encodes its repeat prompt)")
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--prefill", type=int, default=384)
    ap.add_argument("--continuation", type=int, default=96)
    ap.add_argument("--budgets", default="0.5,0.25,0.1")
    ap.add_argument("--methods", default=",".join(OURS + tuple(m + FP8 for m in OURS) +
                                                  tuple(kvpress_presses())))
    ap.add_argument("--cases", default="", help="retrieval cases (models/longctx format)")
    ap.add_argument("--outlier-heads", default="",
                    help="ranked LAYER:HEAD,... for centroidkv+outliers (calibrated elsewhere)")
    ap.add_argument("--tokens-out", default="", help="write the texts (centroidkv-quality "
                    "--tokens-file)")
    ap.add_argument("--json-out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scored-options", default="{}",
                    help="JSON of more Client.compress keywords for the scored presses, e.g. "
                    "'{\"max_cluster_size\": 32, \"fit_block_tokens\": 64}'")
    args = ap.parse_args()
    SCORED_OPTIONS.update(json.loads(args.scored_options))
    print(f"kvpress_quality: preset {PRESET} (chunk {CHUNK}, sink {SINKS}, recent {RECENT}); "
          f"scored presses: sink {SCORED_SINKS}, recent {SCORED_RECENT}, options "
          f"{SCORED_OPTIONS}", file=sys.stderr)
    args.budgets = [float(b) for b in args.budgets.split(",")]
    torch.set_num_threads(args.threads)
    model = to_transformers(args.model).requires_grad_(False)
    tokenizer_dir = tempfile.TemporaryDirectory(prefix="ckv-kvpress-tokenizer-")
    tokenizer_to_transformers(args.tokenizer).save_pretrained(tokenizer_dir.name)
    model.config.name_or_path = tokenizer_dir.name
    enable(model)  # the count-aware attention: SDPA on every plain cache, ln(count) on ours
    ranking = parse_ranking(args.outlier_heads)
    methods = [m for m in args.methods.split(",") if not m.startswith(OURS[1]) or ranking]
    texts = sample_texts(model, args.texts, args.prefill + args.continuation, args.seed)
    if args.tokens_out:
        with open(args.tokens_out, "w") as f:
            f.write("\n".join(" ".join(map(str, t)) for t in texts) + "\n")
    cases = read_cases(args.cases) if args.cases else []
    with centroidkv.Client(args.server, timeout=600) as client:
        rows = evaluate(model, client, args, methods, texts, cases, ranking)
    with open(args.json_out, "w") as f:
        json.dump(dict(model=args.model, texts=args.texts, seed=args.seed, prefill=args.prefill,
                       continuation=args.continuation, cases=args.cases, cases_count=len(cases),
                       outlier_heads=args.outlier_heads, kvpress=kvpress_version(),
                       preset=dict(name=PRESET, **SMALL_MODEL),
                       scored=dict(sink_tokens=SCORED_SINKS, recent_tokens=SCORED_RECENT,
                                   best_share=BEST_SHARE, **SCORED_OPTIONS),
                       rows=rows), f, indent=1)
    return 0


def kvpress_version() -> str:
    import importlib.metadata
    return importlib.metadata.version("kvpress")


if __name__ == "__main__":
    raise SystemExit(main())
