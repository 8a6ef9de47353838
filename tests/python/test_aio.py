"""centroidkv.AsyncClient (grpc.aio) against a real server: the same results as Client, and
cancellation of an awaiting task dropping the job on the server, visible in /metrics."""
from __future__ import annotations

import asyncio
import tempfile
import time

import numpy as np
import pytest

import centroidkv
from server_process import ServerProcess, metric_value
from test_client import SMALL, random_layer


def run(coro):
    return asyncio.run(coro)


def test_compress_matches_the_sync_client(server, client):
    keys, values = random_layer(seed=31)
    expected = client.compress(keys, values, return_assignment=True, **SMALL)

    async def main():
        async with centroidkv.AsyncClient(server.target) as aclient:
            info = await aclient.info()
            result = await aclient.compress(keys, values, return_assignment=True, **SMALL)
            return info, result

    info, result = run(main())
    assert info.version == client.info().version
    np.testing.assert_array_equal(result.keys, expected.keys)
    np.testing.assert_array_equal(result.counts, expected.counts)
    np.testing.assert_array_equal(result.assignment, expected.assignment)


def test_compress_layers_and_stream_layers(server):
    layers = [random_layer(heads=2, tokens=80 + 3 * i, seed=40 + i) for i in range(12)]

    async def main():
        async with centroidkv.AsyncClient(server.target) as aclient:
            ordered = await aclient.compress_layers(layers, **SMALL)
            streamed = [r async for r in aclient.stream_layers(layers, **SMALL)]
            # Several calls at once on one channel.
            together = await asyncio.gather(*(aclient.compress(k, v, layer_index=i, **SMALL)
                                              for i, (k, v) in enumerate(layers)))
            return ordered, streamed, together

    ordered, streamed, together = run(main())
    assert [r.layer_index for r in ordered] == list(range(12))
    assert sorted(r.layer_index for r in streamed) == list(range(12))
    for a, b in zip(ordered, together):
        np.testing.assert_array_equal(a.keys, b.keys)
        assert a.layer_index == b.layer_index
    by_layer = {r.layer_index: r for r in streamed}
    for i, r in enumerate(ordered):
        np.testing.assert_array_equal(r.counts, by_layer[i].counts)


def test_errors_raise_compress_error(server):
    keys, values = random_layer(seed=32)

    async def main():
        async with centroidkv.AsyncClient(server.target) as aclient:
            with pytest.raises(centroidkv.InvalidArgumentError) as caught:
                await aclient.compress(keys, values, chunk_size=1)
            assert caught.value.argument == "chunk_size"
            assert caught.value.field == "start_job.params.chunk_size"
            return await aclient.compress(keys, values, **SMALL)  # the channel still works

    assert run(main()).total_entries > 0


@pytest.fixture(scope="module")
def metrics_server():
    with tempfile.TemporaryDirectory(prefix="ckv-py-aio-") as folder:
        process = ServerProcess(f"unix://{folder}/ckv.sock", metrics=True, threads=1)
        yield process
        process.stop()


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_cancelling_the_task_drops_the_job_on_the_server(metrics_server):
    # The reference backend on a large layer: seconds of work, so it is still computing
    # when the task is cancelled.
    rng = np.random.default_rng(33)
    keys = rng.standard_normal((8, 8192, 64)).astype(np.float32)
    values = rng.standard_normal((8, 8192, 64)).astype(np.float32)
    before = metrics_server.metrics()
    entries_before = metric_value(before, "centroidkv_entries_total")
    cancelled_streams = metric_value(before, "centroidkv_errors_total", scope="stream")

    async def main():
        async with centroidkv.AsyncClient(metrics_server.target) as aclient:
            task = asyncio.ensure_future(aclient.compress(keys, values, backend="reference",
                                                          target_ratio=0.1, chunk_size=512))
            loop = asyncio.get_running_loop()
            computing = await loop.run_in_executor(None, lambda: _wait_for(
                lambda: metric_value(metrics_server.metrics(), "centroidkv_jobs_in_flight") >= 1))
            assert computing, metrics_server.metrics()
            assert metric_value(metrics_server.metrics(), "centroidkv_buffered_bytes") > 0
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    started = time.monotonic()
    run(main())
    freed = _wait_for(lambda: metric_value(metrics_server.metrics(),
                                           "centroidkv_buffered_bytes") == 0 and
                      metric_value(metrics_server.metrics(), "centroidkv_jobs_in_flight") == 0 and
                      metric_value(metrics_server.metrics(), "centroidkv_streams_open") == 0)
    after = metrics_server.metrics()
    assert freed, after
    print(f"job dropped and freed {time.monotonic() - started:.2f} s after the call started")
    # Dropped, not finished: no result rows were sent; and the stream ended by the
    # client's CancelJob + half-close, not by an RPC cancellation or error.
    assert metric_value(after, "centroidkv_entries_total") == entries_before
    assert metric_value(after, "centroidkv_errors_total", scope="stream") == cancelled_streams
