"""centroidkv.torch: count-aware attention helpers against a brute-force reference built
from a real server result."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from centroidkv import torch as ckv_torch
from test_client import SMALL, random_layer


@pytest.fixture(scope="module")
def ragged(client):
    """A real result whose heads have different lengths (uniform_heads=False)."""
    keys, values = random_layer(heads=4, tokens=120, seed=21)
    # Head h: one direction plus noise growing with h, so a similarity floor lets head 0
    # merge down to the target while head 3 barely merges.
    keys = (1.0 + keys * np.array([0.02, 0.3, 1.0, 3.0])[:, None, None]).astype(np.float32)
    keys *= np.random.default_rng(5).integers(1, 4, (4, 120, 1)).astype(np.float32)
    result = client.compress(torch.from_numpy(keys), torch.from_numpy(values),
                             uniform_heads=False, min_similarity=0.9, **SMALL)
    lengths = (result.offsets[1:] - result.offsets[:-1]).tolist()
    assert len(set(lengths)) > 1, lengths  # really ragged
    return result


def brute_force(q, result, scale):
    """Per head, per query: sum_j exp(q.k_j * scale) * c_j * v_j / sum_j exp(...) * c_j, in
    float64 (ln c added to the logit == the weight multiplied by c)."""
    hq = q.shape[0]
    group = hq // result.num_heads
    out = torch.zeros(hq, q.shape[1], result.values.shape[1], dtype=torch.float64)
    for h in range(hq):
        k, v, c = result.head(h // group)
        logits = q[h].double() @ k.double().T * scale
        w = torch.exp(logits - logits.max(dim=-1, keepdim=True).values) * c.double()
        out[h] = (w / w.sum(dim=-1, keepdim=True)) @ v.double()
    return out


def test_log_count_bias_is_ln_count(ragged):
    bias = ckv_torch.log_count_bias(ragged.counts)
    assert bias.dtype == torch.float32
    torch.testing.assert_close(bias.double(), torch.log(ragged.counts.double()), rtol=1e-6,
                               atol=1e-7)
    assert torch.all(bias[ragged.counts == 1] == 0)


def test_padded_heads_match_the_concatenated_rows(ragged):
    padded = ckv_torch.padded_heads(ragged)
    lengths = ragged.offsets[1:] - ragged.offsets[:-1]
    assert padded.keys.shape == (4, int(lengths.max()), 16)
    assert torch.equal(padded.lengths, lengths)
    for h in range(4):
        k, v, c = ragged.head(h)
        n = k.shape[0]
        assert torch.equal(padded.keys[h, :n], k) and torch.equal(padded.values[h, :n], v)
        torch.testing.assert_close(padded.bias[h, :n], torch.log(c.float()))
        assert torch.all(torch.isneginf(padded.bias[h, n:]))
        assert torch.all(padded.keys[h, n:] == 0)


@pytest.mark.parametrize("query_heads", [4, 8])
def test_attention_equals_brute_force(ragged, query_heads):
    q = torch.randn(query_heads, 5, 16, generator=torch.Generator().manual_seed(1))
    out = ckv_torch.attention(q, ragged)
    expected = brute_force(q, ragged, 1 / math.sqrt(16))
    assert out.shape == (query_heads, 5, 12)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_widened_keys_give_the_biased_logits_and_attention(ragged):
    padded = ckv_torch.padded_heads(ragged)
    q = torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(2))
    scale = 1 / math.sqrt(16)
    wide_k = ckv_torch.widen_keys(padded.keys, padded.bias)
    wide_q = ckv_torch.widen_queries(q)
    assert wide_k.shape[-1] == 17 and torch.all(wide_q[..., -1] == 1)
    biased = q @ padded.keys.transpose(-1, -2) * scale + padded.bias[:, None, :]
    widened = wide_q @ wide_k.transpose(-1, -2) * scale
    real = torch.isfinite(biased)
    assert torch.equal(real, torch.isfinite(widened))
    torch.testing.assert_close(widened[real], biased[real], rtol=1e-5, atol=1e-5)
    # A kernel without a bias argument (torch's SDPA) on the widened tensors == the formula.
    sdpa = torch.nn.functional.scaled_dot_product_attention(wide_q, wide_k, padded.values,
                                                            scale=scale)
    torch.testing.assert_close(sdpa.double(), brute_force(q, ragged, scale), rtol=1e-5,
                               atol=1e-6)


def test_numpy_results_work_too(client):
    keys, values = random_layer(heads=2, tokens=64, seed=22)
    result = client.compress(keys, values, **SMALL)
    q = torch.randn(2, 4, 16)
    expected = brute_force(q, _as_torch(result), 1 / math.sqrt(16))
    torch.testing.assert_close(ckv_torch.attention(q, result).double(), expected, rtol=1e-5,
                               atol=1e-6)


def _as_torch(result):
    import dataclasses

    return dataclasses.replace(result, keys=torch.from_numpy(result.keys),
                               values=torch.from_numpy(result.values),
                               counts=torch.from_numpy(result.counts.astype(np.int64)),
                               offsets=torch.from_numpy(result.offsets))
