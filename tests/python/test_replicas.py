"""Replica sets: a comma list of three real servers, one of them killed (SIGKILL) while it
serves the stream; every layer still arrives exactly once, with the right result."""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

import centroidkv
from centroidkv.targets import parse_target
from server_process import ServerProcess, metric_value
from test_client import SMALL


def test_target_forms():
    assert parse_target("127.0.0.1:5").service_config == ""
    assert parse_target("unix:///tmp/a.sock").grpc_target == "unix:///tmp/a.sock"
    many = parse_target("127.0.0.1:5,127.0.0.1:6")
    assert many.grpc_target == "ipv4:127.0.0.1:5,127.0.0.1:6" and many.replicas == 2
    assert "round_robin" in many.service_config and "healthCheckConfig" in many.service_config
    assert parse_target("unix:///a,unix:///b").grpc_target == "unix:/a,/b"
    assert parse_target("ipv4:127.0.0.1:5,127.0.0.1:6").replicas == 2
    assert parse_target("[::1]:5,[::1]:6").grpc_target == "ipv6:[::1]:5,[::1]:6"
    assert parse_target("localhost:7,127.0.0.2:7").grpc_target.startswith("ipv4:127.0.0.")
    assert parse_target("dns:///ckv.svc:50051").replicas == 0
    for bad in ["", "a:1,,b:2", "127.0.0.1:1,unix:///x", "dns:///a:1,b:2", "nohostport,b:1"]:
        with pytest.raises(centroidkv.InvalidArgumentError) as caught:
            parse_target(bad)
        assert caught.value.field == "target"


@pytest.fixture
def replicas():
    with tempfile.TemporaryDirectory(prefix="ckv-py-replicas-") as folder:
        servers = [ServerProcess(f"unix://{folder}/r{i}.sock", metrics=True, threads=1)
                   for i in range(3)]
        yield servers
        for s in servers:
            s.stop()


def _serving(servers):
    """The live server with an open stream (the one round_robin chose)."""
    for s in servers:
        if s.process.poll() is None and metric_value(s.metrics(), "centroidkv_streams_open") > 0:
            return s
    return None


def test_a_replica_killed_mid_run_loses_no_layer(replicas, client):
    rng = np.random.default_rng(51)
    layers = [(rng.standard_normal((8, 2048, 32)).astype(np.float32),
               rng.standard_normal((8, 2048, 32)).astype(np.float32)) for _ in range(32)]
    target = ",".join(s.target for s in replicas)
    seen, killed = [], None
    with centroidkv.Client(target, timeout=300) as pool:
        for result in pool.iter_compress_layers(layers, return_assignment=True, **SMALL):
            seen.append(result)
            if killed is None:
                killed = _serving(replicas)
                assert killed is not None
                killed.kill()
    assert killed.process.poll() is not None
    indices = [r.layer_index for r in seen]
    assert sorted(indices) == list(range(32)), indices  # each layer exactly once
    survivors = [s for s in replicas if s is not killed]
    assert sum(metric_value(s.metrics(), "centroidkv_jobs_total") for s in survivors) > 0
    for r in seen[::5]:
        k, v = layers[r.layer_index]
        alone = client.compress(k, v, return_assignment=True, **SMALL)
        np.testing.assert_array_equal(r.keys, alone.keys)
        np.testing.assert_array_equal(r.assignment, alone.assignment)


def test_streams_are_spread_over_the_replicas(replicas):
    rng = np.random.default_rng(52)
    keys = rng.standard_normal((2, 64, 16)).astype(np.float32)
    target = ",".join(s.target for s in replicas)
    with centroidkv.Client(target) as pool:
        for _ in range(9):
            pool.compress(keys, keys, **SMALL)
    jobs = [metric_value(s.metrics(), "centroidkv_jobs_total") for s in replicas]
    assert all(j >= 1 for j in jobs), jobs
