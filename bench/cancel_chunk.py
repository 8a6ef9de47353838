"""Cancellation inside one huge chunk (docs/reliability.md).

Starts centroidkv-server at --max-chunk-size 4194304 and sends a 1 x 4194304 x 8 fp16 job
whose one chunk is its whole length (hours of matching); its deadline (timeout_ms, 2 s then
4 s) passes while it computes. Prints when the DEADLINE_EXCEEDED came back and the server's
CPU time (/proc, 10 ms ticks) until then and over the next 300 ms.

Usage: bench/cancel_chunk.py BIN_DIR
"""
import os
import subprocess
import sys
import time

import numpy as np

import centroidkv


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


sock = f"/tmp/ckv-cancel-chunk.{os.getpid()}.sock"
srv = subprocess.Popen([os.path.join(sys.argv[1], "centroidkv-server"), "--listen", f"unix://{sock}",
                        "--threads", "2", "--max-chunk-size", "4194304"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(100):
    if os.path.exists(sock): break
    time.sleep(0.1)
rng = np.random.default_rng(1)
n = 4194304
keys = rng.standard_normal((1, n, 8), dtype=np.float32).astype(np.float16)
values = rng.standard_normal((1, n, 8), dtype=np.float32).astype(np.float16)
client = centroidkv.Client(f"unix://{sock}")
for timeout in (2.0, 4.0):
    base = cpu_seconds(srv.pid)
    start = time.monotonic()
    try:
        client.compress(keys, values, chunk_size=n, sink_tokens=0, recent_tokens=0, timeout=timeout)
        print("finished?!")
    except centroidkv.CompressError as error:
        answered = time.monotonic() - start
        at = cpu_seconds(srv.pid)
        time.sleep(0.3)
        after = cpu_seconds(srv.pid)
        print(f"timeout {timeout} s: {type(error).__name__} after {answered:.2f} s; server CPU "
              f"{at - base:.2f} s until then, {1000 * (after - at):.0f} ms in the next 300 ms")
client.close()
srv.terminate(); srv.wait()
