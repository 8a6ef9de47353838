"""centroidkv.transformers on a real LlamaForCausalLM converted from stories260K
(centroidkv.convert_llama2c), against the C++ reference worker (worker): uncompressed
logits, a ratio-1.0 compression, and the SPEC section 4 quality at a 25% budget next to
centroidkv-quality's on the same texts, for the SPEC job and for the window-scored cache
(centroidkv-quality's centroidkv+snapkv)."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from centroidkv.convert_llama2c import to_transformers
from centroidkv.presets import SMALL_MODEL
from centroidkv.transformers import CentroidKVCache, enable
from server_process import BIN_DIR, SHARED_DIR

MODEL = SHARED_DIR / "models" / "stories260K.bin"
QUALITY = dict(SMALL_MODEL)  # centroidkv-quality's preset
PREFILL, CONTINUATION, TEXTS = 384, 96, 8


@pytest.fixture(scope="module")
def model():
    m = to_transformers(MODEL)
    enable(m)
    return m


@pytest.fixture(scope="module")
def texts(model):
    """Texts sampled from the model itself (temperature 0.8, BOS/EOS suppressed), BOS first:
    all TEXTS sequences at once, one batched forward per step (a plain DynamicCache)."""
    g = torch.Generator().manual_seed(1000)
    ids = torch.ones(TEXTS, 1, dtype=torch.long)
    cache = DynamicCache()
    step = ids
    with torch.no_grad():
        while ids.shape[1] < PREFILL + CONTINUATION:
            logits = model(step, past_key_values=cache).logits[:, -1]
            logits[:, [1, 2]] = -float("inf")
            step = torch.multinomial(torch.softmax(logits / 0.8, -1), 1, generator=g)
            ids = torch.cat([ids, step], dim=1)
    return ids.tolist()


def worker_logits(tmp_path, tokens):
    out = tmp_path / "logits.f32"
    subprocess.run([str(BIN_DIR / "ckv_worker_logits"), str(MODEL), str(out)] +
                   [str(t) for t in tokens], check=True)
    return torch.from_numpy(np.fromfile(out, np.float32).reshape(len(tokens), -1))


def test_uncompressed_logits_equal_the_cpp_worker(model, texts, tmp_path):
    tokens = texts[0][:200]
    expected = worker_logits(tmp_path, tokens)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)


def _continuation(model, cache, ids):
    """Prefill ids[:PREFILL] (compressed after it when the cache says so), then the
    continuation teacher-forced in one call; its logits [CONTINUATION, V]."""
    with torch.no_grad():
        model(torch.tensor([ids[:PREFILL]]), past_key_values=cache)
        return model(torch.tensor([ids[PREFILL:PREFILL + CONTINUATION]]),
                     past_key_values=cache).logits[0]


def test_ratio_one_gives_the_uncompressed_logits(model, texts, client):
    ids = texts[1]
    with torch.no_grad():
        full = model(torch.tensor([ids[:PREFILL + CONTINUATION]])).logits[0, PREFILL:]
    cache = CentroidKVCache(client, target_ratio=1.0, **QUALITY)
    logits = _continuation(model, cache, ids)
    assert cache.compressed
    assert all(int(r.counts.max()) == 1 and r.total_entries == r.num_heads * PREFILL
               for r in cache.results)
    torch.testing.assert_close(logits, full, rtol=0, atol=1e-4)


def test_generate_decodes_from_the_compressed_cache(model, texts, client):
    ids = torch.tensor([texts[2][:PREFILL]])
    cache = CentroidKVCache(client, target_ratio=0.25, **QUALITY)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=16, do_sample=False)
    assert cache.compressed and out.shape[1] == PREFILL + 16
    kept = cache.results[0].total_entries
    assert kept == cache.results[0].num_heads * (PREFILL // 4)
    # The cache reports true positions; it holds the centroids plus the new tokens.
    assert cache.get_seq_length() == PREFILL + 15
    assert cache.layers[0].keys.shape[-2] == kept // cache.results[0].num_heads + 15


def _agreement(full: torch.Tensor, logits: torch.Tensor):
    p = torch.log_softmax(full.double(), -1)
    q = torch.log_softmax(logits.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    return kl.sum().item(), (full.argmax(-1) == logits.argmax(-1)).sum().item()


def test_quarter_budget_quality_equals_centroidkv_quality(model, texts, client, server, tmp_path):
    kl_sum, top1, steps = 0.0, 0, 0
    for ids in texts:
        with torch.no_grad():
            full = model(torch.tensor([ids])).logits[0, PREFILL:PREFILL + CONTINUATION]
        cache = CentroidKVCache(client, target_ratio=0.25, **QUALITY)
        kl, matches = _agreement(full, _continuation(model, cache, ids))
        kl_sum, top1, steps = kl_sum + kl, top1 + matches, steps + CONTINUATION
    ours = dict(mean_kl=kl_sum / steps, top1=top1 / steps)

    tokens_file = tmp_path / "texts.txt"
    tokens_file.write_text("\n".join(" ".join(map(str, t)) for t in texts) + "\n")
    report = tmp_path / "quality.json"
    subprocess.run([str(BIN_DIR / "centroidkv-quality"), "--model", str(MODEL), "--tokenizer",
                    str(SHARED_DIR / "models" / "tok512.bin"), "--server", server.target,
                    "--tokens-file", str(tokens_file), "--prefill", str(PREFILL),
                    "--continuation", str(CONTINUATION), "--budgets", "0.25",
                    "--methods", "centroidkv", "--calibration-texts", "0",
                    "--chunk-size", "32", "--sink-tokens", "4", "--recent-tokens", "32",
                    "--report-md", "", "--report-json", str(report), "--quiet"],
                   check=True, capture_output=True)
    theirs = [r for r in json.loads(report.read_text()) if r["method"] == "centroidkv"][0]
    print(f"25% budget: python mean KL {ours['mean_kl']:.5f} top-1 {ours['top1']:.4f}; "
          f"centroidkv-quality mean KL {theirs['mean_kl']:.5f} top-1 {theirs['top1']:.4f}")
    assert ours["mean_kl"] == pytest.approx(theirs["mean_kl"], rel=0.02)
    assert ours["top1"] == pytest.approx(theirs["top1"], rel=0.02)


def _quality_cpp(server, tmp_path, texts, method):
    tokens_file = tmp_path / "texts.txt"
    tokens_file.write_text("\n".join(" ".join(map(str, t)) for t in texts) + "\n")
    report = tmp_path / "quality.json"
    subprocess.run([str(BIN_DIR / "centroidkv-quality"), "--model", str(MODEL), "--tokenizer",
                    str(SHARED_DIR / "models" / "tok512.bin"), "--server", server.target,
                    "--tokens-file", str(tokens_file), "--prefill", str(PREFILL),
                    "--continuation", str(CONTINUATION), "--budgets", "0.25",
                    "--methods", method, "--calibration-texts", "0", "--preset", "small-model",
                    "--report-md", "", "--report-json", str(report), "--quiet"],
                   check=True, capture_output=True)
    return [r for r in json.loads(report.read_text()) if r["method"] == method][0]


def test_window_scored_cache_keeps_its_budget_and_equals_the_cpp_worker(model, texts, client,
                                                                         server, tmp_path):
    """scorer="window" (the window being the recent 32, as the C++ worker's SnapKV): one
    budget over layers x heads, the heads' shares uneven, and the same quality as
    centroidkv-quality's centroidkv+snapkv on the same texts; fit=True decodes with the
    fitted log-weights."""
    kl_sum, top1, steps = 0.0, 0, 0
    for ids in texts:
        with torch.no_grad():
            full = model(torch.tensor([ids])).logits[0, PREFILL:PREFILL + CONTINUATION]
        cache = CentroidKVCache(client, target_ratio=0.25, scorer="window", window=32, **QUALITY)
        kl, matches = _agreement(full, _continuation(model, cache, ids))
        kl_sum, top1, steps = kl_sum + kl, top1 + matches, steps + CONTINUATION
        kept = [r.head_entries for r in cache.results]
        assert sum(int(k.sum()) for k in kept) <= len(kept) * len(kept[0]) * (PREFILL // 4)
        assert min(int(k.min()) for k in kept) < max(int(k.max()) for k in kept)
    ours = dict(mean_kl=kl_sum / steps, top1=top1 / steps)
    theirs = _quality_cpp(server, tmp_path, texts, "centroidkv+snapkv")
    print(f"25% budget, window-scored: python mean KL {ours['mean_kl']:.5f} top-1 "
          f"{ours['top1']:.4f}; centroidkv-quality mean KL {theirs['mean_kl']:.5f} top-1 "
          f"{theirs['top1']:.4f}")
    assert ours["mean_kl"] == pytest.approx(theirs["mean_kl"], rel=0.05)
    assert ours["top1"] == pytest.approx(theirs["top1"], rel=0.02)

    cache = CentroidKVCache(client, target_ratio=0.25, scorer="window", window=32, fit=True,
                            **QUALITY)
    logits = _continuation(model, cache, texts[0])
    assert all(r.log_weights is not None for r in cache.results)
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="fit needs a scorer"):
        CentroidKVCache(client, target_ratio=0.25, fit=True)
