"""The serving-engine fields of the protocol through centroidkv.Client against a
real server: ragged input (a result sent back as it is), count-0 padding, pad_heads /
pad_to / exact_target, token-major output, the per-head account, JobErrors with field /
head / token that leave the other layers alone, job deadlines, priorities, slab limits."""
from __future__ import annotations

import contextlib
import tempfile
import threading
import time

import grpc
import numpy as np
import pytest

import centroidkv
from conftest import requires_torch, torch
from server_process import ServerProcess, metric_value
from test_client import random_layer

# Parameters under which heads end with different lengths: a similarity floor that stops
# some heads early (uniform_heads off so each head stops on its own).
FLOOR = dict(target_ratio=0.25, chunk_size=16, sink_tokens=2, recent_tokens=4,
             min_similarity=0.5, uniform_heads=False)


def ragged_result(client, seed=50, **extra):
    keys, values = random_layer(heads=4, tokens=160, key_dim=16, value_dim=12, seed=seed)
    result = client.compress(keys, values, passthrough_heads=[2], return_assignment=True,
                             **FLOOR, **extra)
    assert len(set(result.head_entries.tolist())) > 1, result.head_entries  # ragged
    return result


def test_the_account_says_what_each_head_got(client):
    keys, values = random_layer(heads=4, tokens=160, seed=51)
    result = client.compress(keys, values, passthrough_heads=[2], **FLOOR)
    t = int(np.ceil(0.25 * 160))
    assert result.target_tokens == t
    entries = np.diff(result.offsets)
    np.testing.assert_array_equal(result.head_entries, entries)  # no padding asked
    np.testing.assert_array_equal(result.head_input_tokens, [160] * 4)
    np.testing.assert_array_equal(result.head_tokens, [160] * 4)
    assert result.stop_reasons[2] == "passthrough" and result.head_entries[2] == 160
    missed = [h for h in (0, 1, 3) if entries[h] > t]
    assert missed, "the floor should stop some head above t"
    assert result.missed_heads == missed and not result.target_reached
    for h in missed:
        assert result.stop_reasons[h] == "similarity_floor"
    reached = client.compress(keys, values, target_tokens=t, chunk_size=16, sink_tokens=2,
                              recent_tokens=4)
    assert reached.target_reached and reached.missed_heads == []
    assert set(reached.stop_reasons) == {"target_reached"}


def _by_hand(client, result, **params):
    """Each head of `result` compressed alone as a regular [1, n_h] job with its counts:
    what the ragged second round must equal (heads are independent without uniform_heads)."""
    heads = []
    for h in range(result.num_heads):
        head = result.head(h)
        heads.append(client.compress(head.keys[None], head.values[None], head.counts[None],
                                     return_assignment=True, **params))
    return heads


@pytest.mark.parametrize("form", ["result", "offsets", "head_tokens"])
def test_a_ragged_result_goes_back_as_it_is(client, form):
    first = ragged_result(client)
    second_params = dict(target_tokens=12, chunk_size=16, sink_tokens=2, recent_tokens=4,
                         uniform_heads=False)
    if form == "result":
        second = client.compress(first, return_assignment=True, **second_params)
    elif form == "offsets":
        second = client.compress(first.keys, first.values, first.counts, offsets=first.offsets,
                                 return_assignment=True, **second_params)
    else:
        second = client.compress(first.keys, first.values, first.counts,
                                 head_tokens=np.diff(first.offsets), return_assignment=True,
                                 **second_params)
    np.testing.assert_array_equal(second.head_tokens, first.head_entries)
    np.testing.assert_array_equal(second.head_input_tokens, [160] * 4)
    assert second.assignment.shape == (int(first.offsets[-1]),)  # [sum] for ragged input
    for h, alone in enumerate(_by_hand(client, first, **second_params)):
        got = second.head(h)
        np.testing.assert_array_equal(got.counts, alone.counts)
        np.testing.assert_array_equal(got.keys, alone.keys)
        np.testing.assert_array_equal(got.values, alone.values)
        lo, hi = int(first.offsets[h]), int(first.offsets[h + 1])
        np.testing.assert_array_equal(second.assignment[lo:hi], alone.assignment[0])
        assert int(got.counts.sum()) == 160


def test_bad_ragged_input_names_the_argument(client):
    keys, values = random_layer(heads=1, tokens=30, seed=56)
    k, v = keys[0], values[0]  # [30, d]
    cases = [(dict(head_tokens=[10, 10]), "head_tokens"), (dict(offsets=[0, 10, 20]), "offsets"),
             (dict(offsets=[0, 20, 10, 30]), "offsets"),
             (dict(head_tokens=[10, 20], offsets=[0, 10, 30]), "offsets"),
             (dict(head_tokens=[10, 20], layout="token_major"), "layout")]
    for options, argument in cases:
        with pytest.raises(centroidkv.InvalidArgumentError) as caught:
            client.compress(k, v, **options)
        assert caught.value.argument == argument, (options, caught.value)
    with pytest.raises(centroidkv.InvalidArgumentError) as caught:  # the server's check
        client.compress(k, v, head_tokens=[0, 30])
    assert caught.value.field == "start_job.head_tokens" and caught.value.head == 0
    with pytest.raises(centroidkv.InvalidArgumentError) as caught:
        client.compress(keys, values, head_tokens=[30])  # 3-D keys with head_tokens
    assert caught.value.argument == "keys"


@requires_torch
def test_a_torch_result_goes_back_as_it_is(client):
    keys, values = random_layer(heads=3, tokens=128, seed=52)
    tk, tv = torch.from_numpy(keys).half(), torch.from_numpy(values).half()
    first = client.compress(tk, tv, passthrough_heads=[0], **FLOOR)
    second = client.compress(first, target_tokens=10, uniform_heads=False, chunk_size=16,
                             sink_tokens=2, recent_tokens=4)
    assert isinstance(second.keys, torch.Tensor) and second.keys.dtype == torch.float16
    np.testing.assert_array_equal(second.head_input_tokens, [128] * 3)
    assert second.head_entries.tolist()[1:] == [10, 10]


def test_pad_heads_gives_equal_lengths_with_count_0_rows(client):
    first = ragged_result(client, seed=53)
    padded = ragged_result(client, seed=53, pad_heads=True)
    length = int(first.head_entries.max())
    assert padded.padded_length == length
    np.testing.assert_array_equal(padded.offsets, np.arange(5) * length)
    np.testing.assert_array_equal(padded.head_entries, first.head_entries)
    for h in range(4):
        real, pad = first.head(h), padded.head(h)
        n = len(real.counts)
        np.testing.assert_array_equal(pad.keys[:n], real.keys)
        np.testing.assert_array_equal(pad.values[:n], real.values)
        np.testing.assert_array_equal(pad.counts[:n], real.counts)
        assert np.all(pad.counts[n:] == 0) and np.all(pad.keys[n:] == 0)
        assert np.all(pad.values[n:] == 0)
    # A padded result goes back as a regular [H, L] job: the count-0 rows are ignored.
    params = dict(target_tokens=12, chunk_size=16, sink_tokens=2, recent_tokens=4,
                  uniform_heads=False)
    regular = client.compress(padded.keys.reshape(4, length, -1),
                              padded.values.reshape(4, length, -1),
                              padded.counts.reshape(4, length), return_assignment=True, **params)
    ragged = client.compress(first, **params)
    np.testing.assert_array_equal(regular.counts, ragged.counts)
    np.testing.assert_array_equal(regular.keys, ragged.keys)
    assert np.all(regular.assignment.reshape(4, length)[padded.counts.reshape(4, length) == 0]
                  == -1)


def test_pad_to_gives_every_layer_one_length(client):
    layers = [random_layer(heads=3, tokens=100 + 20 * i, seed=60 + i) for i in range(4)]
    results = client.compress_layers(layers, pad_to=64, target_tokens=24, chunk_size=16,
                                     sink_tokens=2, recent_tokens=4, min_similarity=0.1,
                                     uniform_heads=False)
    for r in results:
        assert r.padded_length == 64 and r.total_entries == 3 * 64
        np.testing.assert_array_equal(np.diff(r.offsets), [64] * 3)
    with pytest.raises(centroidkv.FailedPreconditionError) as caught:
        client.compress(*layers[0], pad_to=8, target_tokens=24)
    assert caught.value.field == "start_job.pad_to" and caught.value.argument == "pad_to"
    assert caught.value.head is not None


def test_exact_target_hits_t_on_every_head_despite_the_floor(client):
    keys, values = random_layer(heads=4, tokens=160, seed=54)
    loose = client.compress(keys, values, **FLOOR)
    assert loose.missed_heads
    exact = client.compress(keys, values, exact_target=True, **FLOOR)
    t = exact.target_tokens
    np.testing.assert_array_equal(exact.head_entries, [t] * 4)
    np.testing.assert_array_equal(np.diff(exact.offsets), [t] * 4)
    assert exact.target_reached and exact.missed_heads == []
    np.testing.assert_array_equal(exact.head_input_tokens, [160] * 4)


def test_token_major_output_is_the_transposed_padded_output(client):
    keys, values = random_layer(heads=4, tokens=160, seed=55)
    padded = client.compress(keys, values, pad_heads=True, **FLOOR)
    tm = client.compress(keys, values, output_layout="token_major", **FLOOR)
    length, heads = padded.padded_length, 4
    assert tm.layout == "token_major" and tm.padded_length == length
    assert tm.keys.shape == (length, heads, 16) and tm.counts.shape == (length, heads)
    np.testing.assert_array_equal(tm.keys, padded.keys.reshape(heads, length, 16).transpose(1, 0, 2))
    np.testing.assert_array_equal(tm.values,
                                  padded.values.reshape(heads, length, 12).transpose(1, 0, 2))
    np.testing.assert_array_equal(tm.counts, padded.counts.reshape(heads, length).T)
    np.testing.assert_array_equal(tm.head(1).counts, padded.head(1).counts)
    # Sent back as it is (token-major input with count-0 padding), as the padded one.
    params = dict(target_tokens=10, chunk_size=16, sink_tokens=2, recent_tokens=4,
                  uniform_heads=False)
    a, b = client.compress(tm, **params), client.compress(padded, **params)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.keys, b.keys)


def _bad_layers():
    """8 layers; layer 3 holds a NaN at head 1, token 5, layer 5 names passthrough head 9."""
    layers = [dict(zip(("keys", "values"), random_layer(seed=70 + i))) for i in range(8)]
    layers[3]["keys"][1, 5, 3] = np.nan
    layers[5]["passthrough_heads"] = [9]
    return layers


SMALL = dict(target_ratio=0.3, chunk_size=8, sink_tokens=2, recent_tokens=4)


def _check_bad_layers(client, results, layers):
    nan, head = results[3], results[5]
    assert isinstance(nan, centroidkv.InvalidArgumentError)
    assert (nan.field, nan.argument, nan.head, nan.token, nan.layer) == ("keys", "keys", 1, 5, 3)
    assert isinstance(head, centroidkv.InvalidArgumentError)
    assert head.field == "start_job.params.passthrough_heads" and head.layer == 5
    assert head.argument == "passthrough_heads"
    for i in (0, 1, 2, 4, 6, 7):
        alone = client.compress(layers[i]["keys"], layers[i]["values"], **SMALL)
        assert results[i].layer_index == i
        np.testing.assert_array_equal(results[i].keys, alone.keys)
        np.testing.assert_array_equal(results[i].counts, alone.counts)


def test_a_jobs_error_leaves_the_other_layers_alone(client):
    layers = _bad_layers()
    with pytest.raises(centroidkv.InvalidArgumentError) as caught:
        client.compress_layers(layers, **SMALL)
    assert caught.value.layer in (3, 5)
    results = client.compress_layers(layers, return_exceptions=True, **SMALL)
    _check_bad_layers(client, results, layers)
    streamed = list(client.iter_compress_layers(layers, return_exceptions=True, **SMALL))
    assert sorted(r.layer if isinstance(r, Exception) else r.layer_index
                  for r in streamed) == list(range(8))


def test_async_client_returns_exceptions_too(server, client):
    import asyncio

    layers = _bad_layers()

    async def main():
        async with centroidkv.AsyncClient(server.target) as aclient:
            results = await aclient.compress_layers(layers, return_exceptions=True, **SMALL)
            streamed = [r async for r in aclient.stream_layers(layers, return_exceptions=True,
                                                                 **SMALL)]
            with pytest.raises(centroidkv.InvalidArgumentError):
                await aclient.compress_layers(layers, **SMALL)
            return results, streamed

    results, streamed = asyncio.run(main())
    _check_bad_layers(client, results, layers)
    assert len(streamed) == 8


@pytest.fixture(scope="module")
def one_thread_server():
    """One clustering thread: jobs queue behind a slow one."""
    with tempfile.TemporaryDirectory(prefix="ckv-py-queue-") as folder:
        process = ServerProcess(f"unix://{folder}/ckv.sock", threads=1, metrics=True)
        yield process
        process.stop()


@contextlib.contextmanager
def slow_job_computing(server):
    """Runs a job of about a second (reference backend) on its own stream and returns once
    the server has taken it (its input complete: centroidkv_jobs_total went up), so that
    the only clustering thread is busy while the caller queues other jobs."""
    keys, values = random_layer(heads=8, tokens=4096, key_dim=64, value_dim=64, seed=90)
    before = metric_value(server.metrics(), "centroidkv_jobs_total")
    outcome = []
    with centroidkv.Client(server.target, timeout=120) as slow:
        worker = threading.Thread(target=lambda: outcome.append(slow.compress(
            keys, values, backend="reference", target_ratio=0.1, chunk_size=512)))
        worker.start()
        deadline = time.monotonic() + 60
        while metric_value(server.metrics(), "centroidkv_jobs_total") <= before:
            assert time.monotonic() < deadline and worker.is_alive(), outcome
            time.sleep(0.005)
        yield
        worker.join()
    assert len(outcome) == 1 and outcome[0].total_entries > 0


def test_an_expired_job_is_dropped_while_the_others_complete(one_thread_server):
    quick = [dict(zip(("keys", "values"), random_layer(seed=80 + i))) for i in range(3)]
    with centroidkv.Client(one_thread_server.target, timeout=120) as c:
        with slow_job_computing(one_thread_server):
            results = c.compress_layers([{**quick[0], "timeout": 0.1}, quick[1], quick[2]],
                                        return_exceptions=True, **SMALL)
        for r in results[1:]:
            assert isinstance(r, centroidkv.LayerResult), r
        late = results[0]
        assert isinstance(late, centroidkv.DeadlineExceededError), late
        assert late.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert late.field == "start_job.timeout_ms" and late.argument == "timeout"
        assert late.layer == 0
        # Enough time: the same job completes.
        assert c.compress(quick[0]["keys"], quick[0]["values"], timeout=60,
                          **SMALL).total_entries > 0


def test_priorities_reorder_the_queue(one_thread_server):
    # The jobs queue behind the slow one; each takes ~50 ms itself (reference backend), so
    # the order in which they were started shows in their queue times: highest priority
    # first, equal priorities in arrival order. (Not the order results arrive in: replies
    # of different jobs may interleave on the stream.)
    def queued(seed, priority):
        keys, values = random_layer(heads=4, tokens=2048, key_dim=32, value_dim=32, seed=seed)
        return dict(keys=keys, values=values, priority=priority)

    layers = [queued(91 + i, p) for i, p in enumerate([0, 0, 5, 9])]
    with centroidkv.Client(one_thread_server.target, timeout=120) as c:
        with slow_job_computing(one_thread_server):
            results = c.compress_layers(layers, backend="reference", target_ratio=0.25,
                                        chunk_size=256)
    started = sorted(range(4), key=lambda i: results[i].queue_seconds)
    assert started == [3, 2, 0, 1], [(r.layer_index, r.queue_seconds, r.compute_seconds)
                                     for r in results]


@pytest.fixture(scope="module")
def small_slab_server():
    with tempfile.TemporaryDirectory(prefix="ckv-py-slab-") as folder:
        process = ServerProcess(f"unix://{folder}/ckv.sock", extra_args=[
            "--max-slab-bytes", "65536"])
        yield process
        process.stop()


def test_an_oversized_slab_setting_is_clamped_to_the_servers_limit(small_slab_server, client):
    keys, values = random_layer(heads=8, tokens=1024, key_dim=64, value_dim=64, seed=95)
    with centroidkv.Client(small_slab_server.target, slab_bytes=1 << 30) as big:
        assert big.info().limits.max_slab_bytes == 65536
        assert big.slab_bytes == 65536
        result = big.compress(keys, values, **SMALL)  # 2 MiB tensors: 32 slabs each
    expected = client.compress(keys, values, **SMALL)
    np.testing.assert_array_equal(result.keys, expected.keys)
    np.testing.assert_array_equal(result.counts, expected.counts)
