"""centroidkv.Client against a real centroidkv-server: info, every golden case, numpy and
torch inputs in fp32/fp16/bf16 and both layouts, compress_layers, and bad inputs."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

import centroidkv
from conftest import GOLDEN_CASES, load_golden, requires_torch, torch


def random_layer(heads=4, tokens=96, key_dim=16, value_dim=12, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((heads, tokens, key_dim)).astype(np.float32)
    values = rng.standard_normal((heads, tokens, value_dim)).astype(np.float32)
    return keys, values


SMALL = dict(target_ratio=0.3, chunk_size=8, sink_tokens=2, recent_tokens=4)


def test_info_reports_backends_limits_and_defaults(client):
    info = client.info()
    assert info.version
    assert "cpu" in info.backends and "reference" in info.backends
    assert info.limits.max_message_bytes >= 1 << 16
    assert info.limits.max_tokens > 0 and info.limits.max_job_bytes > 0
    assert info.defaults["chunk_size"] == 256 and info.defaults["target_ratio"] == 0.25
    assert info.worker_threads >= 1
    assert client.slab_bytes <= info.limits.max_slab_bytes
    assert info.limits.max_chunk_size == 4096  # the server's default --max-chunk-size


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_case(client, name, backend):
    case = load_golden(name)
    counts = case["counts"] if not np.all(case["counts"] == 1) else None
    result = client.compress(case["keys"], case["values"], counts, output_dtype="float32",
                             return_assignment=True, backend=backend, **case["config"])
    np.testing.assert_array_equal(result.offsets, case["out_offsets"])
    np.testing.assert_array_equal(result.counts, case["out_counts"])
    np.testing.assert_array_equal(result.assignment, case["assignment"])
    assert result.counts.dtype == np.uint32 and result.offsets.dtype == np.int64
    assert result.keys.dtype == np.float32
    np.testing.assert_allclose(result.keys, case["out_keys"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.values, case["out_values"], rtol=1e-5, atol=1e-7)
    assert result.num_heads == case["keys"].shape[0]
    assert result.num_tokens == case["keys"].shape[1]
    assert result.backend == ("reference" if backend == "reference" else client.info().default_backend)
    assert result.passes_run >= 1 and result.compute_seconds >= 0
    h = result.num_heads - 1
    head = result.head(h)
    lo, hi = case["out_offsets"][h], case["out_offsets"][h + 1]
    np.testing.assert_array_equal(head.counts, case["out_counts"][lo:hi])


def test_golden_counts_sent_explicitly_equal_the_default(client):
    case = load_golden("small_basic")
    ones = np.ones(case["keys"].shape[:2], np.uint32)
    a = client.compress(case["keys"], case["values"], ones, **case["config"])
    b = client.compress(case["keys"], case["values"], **case["config"])
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.counts, b.counts)


def _as_kind(array: np.ndarray, kind: str, dtype: str):
    if kind == "numpy":
        return array.astype(dtype)
    return torch.from_numpy(array).to(getattr(torch, dtype))


def _rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` rounded to `dtype` and back to float32 (numpy has no bfloat16: torch does it)."""
    if dtype == "bfloat16":
        return torch.from_numpy(array).to(torch.bfloat16).float().numpy()
    return array.astype(dtype).astype(np.float32)


def _fp32_reference(client, keys, values, dtype, **params):
    """The same job with the input rounded to `dtype` first and sent as float32, results
    rounded to `dtype` by the server: what a `dtype` job must return."""
    rounded_k, rounded_v = _rounded(keys, dtype), _rounded(values, dtype)
    return client.compress(rounded_k, rounded_v, output_dtype=dtype, return_assignment=True,
                           **params)


def _to_numpy(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    return x


@pytest.mark.parametrize("layout", ["head_major", "token_major"])
@pytest.mark.parametrize("kind,dtype", [("numpy", "float32"), ("numpy", "float16")] + [
    pytest.param("torch", d, marks=requires_torch) for d in ("float32", "float16", "bfloat16")])
def test_inputs_come_back_in_the_callers_kind(client, kind, dtype, layout):
    keys, values = random_layer(seed=3)
    expected = _fp32_reference(client, keys, values, dtype, **SMALL)
    k, v = _as_kind(keys, kind, dtype), _as_kind(values, kind, dtype)
    if layout == "token_major":
        k, v = k.transpose(1, 0, 2) if kind == "numpy" else k.transpose(0, 1), \
            v.transpose(1, 0, 2) if kind == "numpy" else v.transpose(0, 1)
    result = client.compress(k, v, layout=layout, return_assignment=True, **SMALL)
    if kind == "torch":
        assert isinstance(result.keys, torch.Tensor) and result.keys.dtype == getattr(torch, dtype)
        assert isinstance(result.counts, torch.Tensor) and result.counts.dtype == torch.int64
        assert result.assignment.dtype == torch.int64
    else:
        assert isinstance(result.keys, np.ndarray) and result.keys.dtype == np.dtype(dtype)
    assert tuple(result.keys.shape) == (expected.total_entries, 16)
    assert tuple(result.values.shape) == (expected.total_entries, 12)
    np.testing.assert_array_equal(_to_numpy(result.offsets), expected.offsets)
    np.testing.assert_array_equal(_to_numpy(result.counts), expected.counts)
    np.testing.assert_array_equal(_to_numpy(result.assignment), expected.assignment)
    exp_k = _to_numpy(expected.keys) if dtype != "bfloat16" else expected.keys
    np.testing.assert_array_equal(_to_numpy(result.keys), exp_k)
    np.testing.assert_array_equal(_to_numpy(result.values),
                                  _to_numpy(expected.values) if dtype != "bfloat16" else expected.values)


@requires_torch
def test_output_dtype_is_honoured(client):
    keys, values = random_layer(seed=4)
    full = client.compress(keys, values, **SMALL)
    half = client.compress(keys, values, output_dtype="float16", **SMALL)
    bf = client.compress(torch.from_numpy(keys), torch.from_numpy(values),
                         output_dtype=torch.bfloat16, **SMALL)
    assert half.keys.dtype == np.float16 and bf.keys.dtype == torch.bfloat16
    np.testing.assert_array_equal(half.keys, full.keys.astype(np.float16))
    torch.testing.assert_close(bf.keys, torch.from_numpy(full.keys).to(torch.bfloat16),
                               rtol=0, atol=0)


def test_non_contiguous_inputs_are_sent_correctly(client):
    keys, values = random_layer(seed=5)
    wide_k = np.concatenate([keys, keys], axis=2)[:, :, ::2]  # a strided view
    assert not wide_k.flags.c_contiguous
    a = client.compress(wide_k, values, **SMALL)
    b = client.compress(np.ascontiguousarray(wide_k), values, **SMALL)
    np.testing.assert_array_equal(a.keys, b.keys)


def test_every_spec_parameter_reaches_the_server(client):
    keys, values = random_layer(heads=3, tokens=120, seed=6)
    base = client.compress(keys, values, **SMALL)
    variants = [dict(target_tokens=10), dict(chunk_size=16), dict(sink_tokens=0),
                dict(recent_tokens=0), dict(min_similarity=0.5), dict(tighten_per_pass=0.2,
                                                                      min_similarity=0.0),
                dict(max_passes=1), dict(uniform_heads=False, min_similarity=0.2),
                dict(passthrough_heads=[1])]
    for change in variants:
        params = {**SMALL, **change}
        if "target_tokens" in change:
            params.pop("target_ratio")
        result = client.compress(keys, values, **params)
        assert (result.offsets.tolist() != base.offsets.tolist() or
                not np.array_equal(result.counts, base.counts) or
                result.passes_run != base.passes_run), f"{change} changed nothing"
    assert client.compress(keys, values, target_tokens=10, sink_tokens=0,
                           recent_tokens=0).offsets.tolist() == [0, 10, 20, 30]
    passthrough = client.compress(keys, values, passthrough_heads=[1], **SMALL)
    h1 = passthrough.head(1)
    np.testing.assert_array_equal(h1.keys, keys[1])
    assert np.all(h1.counts == 1)


def test_compress_layers_returns_32_layers_in_order(client):
    layers = [random_layer(heads=2, tokens=64 + i, seed=100 + i) for i in range(32)]
    results = client.compress_layers(layers, return_assignment=True, **SMALL)
    assert [r.layer_index for r in results] == list(range(32))
    for (keys, values), result in zip(layers, results):
        alone = client.compress(keys, values, return_assignment=True, **SMALL)
        assert result.num_tokens == keys.shape[1]
        np.testing.assert_array_equal(result.keys, alone.keys)
        np.testing.assert_array_equal(result.assignment, alone.assignment)


def test_iter_compress_layers_yields_each_layer_once(client):
    layers = [random_layer(heads=2, tokens=200, seed=200 + i) for i in range(6)]
    seen = [r.layer_index for r in client.iter_compress_layers(layers, **SMALL)]
    assert sorted(seen) == list(range(6))


def test_small_slabs_split_tensors_across_many_messages(server, client):
    # 1000-byte slabs (not a multiple of a row): every tensor crosses many slabs.
    keys, values = random_layer(seed=11)
    counts = np.random.default_rng(11).integers(1, 5, keys.shape[:2]).astype(np.uint32)
    with centroidkv.Client(server.target, slab_bytes=1000) as small:
        assert small.slab_bytes == 1000
        a = small.compress(keys, values, counts, return_assignment=True, **SMALL)
    b = client.compress(keys, values, counts, return_assignment=True, **SMALL)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.assignment, b.assignment)


def test_no_server_says_why_the_connection_failed():
    with centroidkv.Client("127.0.0.1:1", connect_timeout=0.5) as nowhere:
        with pytest.raises(centroidkv.UnavailableError) as caught:
            nowhere.info()
    assert "no connection within 0.5 s: failed to connect" in caught.value.message


def test_slab_size_is_capped_by_the_servers_slab_limit(server):
    with centroidkv.Client(server.target, slab_bytes=1 << 30) as big:
        limits = big.info().limits
        assert 0 < limits.max_slab_bytes < limits.max_message_bytes
        assert big.slab_bytes == limits.max_slab_bytes


def _expect_error(call, error_type, code, argument):
    """The call raises error_type with `code`, naming the compress() keyword `argument`
    (and its wire field, as the server spells it, in .field)."""
    with pytest.raises(error_type) as caught:
        call()
    assert isinstance(caught.value, centroidkv.CompressError)
    assert caught.value.code == code, caught.value
    assert caught.value.argument == argument, caught.value
    assert caught.value.field.split(".")[-1] in (argument, "dtype"), caught.value
    return caught.value


IA = (centroidkv.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT)


@pytest.mark.parametrize("params,field", [
    (dict(chunk_size=1), "chunk_size"), (dict(target_ratio=1.5), "target_ratio"),
    (dict(target_ratio=0.0), "target_ratio"), (dict(min_similarity=2.0), "min_similarity"),
    (dict(max_passes=0), "max_passes"), (dict(passthrough_heads=[9]), "passthrough_heads"),
    (dict(tighten_per_pass=-1.0), "tighten_per_pass"),
    (dict(target_ratio=0.5, target_tokens=3), "target_ratio"),
    (dict(chunk_size=-4), "chunk_size"), (dict(layout="sideways"), "layout"),
    (dict(backend="tpu"), "backend"), (dict(output_dtype="int8"), "output_dtype")])
def test_bad_parameters_raise_naming_the_field(client, params, field):
    keys, values = random_layer(seed=7)
    _expect_error(lambda: client.compress(keys, values, **params), *IA, field)
    assert client.compress(keys, values, **SMALL).total_entries > 0  # still serving


def test_bad_arrays_raise_naming_the_field(client):
    keys, values = random_layer(seed=8)
    _expect_error(lambda: client.compress(keys[0], values), *IA, "keys")
    _expect_error(lambda: client.compress(keys.astype(np.float64), values), *IA, "keys")
    _expect_error(lambda: client.compress(keys, values[:, :10]), *IA, "values")
    _expect_error(lambda: client.compress(keys, values.astype(np.float16)), *IA, "values")
    _expect_error(lambda: client.compress(keys, values, np.ones((4, 3), np.uint32)), *IA,
                  "counts")
    _expect_error(lambda: client.compress(keys, values, -np.ones((4, 96), np.int64)), *IA,
                  "counts")
    with pytest.raises(TypeError):
        client.compress(keys, values, chunk=4)


def test_bad_data_is_refused_by_the_server_for_that_job(client):
    keys, values = random_layer(seed=9)
    keys[1, 5, 3] = np.nan
    error = _expect_error(lambda: client.compress(keys, values, layer_index=7, **SMALL), *IA,
                          "keys")
    assert error.layer == 7 and error.job_id is not None
    keys[1, 5, 3] = 0.0
    zero = np.ones(keys.shape[:2], np.uint32)
    zero[0, 0] = 0
    _expect_error(lambda: client.compress(keys, values, zero, **SMALL), *IA, "counts")
    assert client.compress(keys, values, **SMALL).total_entries > 0


def test_a_gpu_job_on_a_server_without_one_fails_precondition(client):
    if any(b.startswith("cuda") for b in client.info().backends):
        pytest.skip("this server has a GPU")
    keys, values = random_layer(seed=10)
    error = _expect_error(lambda: client.compress(keys, values, backend="gpu"),
                          centroidkv.FailedPreconditionError,
                          grpc.StatusCode.FAILED_PRECONDITION, "backend")
    assert "gpu" in error.message.lower() or "cuda" in error.message.lower()


@requires_torch
def test_result_memory_is_recycled_only_once_every_array_is_gone(server):
    # 8 heads x 1024 kept rows x 64 x fp32 = 2 MiB per output tensor: pooled buffers.
    layers = [random_layer(heads=8, tokens=4096, key_dim=64, value_dim=64, seed=120 + i)
              for i in range(3)]
    params = dict(target_ratio=0.25, backend="identity")
    with centroidkv.Client(server.target, result_pool_bytes=64 << 20) as c:
        expected = [c.compress(k, v, **params).keys.copy() for k, v in layers]
        assert c.memory.kept_bytes >= 2 * (2 << 20)  # dropped results' memory, kept
        held = c.compress(*layers[0], **params)
        view = torch.from_numpy(held.keys)[3:]  # the only reference left
        del held
        kept = c.memory.kept_bytes
        others = [c.compress(*layers[i % 3], **params) for i in (1, 2, 1, 2)]
        np.testing.assert_array_equal(view.numpy(), expected[0][3:])  # never reused
        for r, i in zip(others, (1, 2, 1, 2)):
            np.testing.assert_array_equal(r.keys, expected[i])
        assert c.memory.kept_bytes < kept  # the new results took kept memory
        del view, others
        assert c.memory.kept_bytes > kept
        last = c.compress(*layers[2], **params)
    assert c.memory.kept_bytes == 0  # closing unmaps what was kept
    del last
    assert c.memory.kept_bytes == 0  # and keeps nothing after
    with centroidkv.Client(server.target, result_pool_bytes=0) as c:
        c.compress(*layers[0], **params)
        assert c.memory.kept_bytes == 0
