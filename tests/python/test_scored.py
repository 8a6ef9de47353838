"""Scored, budgeted and fitted jobs from Python against a real server (docs/scored-jobs.md):
score top-k eviction at centroid_share 0 equals a numpy oracle, tails clustered within each
head's budget, every backend the same bits, fitted log-weights within their bound, torch in
and out, and bad scores, queries and options refused naming the field."""
from __future__ import annotations

import numpy as np
import pytest

import centroidkv
from conftest import requires_torch, torch

H, N, D = 4, 96, 16


def layer(seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((H, 8, D)).astype(np.float32)
    pick = rng.integers(0, 8, size=(H, N))
    keys = centers[np.arange(H)[:, None], pick] + 0.2 * rng.standard_normal((H, N, D))
    values = rng.standard_normal((H, N, D)).astype(np.float32)
    scores = rng.random((H, N)).astype(np.float32)
    queries = 2 * keys[:, rng.integers(0, N, size=24)].repeat(2, axis=0)
    return keys.astype(np.float32), values, scores, queries.astype(np.float32)


def test_zero_share_is_score_top_k_eviction(client):
    keys, values, scores, _ = layer(1)
    r = client.compress(keys, values, scores=scores, target_tokens=30, centroid_share=0.0,
                        sink_tokens=2, recent_tokens=4, return_assignment=True)
    assert list(r.head_budgets) == [30] * H
    for h in range(H):
        middle = np.arange(2, N - 4)
        order = middle[np.argsort(-scores[h, middle], kind="stable")]
        kept = np.sort(np.concatenate([np.arange(2), order[:24], np.arange(N - 4, N)]))
        head = r.head(h)
        np.testing.assert_array_equal(head.keys, keys[h, kept])
        np.testing.assert_array_equal(head.values, values[h, kept])
        np.testing.assert_array_equal(head.counts, np.ones(30))
        assert r.head_exact_entries[h] == 30
        dropped = np.setdiff1d(np.arange(N), kept)
        assert (r.assignment[h, dropped] == -1).all()


def test_tail_centroids_keep_the_budget_and_every_backend_agrees(client):
    keys, values, scores, _ = layer(2)
    budgets = [20, 40, 96, 33]
    results = [client.compress(keys, values, scores=scores, head_budgets=budgets,
                               centroid_share=0.5, max_cluster_size=0, sink_tokens=2,
                               recent_tokens=4, chunk_size=16, backend=backend,
                               return_assignment=True)
               for backend in ("reference", "cpu")]
    ref, cpu = results
    for a, b in (("keys", ref), ("values", ref)):
        np.testing.assert_array_equal(getattr(b, a), getattr(cpu, a))
    np.testing.assert_array_equal(ref.counts, cpu.counts)
    np.testing.assert_array_equal(ref.assignment, cpu.assignment)
    for h, budget in enumerate(budgets):
        entries = int(cpu.offsets[h + 1] - cpu.offsets[h])
        assert entries == min(budget, N)
        assert int(cpu.head(h).counts.sum()) <= N
        assert cpu.head_exact_entries[h] <= entries
    assert cpu.head_exact_entries[2] == N  # budget >= length: every entry exact
    assert cpu.target_reached


def test_fitted_log_weights_are_bounded_and_replace_ln_count(client):
    keys, values, scores, queries = layer(3)
    r = client.compress(keys, values, scores=scores, target_tokens=24, centroid_share=1.0,
                        max_cluster_size=0, sink_tokens=0, recent_tokens=0, chunk_size=32,
                        queries=queries, log_weight_bound=2.0, fit_block_tokens=48)
    assert r.log_weights is not None and r.log_weights.shape == r.counts.shape
    assert np.all(np.abs(r.log_weights - np.log(r.counts.astype(np.float64))) <= 2.0 + 1e-5)
    np.testing.assert_array_equal(r.attention_bias(), r.log_weights)
    plain = client.compress(keys, values, scores=scores, target_tokens=24, centroid_share=1.0,
                            max_cluster_size=0, sink_tokens=0, recent_tokens=0, chunk_size=32)
    assert plain.log_weights is None
    np.testing.assert_array_equal(plain.attention_bias(), np.log(plain.counts.astype(np.float32)))
    np.testing.assert_array_equal(plain.counts, r.counts)  # the same rows, fitted


@requires_torch
def test_torch_in_torch_out(client):
    keys, values, scores, queries = layer(4)
    r = client.compress(torch.from_numpy(keys).half(), torch.from_numpy(values).half(),
                        scores=torch.from_numpy(scores), queries=torch.from_numpy(queries),
                        target_tokens=32, sink_tokens=2, recent_tokens=2)
    assert isinstance(r.keys, torch.Tensor) and r.keys.dtype == torch.float16
    assert isinstance(r.log_weights, torch.Tensor) and r.log_weights.shape == r.counts.shape
    assert isinstance(r.attention_bias(), torch.Tensor)


@pytest.mark.parametrize("case, field, head, token", [
    ("score_nan", "scores", 1, 5),
    ("query_inf", "queries", 3, 2),
    ("share", "start_job.selection.centroid_share", None, None),
    ("budget", "start_job.head_budgets", 2, None),
    ("passthrough_budget", "start_job.head_budgets", 0, None),
])
def test_bad_input_names_the_field(client, case, field, head, token):
    keys, values, scores, queries = layer(5)
    options = dict(scores=scores, queries=queries, target_tokens=40, sink_tokens=4,
                   recent_tokens=4)
    if case == "score_nan":
        scores[1, 5] = np.nan
    elif case == "query_inf":
        queries[3, 2, 0] = np.inf
    elif case == "share":
        options["centroid_share"] = 1.5
    elif case == "budget":
        options["head_budgets"] = [40, 40, 7, 40]
    else:
        options.update(head_budgets=[50, 40, 40, 40], passthrough_heads=[0])
    with pytest.raises(centroidkv.CompressError) as info:
        client.compress(keys, values, **options)
    assert info.value.field == field, info.value
    assert info.value.head == head
    assert info.value.token == token


def test_queries_must_fit_the_kv_heads(client):
    keys, values, scores, queries = layer(6)
    with pytest.raises(centroidkv.CompressError) as info:
        client.compress(keys, values, queries=queries[:6])
    assert info.value.field == "queries"
