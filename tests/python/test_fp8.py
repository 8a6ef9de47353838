"""fp8 KV in and out through the Python client against a real server: the fp8 golden cases
(tests/data/golden_fp8) bit for bit over slabs and shared memory, on the reference and cpu
backends; torch float8 tensors in and out; narrowing equal to torch's own float8 cast
where that is defined (it turns overflow into NaN, the service saturates); the float view
of a result; and bad scales refused naming the field while the stream's other jobs finish."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import centroidkv
from conftest import requires_torch, torch

GOLDEN_FP8 = Path(__file__).resolve().parents[1] / "data" / "golden_fp8"
CASES = sorted(p.name for p in GOLDEN_FP8.iterdir() if (p / "case.json").exists())


def load_fp8(name: str) -> dict:
    folder = GOLDEN_FP8 / name
    case = {f.stem: np.load(folder / f.name) for f in folder.glob("*.npy")}
    case.update(json.loads((folder / "case.json").read_text()))
    return case


def fp8_options(case: dict) -> dict:
    options = dict(case["config"], input_dtype=case["dtype"], key_scale=case["key_scales"],
                   value_scale=case["value_scales"], output_dtype=case["output_dtype"],
                   return_assignment=True)
    if case["output_key_scales"]:
        options.update(output_key_scale=case["output_key_scales"],
                       output_value_scale=case["output_value_scales"])
    return options


def assert_golden(case: dict, result) -> None:
    assert result.dtype == case["output_dtype"]
    assert np.array_equal(np.asarray(result.keys).view(np.uint8), case["out_keys"])
    assert np.array_equal(np.asarray(result.values).view(np.uint8), case["out_values"])
    assert np.array_equal(result.key_scales, case["out_key_scales"])
    assert np.array_equal(result.value_scales, case["out_value_scales"])
    assert np.array_equal(result.counts, case["out_counts"])
    assert np.array_equal(result.offsets, case["out_offsets"])
    assert np.array_equal(result.assignment, case["assignment"])


def test_there_are_fp8_golden_cases():
    assert CASES, f"no fp8 golden cases under {GOLDEN_FP8}"


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("name", CASES)
def test_golden_fp8_over_slabs(client, name, backend):
    case = load_fp8(name)
    result = client.compress(case["keys"], case["values"], backend=backend, **fp8_options(case))
    assert_golden(case, result)


@pytest.mark.parametrize("name", CASES)
def test_golden_fp8_through_shared_memory(client, name):
    case = load_fp8(name)
    heads, tokens, key_dim = case["keys"].shape
    with client.shared_region(8 * case["keys"].nbytes + 65536) as region:
        keys = region.array(case["keys"].shape, np.uint8)
        values = region.array(case["values"].shape, np.uint8)
        keys[:], values[:] = case["keys"], case["values"]
        out = region.result_space(heads, tokens, key_dim, case["values"].shape[-1],
                                  case["output_dtype"], return_assignment=True)
        result = client.compress(keys, values, region=region, output=out, **fp8_options(case))
        assert np.shares_memory(result.keys, out.keys)  # written in place, no slab
        assert_golden(case, result)


def test_float_view_of_an_fp8_result(client):
    case = load_fp8(CASES[0])
    options = fp8_options(case)
    fp8 = client.compress(case["keys"], case["values"], **options)
    options.update(output_dtype="float32")
    del options["output_key_scale"], options["output_value_scale"]
    floats = client.compress(case["keys"], case["values"], **options)
    for wide, exact, scales in ((fp8.float_keys(), floats.keys, fp8.key_scales),
                                (fp8.float_values(), floats.values, fp8.value_scales)):
        # Within half an fp8 step of the exact row, except where a static scale saturates.
        limit = 448 * float(np.max(scales))
        inside = np.abs(exact) < limit
        assert np.all(np.abs(wide - exact)[inside] <= np.abs(exact)[inside] / 16 + scales.max() / 2**9)
        assert np.all(np.abs(wide[~inside]) == np.float32(limit))


@requires_torch
def test_padded_heads_widen_fp8_rows_with_their_scales(client):
    from centroidkv.torch import padded_heads

    case = load_fp8(CASES[0])
    result = client.compress(torch.from_numpy(case["keys"]).view(torch.float8_e4m3fn),
                             torch.from_numpy(case["values"]).view(torch.float8_e4m3fn),
                             **{k: v for k, v in fp8_options(case).items() if k != "input_dtype"})
    padded = padded_heads(result)
    for h in range(result.num_heads):
        lo, hi = int(result.offsets[h]), int(result.offsets[h + 1])
        assert np.array_equal(padded.keys[h, :hi - lo].numpy(), result.float_keys()[lo:hi])
        assert np.array_equal(padded.values[h, :hi - lo].numpy(), result.float_values()[lo:hi])


def test_a_result_goes_back_with_its_scales(client):
    case = load_fp8(CASES[0])
    first = client.compress(case["keys"], case["values"], **fp8_options(case))
    again = client.compress(first, target_ratio=0.5, chunk_size=16, sink_tokens=0,
                            recent_tokens=0, backend="reference")
    assert again.dtype == case["output_dtype"] and again.key_scales is not None
    assert int(again.counts.sum()) == int(first.counts.sum())


@requires_torch
@pytest.mark.parametrize("tdtype,name", [("float8_e4m3fn", "fp8_e4m3"),
                                         ("float8_e5m2", "fp8_e5m2")])
def test_torch_float8_in_and_out(client, tdtype, name):
    fp8 = getattr(torch, tdtype)
    g = torch.Generator().manual_seed(5)
    keys = (torch.randn(2, 96, 16, generator=g) * 3).to(fp8)
    values = torch.randn(2, 96, 8, generator=g).to(fp8)
    result = client.compress(keys, values, key_scale=0.5, value_scale=[0.25, 0.125],
                             target_ratio=0.5, chunk_size=32, sink_tokens=2, recent_tokens=4,
                             output_dtype=name)
    assert result.keys.dtype == fp8 and result.values.dtype == fp8
    assert result.key_scales.shape == (2,)
    # The same job on the widened floats gives the same centroids, narrowed alike.
    wide_k = keys.float() * 0.5
    wide_v = values.float() * torch.tensor([0.25, 0.125])[:, None, None]
    floats = client.compress(wide_k, wide_v, target_ratio=0.5, chunk_size=32, sink_tokens=2,
                             recent_tokens=4, output_dtype="float32")
    assert torch.equal(result.counts, floats.counts)
    expected = (floats.keys / torch.from_numpy(np.repeat(
        result.key_scales, np.diff(floats.offsets.numpy())))[:, None]).to(fp8)
    assert torch.equal(result.keys.view(torch.uint8), expected.view(torch.uint8))


@requires_torch
def test_narrowing_equals_torch_and_saturates(client):
    # A job that keeps every row (target 1.0) returns its input: the service's narrowing.
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 512, 32, generator=g) * torch.logspace(-4, 2.4, 512)[None, :, None]
    x[0, 0, :4] = torch.tensor([448.0, 464.0, 500.0, -1e6])  # max, tie above max, beyond
    result = client.compress(x, x.clone(), target_ratio=1.0, output_dtype="fp8_e4m3",
                             output_key_scale=1.0, output_value_scale=1.0, backend="reference")
    ours = result.keys.reshape(1, 512, 32)
    theirs = x.to(torch.float8_e4m3fn)  # round to nearest even; NaN beyond the range
    finite = x.abs() < 464
    assert torch.equal(ours.view(torch.uint8)[finite], theirs.view(torch.uint8)[finite])
    assert ours[0, 0, :4].float().tolist() == [448.0, 448.0, 448.0, -448.0]


def test_bad_scales_are_refused_naming_the_field(client):
    case = load_fp8(CASES[0])
    k, v = case["keys"], case["values"]
    with pytest.raises(centroidkv.InvalidArgumentError) as missing:
        client.compress(k, v, input_dtype=case["dtype"], value_scale=1.0)
    assert missing.value.field == "key_scale"
    with pytest.raises(centroidkv.InvalidArgumentError) as uint8:
        client.compress(k, v)  # codes without their format
    assert uint8.value.field == "keys"
    good = np.random.default_rng(0).standard_normal((4, 64, 8)).astype(np.float32)
    layers = [
        dict(keys=k, values=v, input_dtype=case["dtype"], key_scale=[0.1, 0.0, 0.1, 0.1],
             value_scale=1.0),
        dict(keys=good, values=good),
        dict(keys=k, values=v, input_dtype=case["dtype"], key_scale=float("nan"),
             value_scale=1.0),
        dict(keys=good, values=good, output_dtype="float16", output_key_scale=0.5),
        dict(keys=k, values=v, input_dtype=case["dtype"], key_scale=[1.0, 1.0],
             value_scale=1.0),
        dict(keys=good, values=good, output_dtype="fp8_e5m2", output_value_scale=-2.0),
    ]
    results = client.compress_layers(layers, return_exceptions=True)
    expected = [("start_job.key_scales", 1), None, ("start_job.key_scales", 0),
                ("start_job.output_key_scales", None), ("start_job.key_scales", None),
                ("start_job.output_value_scales", 0)]
    for result, want in zip(results, expected):
        if want is None:
            assert isinstance(result, centroidkv.LayerResult), result
            continue
        assert isinstance(result, centroidkv.InvalidArgumentError), result
        assert (result.field, result.head) == want, result
