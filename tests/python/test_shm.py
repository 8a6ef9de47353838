"""Shared memory from Python (centroidkv.shm, issue 19) against a real server on a unix
socket: numpy arrays and torch tensors backed by a registered region go by reference and
give the slab path's result exactly; arrays outside the region are refused naming the
field; closing the region unregisters and removes its file; a TCP server refuses regions.
AsyncClient's regions (AsyncSharedRegion) the same way."""
from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import centroidkv
from conftest import GOLDEN_CASES, load_golden, requires_torch, torch
from server_process import ServerProcess


def _assert_same(a, b):
    for name in ("offsets", "keys", "values", "counts", "assignment"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_by_reference_equals_slabs(client, name):
    case = load_golden(name)
    assert client.info().shared_memory
    counts = case["counts"] if not np.all(case["counts"] == 1) else None
    options = dict(output_dtype="float32", return_assignment=True, backend="cpu",
                   **case["config"])
    slabs = client.compress(case["keys"], case["values"], counts, **options)
    size = case["keys"].nbytes + case["values"].nbytes + case["counts"].astype(np.uint32).nbytes
    with client.shared_region(size + 4096) as region:
        keys = region.array(case["keys"].shape, case["keys"].dtype)
        values = region.array(case["values"].shape, case["values"].dtype)
        keys[:] = case["keys"]
        values[:] = case["values"]
        region_counts = None
        if counts is not None:
            region_counts = region.array(counts.shape, np.uint32)
            region_counts[:] = counts
        shm = client.compress(keys, values, region_counts, region=region, **options)
    _assert_same(slabs, shm)
    assert not os.path.exists("/dev/shm" + region.name)


@requires_torch
def test_torch_tensors_backed_by_the_region(client):
    case = load_golden("d128_fp16")
    slabs = client.compress(case["keys"], case["values"], **case["config"])
    with client.shared_region(case["keys"].nbytes + case["values"].nbytes + 4096) as region:
        keys = torch.from_numpy(region.array(case["keys"].shape, np.float16))
        values = torch.from_numpy(region.array(case["values"].shape, np.float16))
        keys.copy_(torch.from_numpy(case["keys"]))
        values.copy_(torch.from_numpy(case["values"]))
        shm = client.compress(keys, values, region=region, **case["config"])
    assert isinstance(shm.keys, torch.Tensor)
    np.testing.assert_array_equal(shm.keys.numpy(), slabs.keys)
    np.testing.assert_array_equal(shm.counts.numpy(), slabs.counts)


def test_arrays_outside_the_region_are_refused(client):
    case = load_golden("small_basic")
    with client.shared_region(case["keys"].nbytes + 4096) as region:
        keys = region.array(case["keys"].shape, case["keys"].dtype)
        keys[:] = case["keys"]
        with pytest.raises(centroidkv.InvalidArgumentError) as error:
            client.compress(keys, case["values"], region=region, **case["config"])
        assert error.value.field == "values"


def test_async_client_by_reference_equals_slabs(server, client):
    case = load_golden("d128_fp16")
    slabs = client.compress(case["keys"], case["values"], **case["config"])

    async def main():
        async with centroidkv.AsyncClient(server.target) as aclient:
            assert (await aclient.info()).shared_memory
            size = case["keys"].nbytes + case["values"].nbytes + 4096
            async with await aclient.shared_region(size) as region:
                keys = region.array(case["keys"].shape, case["keys"].dtype)
                values = region.array(case["values"].shape, case["values"].dtype)
                keys[:] = case["keys"]
                values[:] = case["values"]
                registered = region.region_id
                result = await aclient.compress(keys, values, region=region, **case["config"])
                with pytest.raises(TypeError):
                    region.close()  # the async region closes with an await
            return region, registered, result

    region, region_id, shm = asyncio.run(main())
    assert region_id is not None and region.region_id is None
    _assert_same(slabs, shm)
    assert not os.path.exists("/dev/shm" + region.name)


def test_a_tcp_server_refuses_regions():
    process = ServerProcess("127.0.0.1:0")

    async def refused_async():
        async with centroidkv.AsyncClient(process.target, timeout=60) as aclient:
            with pytest.raises(centroidkv.FailedPreconditionError) as error:
                await aclient.shared_region(1 << 16)
            assert "unix socket" in str(error.value)

    try:
        with centroidkv.Client(process.target, timeout=60) as tcp:
            assert not tcp.info().shared_memory
            with pytest.raises(centroidkv.FailedPreconditionError) as error:
                tcp.shared_region(1 << 16)
            assert "unix socket" in str(error.value)
        asyncio.run(refused_async())
    finally:
        process.stop()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"ckv-py-{os.getpid()}-")]
