"""The Python client (client/python) against the C++ client (centroidkv-bench), side by side
on one centroidkv-server: the llama3-8b preset (8 KV heads, head dim 128, 32 layers, fp16)
at each context and backend, one sequence (32 layer jobs) per run on one stream, all jobs
in flight (compress_layers vs --concurrency 1 --pipeline 32), the two clients in turn for
--rounds rounds. Prints a table and, last, one JSON line with the medians and the ratios
python / C++ of tokens/s (tokens = heads x context per job, as centroidkv-bench counts).

Run through bench/python-client.sh (which builds what it needs and uses .venv).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from server_process import ServerProcess  # noqa: E402

import centroidkv  # noqa: E402

HEADS, HEAD_DIM, LAYERS, DISTINCT = 8, 128, 32, 4
PARAMS = dict(target_ratio=0.25, chunk_size=256, sink_tokens=16, recent_tokens=64)


def make_layers(bin_dir: pathlib.Path, context: int, folder: pathlib.Path, seed: int = 1):
    """centroidkv-bench's data: the shared synthetic generator, seed + l * 1000003 for
    distinct layer l, reused round-robin over the 32 layers."""
    distinct = []
    for l in range(DISTINCT):
        out = folder / f"ctx{context}_l{l}"
        if not (out / "keys.npy").exists():
            subprocess.run([str(bin_dir / "centroidkv"), "generate", "--out", str(out),
                            "--heads", str(HEADS), "--tokens", str(context), "--key-dim",
                            str(HEAD_DIM), "--value-dim", str(HEAD_DIM), "--dtype", "float16",
                            "--seed", str(seed + l * 1000003)], check=True,
                           stdout=subprocess.DEVNULL)
        distinct.append((np.load(out / "keys.npy"), np.load(out / "values.npy")))
    return [distinct[l % DISTINCT] for l in range(LAYERS)]


def run_python(client, layers, backend: str) -> float:
    start = time.perf_counter()
    results = client.compress_layers(layers, backend=backend, **PARAMS)
    wall = time.perf_counter() - start
    assert len(results) == len(layers)
    return sum(r.num_heads * r.num_tokens for r in results) / wall


def run_cpp(bin_dir: pathlib.Path, target: str, context: int, backend: str) -> float:
    args = [str(bin_dir / "centroidkv-bench"), "--server", target, "--preset", "llama3-8b",
            "--context", str(context), "--dtype", "float16", "--concurrency", "1",
            "--pipeline", str(LAYERS), "--jobs", str(LAYERS), "--backend", backend,
            "--target-ratio", "0.25", "--chunk-size", "256", "--sink-tokens", "16",
            "--recent-tokens", "64", "--format", "json", "--quiet"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    row = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    if row["jobs_failed"]:
        raise RuntimeError(f"centroidkv-bench: {row['errors']}")
    return row["tokens_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", default=str(REPO / "build" / "bin"))
    parser.add_argument("--contexts", default="4096,32768")
    parser.add_argument("--backends", default="cpu,identity")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="server clustering threads")
    args = parser.parse_args()
    bin_dir = pathlib.Path(args.bin_dir)
    contexts = [int(c) for c in args.contexts.split(",")]
    backends = args.backends.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckv-pybench-") as folder:
        server = ServerProcess(f"unix://{folder}/ckv.sock", threads=args.threads)
        try:
            with centroidkv.Client(server.target) as client:
                for context in contexts:
                    layers = make_layers(bin_dir, context, pathlib.Path(folder))
                    for backend in backends:
                        run_python(client, layers[:2], backend)  # warm both paths up
                        run_cpp(bin_dir, server.target, context, backend)
                        py, cpp = [], []
                        for _ in range(args.rounds):  # in turn, so both see the same noise
                            cpp.append(run_cpp(bin_dir, server.target, context, backend))
                            py.append(run_python(client, layers, backend))
                        row = dict(context=context, backend=backend,
                                   cpp_tokens_per_s=statistics.median(cpp),
                                   python_tokens_per_s=statistics.median(py),
                                   cpp_rounds=[round(x) for x in cpp],
                                   python_rounds=[round(x) for x in py])
                        row["ratio"] = row["python_tokens_per_s"] / row["cpp_tokens_per_s"]
                        rows.append(row)
                        print(f"{context:>6} {backend:>9}  C++ {row['cpp_tokens_per_s']:>12.4g}"
                              f"  Python {row['python_tokens_per_s']:>12.4g} tok/s"
                              f"  ratio {row['ratio']:.3f}", flush=True)
        finally:
            server.stop()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(json.dumps({"bench": "python-client", "preset": "llama3-8b", "dtype": "float16",
                      "rounds": args.rounds, "loadavg_start_of_report": float(load),
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
