"""Fixtures: a real centroidkv-server per test session on a unix socket, and the golden cases."""
from __future__ import annotations

import json
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from server_process import SERVER_BIN, SHARED_DIR, ServerProcess  # noqa: E402

import centroidkv  # noqa: E402

GOLDEN_CASES = sorted(p.name for p in (SHARED_DIR / "golden").iterdir() if p.is_dir())


@pytest.fixture(scope="session")
def server():
    if not SERVER_BIN.exists():
        pytest.fail(f"{SERVER_BIN} is missing: build it first (scripts/build.sh centroidkv_server)")
    with tempfile.TemporaryDirectory(prefix="ckv-py-") as folder:
        process = ServerProcess(f"unix://{folder}/ckv.sock")
        yield process
        process.stop()


@pytest.fixture(scope="session")
def client(server):
    with centroidkv.Client(server.target, timeout=120) as c:
        yield c


def load_golden(name: str) -> dict:
    folder = SHARED_DIR / "golden" / name
    case = {f.stem: np.load(folder / f.name) for f in folder.glob("*.npy")}
    case.update(json.loads((folder / "case.json").read_text()))
    return case
