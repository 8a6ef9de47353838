"""Scored presses (centroidkv.kvpress with scorer=, centroidkv.scoring, centroidkv.budgets;
docs/scored-jobs.md) on stories260K against a real server: KVzip's scores with the global
budget at centroid_share 0 keep exactly the entries kvpress's KVzip keeps (and free the
rest); tail centroids and fitted log-weights go into the cache within the budget; and the
budget allocation's own rules, numpy only."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

kvpress = pytest.importorskip("kvpress")
from transformers import AutoTokenizer, LlamaForCausalLM, pipeline  # noqa: E402

from centroidkv.budgets import BudgetError, equal_budgets, global_budgets  # noqa: E402
from centroidkv.convert_llama2c import to_transformers, tokenizer_to_transformers  # noqa: E402
from centroidkv.kvpress import CentroidKVPress  # noqa: E402
from centroidkv.transformers import enable  # noqa: E402
from server_process import SHARED_DIR  # noqa: E402

SCORED = dict(chunk_size=32, sink_tokens=4, recent_tokens=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """stories260K as a transformers folder (KVzip reads its tokenizer from it)."""
    path = tmp_path_factory.mktemp("stories260k")
    to_transformers(SHARED_DIR / "models" / "stories260K.bin").save_pretrained(path)
    tokenizer_to_transformers(SHARED_DIR / "models" / "tok512.bin").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model(folder):
    m = LlamaForCausalLM.from_pretrained(folder).eval()
    enable(m)
    return m


@pytest.fixture(scope="module")
def ids(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = " Once upon a time, there was a girl named Lily. She had a red ball. " * 12
    return [1] + tokenizer.encode(text, add_special_tokens=False)[:255]


def prefill(model, press, ids):
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    return cache


def test_kvzip_scores_at_share_zero_keep_kvzips_entries(model, ids, client):
    theirs = kvpress.KVzipPress(compression_ratio=0.75)
    prefill(model, theirs, ids)
    masked = [layer.self_attn.masked_key_indices for layer in model.model.layers]
    for layer in model.model.layers:  # kvpress leaves its mask on the module
        del layer.self_attn.masked_key_indices
    ours = CentroidKVPress(client, target_ratio=0.25, scorer=kvpress.KVzipPress(),
                           centroid_share=0.0, return_assignment=True, **SCORED)
    prefill(model, ours, ids)
    n = len(ids)
    for layer, result in ours.results.items():
        _, heads, tokens = (t.numpy() for t in masked[layer])
        for h in range(result.num_heads):
            dropped = set(tokens[heads == h].tolist())
            kept = set(np.nonzero(np.asarray(result.assignment[h]) >= 0)[0].tolist())
            assert kept == set(range(n)) - dropped, (layer, h)
            assert int(result.head_exact_entries[h]) == len(kept)
    assert sum(int(r.offsets[-1]) for r in ours.results.values()) == \
        math.ceil(0.25 * n * len(ours.results) * model.config.num_key_value_heads)


def test_tail_centroids_and_fitted_log_weights_go_into_the_cache(model, ids, client):
    press = CentroidKVPress(client, target_ratio=0.25, scorer=kvpress.SnapKVPress(), fit=True,
                            centroid_share=0.3, **SCORED)
    cache = prefill(model, press, ids)
    n, layers = len(ids), len(press.results)
    total = sum(int(r.offsets[-1]) for r in press.results.values())
    assert total <= math.ceil(0.25 * n * layers * model.config.num_key_value_heads)
    budgets = np.concatenate([r.head_budgets for r in press.results.values()])
    assert budgets.min() < budgets.max(), "one global budget gives heads uneven shares"
    merged = 0
    for layer, result in press.results.items():
        assert result.log_weights is not None
        merged += int((np.asarray(result.counts) > 1).sum())
        keys = cache.layers[layer].keys[0]  # [H, T, d + 1]: log-weight / scale in the last
        scale = model.model.layers[layer].self_attn.scaling
        first = int(result.offsets[1])
        np.testing.assert_allclose(keys[0, :first, -1].float().numpy() * scale,
                                   np.asarray(result.log_weights[:first]), rtol=1e-2, atol=1e-2)
    assert merged > 0, "some tail entries were merged"
    with torch.no_grad():
        out = model(torch.tensor([[400, 401]]), past_key_values=cache,
                    position_ids=torch.tensor([[n, n + 1]])).logits
    assert torch.isfinite(out).all()


def test_scored_press_in_kvpress_pipeline(folder, client):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pipe = pipeline("kv-press-text-generation", model=LlamaForCausalLM.from_pretrained(folder),
                    tokenizer=tokenizer, device="cpu")
    context = " Lily had a red ball. She liked to play with it in the park." * 6
    press = CentroidKVPress(client, target_ratio=0.5, scorer=kvpress.SnapKVPress(), **SCORED)
    answer = pipe(context, question=" What did Lily have?", press=press,
                  max_new_tokens=6)["answer"]
    assert answer.strip()
    assert press.compression_ratio == pytest.approx(0.5, abs=0.01)


def test_global_budgets_take_the_best_entries_over_all_heads():
    scores = [np.array([[9.0, 1.0, 1.0, 8.0], [0.0, 0.0, 0.0, 0.0]]),
              np.array([[5.0, 6.0, 7.0, 0.5], [3.0, 2.0, 9.5, 1.0]])]
    budgets = global_budgets(scores, 5)
    assert [b.tolist() for b in budgets] == [[2, 0], [2, 1]]
    assert sum(int(b.sum()) for b in budgets) == 5
    # Sinks first in every head; a passthrough head whole and out of the competition.
    budgets = global_budgets(scores, 9, sink=1, passthrough_heads={1: [1]})
    assert budgets[1][1] == 4 and all(int(b.min()) >= 1 for b in budgets)
    assert sum(int(b.sum()) for b in budgets) == 9


def test_budgets_that_cannot_be_met_name_the_option():
    scores = [np.ones((2, 10))] * 3
    with pytest.raises(BudgetError) as info:
        global_budgets(scores, 15, passthrough_heads={0: [0, 1]})
    assert info.value.option == "passthrough_heads"
    with pytest.raises(BudgetError) as info:
        global_budgets(scores, 10, sink=2, recent=1)  # 6 heads x 3 protected = 18
    assert info.value.option == "target_ratio"
    with pytest.raises(BudgetError) as info:
        equal_budgets(15, 3, 2, 10, sink=2, recent=2, passthrough_heads={0: [0]})
    assert info.value.option == "passthrough_heads"
    budgets = equal_budgets(30, 3, 2, 10, sink=1, recent=1, passthrough_heads={0: [0]})
    assert budgets[0].tolist() == [10, 4] and sum(int(b.sum()) for b in budgets) <= 30
