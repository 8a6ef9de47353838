"""Reservation hogs against an honest job, on a real server (docs/reliability.md).

Starts centroidkv-server (--threads 1, its default budget) on a unix socket, times an
honest job alone, then with N hog streams open for each N asked: each hog sends a StartJob
for a large job and one 64 KiB slab, then goes quiet, so that its reservation fills the
budget (the honest job then waits for memory). Each repeat opens fresh hogs and times one
honest job. Reports, per N, the honest job's time and its ratio to its time alone, what status
each hog got, and the server's peak RSS against its budget. The last line is one JSON list.

Usage: bench/hogs.py BIN_DIR [--hogs 16,64] [--repeats 3] [--server-flags "..."]
                      [--without-policy]  (also a leg with --min-receive-rate 0)
"""
import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np

import centroidkv
from centroidkv.v1 import centroidkv_pb2 as pb

# The shapes: hogs announce 8 heads x 524288 tokens x 8 dims in fp16 (128 MiB of
# input each); the honest job is 8 x 262144 x 8 fp16, 64 MiB of keys and values.
HOG_SHAPE = (8, 524288, 8)
HONEST_SHAPE = (8, 262144, 8)


def status_bytes(pid: int, field: str) -> int:
    """A memory line of /proc/PID/status ("VmRSS", "VmHWM": the peak), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class Hog:
    """A stream that reserves a job's memory, sends one slab and waits."""

    def __init__(self, channel, job_id: int):
        heads, tokens, dim = HOG_SHAPE
        start = pb.StartJob(job_id=job_id, num_heads=heads, num_tokens=tokens, key_dim=dim,
                            value_dim=dim, dtype=pb.DTYPE_FLOAT16,
                            layout=pb.LAYOUT_HEAD_MAJOR)
        start.params.target_ratio = 0.25
        self._requests = queue.Queue()
        self._requests.put(pb.CompressRequest(start_job=start))
        self._requests.put(pb.CompressRequest(slab=pb.TensorSlab(
            job_id=job_id, tensor=pb.TENSOR_KEYS, byte_offset=0, data=bytes(1 << 16))))
        self.outcome = None
        compress = channel.stream_stream(
            "/centroidkv.v1.CentroidKV/Compress",
            request_serializer=pb.CompressRequest.SerializeToString,
            response_deserializer=pb.CompressResponse.FromString)
        self._call = compress(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            for response in self._call:
                if response.HasField("error") and self.outcome is None:
                    code = CODE_NAMES.get(response.error.code, str(response.error.code))
                    self.outcome = f"{code} {response.error.field}"
        except grpc.RpcError as error:
            if self.outcome is None:
                self.outcome = f"stream {error.code().name}"

    def close(self):
        self._requests.put(None)  # half-close
        self._reader.join(timeout=30)
        if self.outcome is None:
            self.outcome = "no answer"


# absl's status codes are gRPC's.
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def honest_seconds(client, keys, values) -> float:
    start = time.perf_counter()
    client.compress(keys, values, target_ratio=0.25)
    return time.perf_counter() - start


def run_leg(args, label: str, extra_flags: list) -> list:
    """One server with `extra_flags`: the honest job alone, then against each hog count."""
    socket_path = tempfile.mktemp(prefix="ckv-hogs-", suffix=".sock")
    flags = ["--listen", f"unix://{socket_path}", "--threads", "1"] + extra_flags
    server = subprocess.Popen([os.path.join(args.bin_dir, "centroidkv-server")] + flags,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        for _ in range(100):
            if os.path.exists(socket_path):
                break
            time.sleep(0.1)
        target = f"unix://{socket_path}"
        client = centroidkv.Client(target, timeout=args.honest_timeout)
        rng = np.random.default_rng(1)
        keys = rng.standard_normal(HONEST_SHAPE, dtype=np.float32).astype(np.float16)
        values = rng.standard_normal(HONEST_SHAPE, dtype=np.float32).astype(np.float16)
        alone = statistics.median(
            [honest_seconds(client, keys, values) for _ in range(args.repeats)])
        print(f"[{label}: server flags {' '.join(extra_flags) or '(defaults)'}] honest job "
              f"alone {HONEST_SHAPE} fp16: median {alone:.3f} s of {args.repeats}", flush=True)
        for hogs_asked in [int(n) for n in args.hogs.split(",")]:
            # Each repeat: fresh hogs, then one honest job (the hogs' reservations are gone
            # once the first honest job got through, so later ones would not measure them).
            times, outcomes, held = [], {}, 0
            for _ in range(args.repeats):
                channel = grpc.insecure_channel(target)
                hogs = [Hog(channel, 1) for _ in range(hogs_asked)]
                time.sleep(1.0)  # the first hogs reserve, the rest wait for memory
                held = max(held, status_bytes(server.pid, "VmRSS"))
                try:
                    times.append(honest_seconds(client, keys, values))
                except centroidkv.CompressError as error:
                    times.append(float("inf"))
                    print(f"  honest job failed: {error}", flush=True)
                for hog in hogs:
                    hog.close()
                channel.close()
                for hog in hogs:
                    outcomes[hog.outcome] = outcomes.get(hog.outcome, 0) + 1
            median = statistics.median(times)
            row = {"policy": label, "hogs": hogs_asked, "honest_alone_s": round(alone, 3),
                   "honest_with_hogs_s": round(median, 3), "ratio": round(median / alone, 2),
                   "honest_with_hogs_max_s": round(max(times), 3),
                   "hog_outcomes": outcomes, "rss_with_hogs_bytes": held,
                   "peak_rss_bytes": status_bytes(server.pid, "VmHWM")}
            rows.append(row)
            print(f"  {hogs_asked} hogs: honest job median {median:.3f} s ({row['ratio']}x "
                  f"alone), max {max(times):.3f} s; hogs {outcomes}; server RSS "
                  f"{held / 2**20:.0f} MiB with the hogs, "
                  f"peak {row['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
        client.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        if os.path.exists(socket_path):
            os.unlink(socket_path)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--hogs", default="16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-flags", default="")
    parser.add_argument("--honest-timeout", type=float, default=60.0)
    parser.add_argument("--without-policy", action="store_true",
                        help="also a leg with --min-receive-rate 0 (the timeout alone)")
    args = parser.parse_args()
    rows = run_leg(args, "earned", args.server_flags.split())
    if args.without_policy:
        rows += run_leg(args, "timeout-only",
                        args.server_flags.split() + ["--min-receive-rate", "0"])
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
