"""centroidkv.Sequence (client/python/centroidkv/sequence.py) against a real server: splices
applied with CacheRows give exactly the cache of the same policy run synchronously with
Client.compress, in order and out of order; heads stay at budget; cancel() leaves no job on
the server (its /metrics say so); an fp8 cache's splices are codes in its own scales, equal to
the same policy run with fp8 jobs in those scales."""
from __future__ import annotations

import math
import random
import tempfile
import time

import numpy as np
import pytest

from conftest import requires_torch
from server_process import ServerProcess, metric_value

from centroidkv import InvalidArgumentError
from centroidkv import CacheRows, Sequence

LAYERS, HEADS, DIM = 2, 2, 8
SMALL = dict(num_layers=LAYERS, num_heads=HEADS, key_dim=DIM, value_dim=DIM, sink_tokens=4,
             recent_tokens=8, chunk_tokens=16, budget_entries=48, chunk_size=8,
             backend="reference")


def tokens(count, seed):
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((8, DIM)).astype(np.float32)
    pick = rng.integers(0, 8, (count, LAYERS, HEADS))
    keys = protos[pick] + 0.3 * rng.standard_normal((count, LAYERS, HEADS, DIM)).astype(np.float32)
    values = rng.standard_normal((count, LAYERS, HEADS, DIM)).astype(np.float32)
    return keys.astype(np.float32), values


class WorkerCache:
    """A worker's cache: per layer [H, rows, d] arrays, splices applied where CacheRows says."""

    def __init__(self, dtype=np.float32):
        self.rows = CacheRows(LAYERS)
        self.keys = [np.zeros((HEADS, 0, DIM), dtype) for _ in range(LAYERS)]
        self.values = [np.zeros((HEADS, 0, DIM), dtype) for _ in range(LAYERS)]
        self.counts = [np.zeros((HEADS, 0), np.uint32) for _ in range(LAYERS)]

    def append(self, k, v):  # [L, H, d]
        for layer in range(LAYERS):
            self.keys[layer] = np.concatenate([self.keys[layer], k[layer][:, None]], axis=1)
            self.values[layer] = np.concatenate([self.values[layer], v[layer][:, None]], axis=1)
            self.counts[layer] = np.concatenate(
                [self.counts[layer], np.ones((HEADS, 1), np.uint32)], axis=1)
        self.rows.append_token()

    def apply(self, s) -> bool:
        place = self.rows.place(s)
        if place is None:
            return False
        b, e = place
        for name, rows in (("keys", s.keys), ("values", s.values), ("counts", s.counts)):
            table = getattr(self, name)
            table[s.layer] = np.concatenate([table[s.layer][:, :b], rows, table[s.layer][:, e:]],
                                            axis=1)
        return True

    def state(self):
        return [(self.keys[l], self.values[l], self.counts[l]) for l in range(LAYERS)]


def synchronous(client, keys, values, count, policy, fp8=None):
    """The same policy run one job at a time with Client.compress; fp8=(per-layer key
    scales, value scale): uint8 codes in and out in those scales."""
    o = SMALL
    room = o["budget_entries"] - o["sink_tokens"] - (o["recent_tokens"] + o["chunk_tokens"] - 1)
    job = dict(sink_tokens=0, recent_tokens=0, exact_target=True, pad_heads=True,
               chunk_size=o["chunk_size"], backend="reference")

    def compress(parts, target, layer):
        k = np.concatenate([p[0] for p in parts], axis=1)
        v = np.concatenate([p[1] for p in parts], axis=1)
        c = np.concatenate([p[2] for p in parts], axis=1)
        scales = {} if fp8 is None else dict(
            input_dtype="fp8_e4m3", output_dtype="fp8_e4m3", key_scale=fp8[0][layer],
            value_scale=fp8[1], output_key_scale=fp8[0][layer], output_value_scale=fp8[1])
        r = client.compress(k, v, c, target_tokens=target, **job, **scales)
        rows = int(r.offsets[1])
        return (np.asarray(r.keys).reshape(HEADS, rows, DIM),
                np.asarray(r.values).reshape(HEADS, rows, DIM),
                np.asarray(r.counts, np.uint32).reshape(HEADS, rows))

    state = []
    for layer in range(LAYERS):
        def raw(a, b):
            return (keys[a:b, layer].transpose(1, 0, 2), values[a:b, layer].transpose(1, 0, 2),
                    np.ones((HEADS, b - a), np.uint32))

        regions, nxt = [], o["sink_tokens"]
        for position in range(1, count + 1):
            if position - nxt < o["recent_tokens"] + o["chunk_tokens"]:
                continue
            chunk = raw(nxt, nxt + o["chunk_tokens"])
            nxt += o["chunk_tokens"]
            if policy == "ratio":
                regions.append(compress([chunk], math.ceil(0.5 * o["chunk_tokens"]), layer))
                continue
            regions.append(chunk)
            middle = sum(r[2].shape[1] for r in regions)
            while middle > room and not (len(regions) == 1 and regions[0][2].shape[1] <= 1):
                take = min(2, len(regions))
                rows = sum(r[2].shape[1] for r in regions[:take])
                merged = compress(regions[:take], max(1, rows - (middle - room)), layer)
                middle += merged[2].shape[1] - rows
                regions[:take] = [merged]
        parts = [raw(0, min(o["sink_tokens"], count))] + regions
        if count > nxt:
            parts.append(raw(nxt, count))
        state.append(tuple(np.concatenate([p[i] for p in parts], axis=1) for i in range(3)))
    return state


def feed(seq, cache, keys, values, held=None):
    for t in range(len(keys)):
        for layer in range(LAYERS):
            seq.append(layer, keys[t, layer], values[t, layer])
        seq.end_token()
        cache.append(keys[t], values[t])
        for s in seq.take_splices():
            held.append(s) if held is not None else cache.apply(s)
    seq.flush(timeout=60)
    for s in seq.take_splices():
        held.append(s) if held is not None else cache.apply(s)


def same(a, b):
    return all(np.array_equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))


@pytest.mark.parametrize("policy", ["ratio", "budget"])
def test_splices_equal_the_policy_run_synchronously(server, client, policy):
    count = 150
    keys, values = tokens(count, 5)
    cache = WorkerCache()
    with Sequence(server.target, policy=policy, **SMALL) as seq:
        feed(seq, cache, keys, values)
        assert seq.planned_rows() == cache.rows.rows(0)
    assert same(cache.state(), synchronous(client, keys, values, count, policy))
    if policy == "budget":
        assert all(cache.rows.rows(layer) <= SMALL["budget_entries"] for layer in range(LAYERS))
        assert seq.remerges_planned > 0


def test_late_and_out_of_order_splices_give_the_same_cache(server):
    count = 200
    keys, values = tokens(count, 6)
    in_order, held = WorkerCache(), []
    with Sequence(server.target, policy="budget", **SMALL) as seq:
        feed(seq, in_order, keys, values, held)
    for s in held:
        in_order.apply(s)
    for seed in (None, 1, 2):
        shuffled = list(reversed(held)) if seed is None else random.Random(seed).sample(held, len(held))
        late = WorkerCache()
        for t in range(count):
            late.append(keys[t], values[t])
        stale = sum(not late.apply(s) for s in shuffled)
        assert same(late.state(), in_order.state()), seed
        if seed is None:
            assert stale > 0


def test_a_budget_with_no_room_is_refused_naming_the_field(server):
    with pytest.raises(InvalidArgumentError, match="budget_entries"):
        Sequence(server.target, policy="budget", **dict(SMALL, budget_entries=28))


def test_cancel_leaves_no_job_on_the_server():
    with tempfile.TemporaryDirectory(prefix="ckv-py-seq-") as folder:
        server = ServerProcess(f"unix://{folder}/ckv.sock", metrics=True, threads=1)
        try:
            heads, dim, chunk = 8, 64, 1024
            seq = Sequence(server.target, num_layers=2, num_heads=heads, key_dim=dim,
                           value_dim=dim, sink_tokens=4, recent_tokens=16, chunk_tokens=chunk,
                           policy="ratio", chunk_size=512, backend="reference")
            rng = np.random.default_rng(9)
            for _ in range(4 + 16 + chunk):
                for layer in range(2):
                    seq.append(layer, rng.standard_normal((heads, dim)),
                               rng.standard_normal((heads, dim)))
                seq.end_token()
            deadline = time.monotonic() + 30
            while metric_value(server.metrics(), "centroidkv_jobs_in_flight") < 1:
                assert time.monotonic() < deadline, server.metrics()
                time.sleep(0.02)
            seq.cancel()
            assert seq.take_splices() == []
            deadline = time.monotonic() + 15
            while (metric_value(server.metrics(), "centroidkv_jobs_in_flight") != 0 or
                   metric_value(server.metrics(), "centroidkv_streams_open") != 0):
                assert time.monotonic() < deadline, server.metrics()
                time.sleep(0.05)
            assert metric_value(server.metrics(), "centroidkv_entries_total") == 0
        finally:
            server.stop()


KEY_SCALES, VALUE_SCALE = [0.02, 0.025], 0.015  # per layer (vLLM's k_scale); one for values


def fp8_codes(x, scale):
    import torch
    return torch.from_numpy(np.ascontiguousarray(x / scale, np.float32)).to(
        torch.float8_e4m3fn).view(torch.uint8).numpy()


@requires_torch
@pytest.mark.parametrize("policy", ["ratio", "budget"])
def test_fp8_splices_are_codes_in_the_cache_scales(server, client, policy):
    count = 150
    keys, values = tokens(count, 7)
    key_codes = np.stack([fp8_codes(keys[:, l], KEY_SCALES[l]) for l in range(LAYERS)], axis=1)
    value_codes = fp8_codes(values, VALUE_SCALE)
    cache, held = WorkerCache(np.uint8), []
    with Sequence(server.target, policy=policy, dtype="fp8_e4m3", key_scales=KEY_SCALES,
                  value_scales=VALUE_SCALE, **SMALL) as seq:
        feed(seq, cache, key_codes, value_codes, held)
    assert held and all(s.keys.dtype == np.uint8 and s.values.dtype == np.uint8 for s in held)
    for s in held:
        cache.apply(s)
    expected = synchronous(client, key_codes, value_codes, count, policy,
                           fp8=(KEY_SCALES, VALUE_SCALE))
    assert same(cache.state(), expected)
    if policy == "budget":
        assert seq.remerges_planned > 0


@pytest.mark.parametrize("kwargs, name, why", [
    (dict(dtype="fp8_e4m3", value_scales=1.0), "key_scales", "needs its scales"),
    (dict(dtype="fp8_e4m3", key_scales=[1.0, 1.0, 1.0], value_scales=1.0), "key_scales",
     "3 entries"),
    (dict(dtype="fp8_e4m3", key_scales=1.0, value_scales=[1.0, 0.0]), "value_scales",
     r"\[1\] 0.0 must be finite and > 0"),
    (dict(dtype="fp8_e4m3", key_scales=float("nan"), value_scales=1.0), "key_scales",
     "must be finite"),
    (dict(key_scales=1.0), "key_scales", "for fp8 caches only"),
])
def test_bad_fp8_scales_are_refused_naming_the_field(server, kwargs, name, why):
    with pytest.raises(InvalidArgumentError, match=f"{name}: .*{why}"):
        Sequence(server.target, policy="budget", **SMALL, **kwargs)
