"""Writes the fp8 golden cases: ../shared/golden/stories260K_layer2 (real KV) quantised to
fp8, compressed by the reference backend into fp8 results. Run from the repository root
after a build:

    .venv/bin/python tests/data/golden_fp8/make_cases.py build/bin/centroidkv

The input codes are made here with numpy, independently of the C++ narrowing (nearest
even over the table of every code's value, saturating); the result is the reference
engine's (`centroidkv compress --local --backend reference`). Before writing, the script
checks the result against its own arithmetic: the fp8 rows are the float32 result of the
same job, divided by the result scales and narrowed here, bit for bit, with the same
counts, offsets and assignment. Every backend and both clients must then reproduce the
files (tests/kernels/fp8_conformance_test.cc, tests/python/test_fp8.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[2] / ".." / "shared" / "golden" / "stories260K_layer2"
FORMATS = {"fp8_e4m3": (3, 7, 0x7E), "fp8_e5m2": (2, 15, 0x7B)}


def code_values(dtype: str) -> np.ndarray:
    """The values of the finite non-negative codes 0 .. max, from the OCP definition."""
    mantissa_bits, bias, max_code = FORMATS[dtype]
    codes = np.arange(max_code + 1)
    exponent, mantissa = codes >> mantissa_bits, codes & ((1 << mantissa_bits) - 1)
    normal = np.ldexp((1 << mantissa_bits) + mantissa, exponent - bias - mantissa_bits)
    subnormal = np.ldexp(mantissa, 1 - bias - mantissa_bits)
    return np.where(exponent == 0, subnormal, normal).astype(np.float64)


def narrow(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> fp8 codes: nearest value, ties to the even code, saturating."""
    values = code_values(dtype)
    a = np.abs(x.astype(np.float64))
    lo = np.clip(np.searchsorted(values, a, side="right") - 1, 0, len(values) - 1)
    hi = np.minimum(lo + 1, len(values) - 1)
    d_lo, d_hi = a - values[lo], values[hi] - a
    pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    pick = np.where(a >= values[-1], len(values) - 1, pick)
    return (pick | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def widen(codes: np.ndarray, dtype: str) -> np.ndarray:
    values = code_values(dtype).astype(np.float32)
    magnitude = values[codes & 0x7F]
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


def run(cli: str, case: dict, folder: Path, out: Path, output_dtype: str, output_scales):
    config = case["config"]
    command = [cli, "compress", "--local", "--backend", "reference", "--quiet",
               "--keys", str(folder / "keys.npy"), "--values", str(folder / "values.npy"),
               "--input-dtype", case["dtype"],
               "--key-scales", ",".join(repr(s) for s in case["key_scales"]),
               "--value-scales", ",".join(repr(s) for s in case["value_scales"]),
               "--output-dtype", output_dtype, "--out", str(out),
               "--target-ratio", str(config["target_ratio"]),
               "--chunk-size", str(config["chunk_size"]),
               "--sink-tokens", str(config["sink_tokens"]),
               "--recent-tokens", str(config["recent_tokens"])]
    if output_scales is not None:
        command += ["--output-key-scales", ",".join(repr(s) for s in output_scales[0]),
                    "--output-value-scales", ",".join(repr(s) for s in output_scales[1])]
    subprocess.run(command, check=True)


def f32(x) -> float:
    return float(np.float32(x))


def make(cli: str, name: str, dtype: str, per_head_input: bool, static_output: bool):
    keys = np.load(SOURCE / "keys.npy")
    values = np.load(SOURCE / "values.npy")
    fmax = float(code_values(dtype)[-1])
    axes = (1, 2) if per_head_input else None
    key_scales = np.atleast_1d(np.abs(keys).max(axis=axes) / fmax).astype(np.float32)
    value_scales = np.atleast_1d(np.abs(values).max(axis=axes) / fmax).astype(np.float32)
    H = keys.shape[0]
    per = (lambda s: s[:, None, None]) if per_head_input else (lambda s: s[0])
    key_codes = narrow(keys / per(key_scales), dtype)
    value_codes = narrow(values / per(value_scales), dtype)
    folder = HERE / name
    folder.mkdir(exist_ok=True)
    np.save(folder / "keys.npy", key_codes)
    np.save(folder / "values.npy", value_codes)
    # Static result scales: 3/4 of the input's largest, so that the largest centroid
    # elements saturate, which the case must show too.
    output_scales = ([f32(key_scales.max() * 0.75)], [f32(value_scales.max() * 0.75)]) \
        if static_output else None
    case = {"config": json.load(open(SOURCE / "case.json"))["config"], "dtype": dtype,
            "key_scales": [f32(s) for s in key_scales],
            "value_scales": [f32(s) for s in value_scales],
            "output_dtype": dtype,
            "output_key_scales": output_scales[0] if output_scales else [],
            "output_value_scales": output_scales[1] if output_scales else [],
            "note": f"../shared/golden/stories260K_layer2 as {dtype} codes "
                    f"({'per-head' if per_head_input else 'per-layer'} input scales = amax / "
                    f"max), {'static' if static_output else 'dynamic per-head'} result "
                    "scales; made by make_cases.py (reference backend)"}
    with open(folder / "case.json", "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    with tempfile.TemporaryDirectory() as tmp:
        fp8_out, float_out = Path(tmp) / "fp8", Path(tmp) / "float"
        run(cli, case, folder, fp8_out, dtype, output_scales)
        run(cli, case, folder, float_out, "float32", None)
        offsets = np.load(float_out / "out_offsets.npy")
        for what in ("out_counts", "out_offsets", "assignment"):
            a, b = np.load(fp8_out / f"{what}.npy"), np.load(float_out / f"{what}.npy")
            assert np.array_equal(a, b), f"{name}: {what} differ between fp8 and float32 results"
        for tensor in ("keys", "values"):
            rows = np.load(float_out / f"out_{tensor}.npy")
            scales = np.load(fp8_out / f"out_{tensor[:-1]}_scales.npy")
            if not static_output:  # per head: the head's largest magnitude / max
                want = [max(f32(np.abs(rows[offsets[h]:offsets[h + 1]]).max() / fmax),
                            float(np.finfo(np.float32).tiny)) for h in range(H)]
                assert np.array_equal(scales, np.float32(want)), f"{name}: {tensor} scales"
            per_row = np.repeat(scales, np.diff(offsets))[:, None]
            want_codes = narrow((rows / per_row).astype(np.float32), dtype)
            got = np.load(fp8_out / f"out_{tensor}.npy")
            assert np.array_equal(got, want_codes), f"{name}: {tensor} codes differ"
            saturated = int(np.sum((got & 0x7F) == FORMATS[dtype][2]))
            print(f"{name}: {tensor} {got.shape}, {saturated} elements at the largest code")
        for f in ("out_keys", "out_values", "out_counts", "out_offsets", "assignment",
                  "out_key_scales", "out_value_scales"):
            (folder / f"{f}.npy").write_bytes((fp8_out / f"{f}.npy").read_bytes())
        # The input codes widened with their scales, as every backend must see them.
        wide = widen(key_codes, dtype) * per(key_scales)
        assert np.all(np.isfinite(wide))


def main():
    cli = sys.argv[1] if len(sys.argv) > 1 else "build/bin/centroidkv"
    make(cli, "stories260K_layer2_e4m3", "fp8_e4m3", per_head_input=True, static_output=True)
    make(cli, "stories260K_layer2_e5m2", "fp8_e5m2", per_head_input=False, static_output=False)


if __name__ == "__main__":
    main()
