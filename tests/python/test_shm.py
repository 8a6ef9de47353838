"""Shared memory from Python (centroidkv.shm) against a real server on a unix
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


@pytest.mark.parametrize("output_dtype,options", [
    ("float16", {}),
    ("float32", {"return_assignment": True}),
    ("bfloat16", {"backend": "reference"}),       # rows copied into the space by the server
    ("float16", {"pad_heads": True}),             # reshaped above the engine: copied too
])
def test_result_space_receives_the_result_in_place(client, output_dtype, options):
    case = load_golden("d128_fp16")
    params = dict(case["config"], output_dtype=output_dtype, **options)
    slabs = client.compress(case["keys"], case["values"], **params)
    heads, tokens, key_dim = case["keys"].shape
    value_dim = case["values"].shape[-1]
    with client.shared_region(4 * (case["keys"].nbytes + case["values"].nbytes) + 65536) as region:
        keys = region.array(case["keys"].shape, np.float16)
        values = region.array(case["values"].shape, np.float16)
        keys[:] = case["keys"]
        values[:] = case["values"]
        out = region.result_space(heads, tokens, key_dim, value_dim, output_dtype,
                                  return_assignment=bool(options.get("return_assignment")))
        for _ in range(2):  # the space reused by a second job
            shm = client.compress(keys, values, region=region, output=out, **params)
            _assert_same(slabs, shm)
            # The result's arrays are the space's memory: no result slab was sent.
            assert np.shares_memory(shm.counts, out.counts)
            if output_dtype != "bfloat16":  # numpy widens bf16 rows (without ml_dtypes)
                assert np.shares_memory(shm.keys, out.keys)
        # Slabs in, the result into the space: the output needs no input region.
        mixed = client.compress(case["keys"], case["values"], output=out, **params)
        _assert_same(slabs, mixed)


def test_result_space_too_small_or_shared_is_refused(client):
    case = load_golden("small_basic")
    heads, tokens, key_dim = case["keys"].shape
    value_dim = case["values"].shape[-1]
    dtype = case["keys"].dtype
    with client.shared_region(1 << 20) as region:
        small = region.result_space(heads, tokens - 1, key_dim, value_dim, dtype)
        with pytest.raises(centroidkv.InvalidArgumentError) as error:
            client.compress(case["keys"], case["values"], output=small, **case["config"])
        assert error.value.field == "output" and "needs" in str(error.value)
        space = region.result_space(heads, tokens, key_dim, value_dim, dtype)
        with pytest.raises(centroidkv.InvalidArgumentError) as error:
            client.compress(case["keys"], case["values"], output=space, return_assignment=True,
                            **case["config"])
        assert error.value.field == "output" and "assignment" in str(error.value)
        layer = {"keys": case["keys"], "values": case["values"], "output": space}
        with pytest.raises(centroidkv.InvalidArgumentError) as error:
            client.compress_layers([layer, layer], **case["config"])
        assert error.value.field == "output"
        # The space still works for one job at a time.
        one = client.compress(case["keys"], case["values"], output=space, **case["config"])
        _assert_same(client.compress(case["keys"], case["values"], **case["config"]), one)


def test_async_client_result_space(server, client):
    case = load_golden("d128_fp16")
    slabs = client.compress(case["keys"], case["values"], **case["config"])
    heads, tokens, key_dim = case["keys"].shape

    async def main():
        async with centroidkv.AsyncClient(server.target) as aclient:
            async with await aclient.shared_region(4 * case["keys"].nbytes + 65536) as region:
                out = region.result_space(heads, tokens, key_dim, case["values"].shape[-1],
                                          case["keys"].dtype)
                result = await aclient.compress(case["keys"], case["values"], output=out,
                                                **case["config"])
                assert np.shares_memory(result.keys, out.keys)
                return result

    _assert_same(slabs, asyncio.run(main()))


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
