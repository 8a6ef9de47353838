"""Fixtures: a real centroidkv-server per test session on a unix socket, and the golden cases."""
from __future__ import annotations

import json
import sys
import tempfile

import numpy as np
import pytest

try:
    import torch
except ImportError:  # torch is the package's optional extra (client/python/check_oldest.sh)
    torch = None

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from server_process import SERVER_BIN, SHARED_DIR, ServerProcess  # noqa: E402

import centroidkv  # noqa: E402

# The tests' torch work is tiny (stories260K, small attention checks): one thread. Two
# intra-op threads on the shared 2-vCPU box made each step of the transformers fixture
# ~35x slower under load (17 s against 0.5 s for 100 batched decode steps at load 60).
if torch is not None:
    torch.set_num_threads(1)

# Tests that pass torch tensors skip where torch is not installed; scripts/setup_python.sh
# always installs it, so the suite's own runs skip none.
requires_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

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
