"""A real centroidkv-server started for the tests: on a unix socket or on 127.0.0.1 with a
port the server picks (port 0), optionally with /metrics on another free port."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import threading
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("CKV_BIN_DIR", REPO / "build" / "bin"))
SHARED_DIR = pathlib.Path(os.environ.get("CKV_SHARED_DIR", REPO.parent / "shared"))
SERVER_BIN = BIN_DIR / "centroidkv-server"

_DIALS = re.compile(r"this host dials (\S+)\)")
_METRICS = re.compile(r"metrics: http://\S+ \(port (\d+)\)")


class ServerProcess:
    """Starts the server and waits for its 'listening' line; `target` is what to dial."""

    def __init__(self, listen: str, *, metrics: bool = False, threads: int = 2,
                 extra_args=(), ready_timeout: float = 30.0):
        args = [str(SERVER_BIN), "--listen", listen, "--threads", str(threads)]
        if metrics:
            args += ["--metrics-listen", "127.0.0.1:0"]
        args += list(extra_args)
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, bufsize=1)
        self.lines: list = []
        self.target = None
        self.metrics_port = None
        ready = threading.Event()

        def pump():
            for line in self.process.stdout:
                self.lines.append(line)
                if (m := _DIALS.search(line)) is not None:
                    self.target = m.group(1)
                    if not metrics:
                        ready.set()
                if (m := _METRICS.search(line)) is not None:
                    self.metrics_port = int(m.group(1))
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(ready_timeout) or self.target is None:
            self.stop()
            raise RuntimeError("centroidkv-server did not start:\n" + "".join(self.lines))

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()

    def kill(self) -> None:
        """SIGKILL: the replica vanishes mid-stream."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM: the server drains and exits (SIGKILL only if it has not within 30 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._pump.join(timeout=5)


def metric_value(text: str, name: str, **labels) -> float:
    """The value of one sample of a Prometheus text exposition (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total
