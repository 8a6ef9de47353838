"""TLS, mTLS and bearer tokens of centroidkv.Client / AsyncClient against real
centroidkv-server processes (--tls-cert/--tls-key, --tls-client-ca, --auth-tokens-file),
with certificates made at test time by openssl as tests/testing/test_pki.cc makes them: two
CAs, a server certificate (localhost, 127.0.0.1) and client certificates from each CA."""
from __future__ import annotations

import asyncio
import pathlib
import subprocess
import tempfile

import grpc
import numpy as np
import pytest

import centroidkv
from conftest import load_golden
from server_process import ServerProcess

TOKEN = "s3cret-token-for-worker-a"


def _openssl(folder: pathlib.Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {' '.join(args)}:\n{done.stderr}"


def _make_ca(folder, name):
    _openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj",
             f"/CN=centroidkv-test-{name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def _make_leaf(folder, name, ca, server):
    (folder / f"{name}.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}\n" +
        ("subjectAltName=DNS:localhost,IP:127.0.0.1\n" if server else ""))
    cn = "centroidkv-server" if server else name
    _openssl(folder, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
    _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
             f"{ca}.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out",
             f"{name}.pem")


@pytest.fixture(scope="module")
def pki():
    with tempfile.TemporaryDirectory(prefix="ckv-py-pki-") as name:
        folder = pathlib.Path(name)
        for ca in ("ca", "other-ca"):
            _make_ca(folder, ca)
        _make_leaf(folder, "server", "ca", server=True)
        _make_leaf(folder, "worker-a", "ca", server=False)
        _make_leaf(folder, "worker-x", "other-ca", server=False)
        (folder / "tokens").write_text(f"# token caller\n{TOKEN} worker-a\n")
        yield folder


def _tls_args(pki):
    return ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]


@pytest.fixture(scope="module")
def tls_server(pki):
    """TLS (no client certificate) and bearer tokens."""
    process = ServerProcess("127.0.0.1:0", extra_args=_tls_args(pki) + [
        "--auth-tokens-file", str(pki / "tokens")])
    yield process
    process.stop()


@pytest.fixture(scope="module")
def mtls_servers(pki):
    """Two mTLS replicas: a client certificate from `ca` is required."""
    processes = [ServerProcess("127.0.0.1:0", extra_args=_tls_args(pki) + [
        "--tls-client-ca", str(pki / "ca.pem")]) for _ in range(2)]
    yield processes
    for p in processes:
        p.stop()


def _golden_job(client):
    case = load_golden("stories260K_layer2")
    result = client.compress(case["keys"], case["values"], output_dtype="float32",
                             return_assignment=True, **case["config"])
    return case, result


def _expect_bit_for_bit(result, case, plain):
    np.testing.assert_array_equal(result.offsets, case["out_offsets"])
    np.testing.assert_array_equal(result.counts, case["out_counts"])
    np.testing.assert_array_equal(result.assignment, case["assignment"])
    np.testing.assert_allclose(result.keys, case["out_keys"], rtol=1e-5, atol=1e-7)
    # Bit for bit what the same server build computes over plaintext.
    np.testing.assert_array_equal(result.keys.view(np.uint32), plain.keys.view(np.uint32))
    np.testing.assert_array_equal(result.values.view(np.uint32), plain.values.view(np.uint32))


def _refused(target, **options):
    """What a client that should not get through gets: UNAVAILABLE naming the failed
    connection (the handshake), not a slow server's deadline."""
    with centroidkv.Client(target, connect_timeout=1, **options) as c:
        with pytest.raises(centroidkv.UnavailableError) as caught:
            c.info()
    assert "no connection within 1 s: failed to connect" in caught.value.message, caught.value
    return caught.value


def test_plaintext_and_the_wrong_ca_fail_against_tls(pki, tls_server):
    _refused(tls_server.target, auth_token=TOKEN)
    _refused(tls_server.target, tls_ca=str(pki / "other-ca.pem"), auth_token=TOKEN)
    _refused(tls_server.target, tls_ca=str(pki / "ca.pem"), tls_server_name="elsewhere.example",
             auth_token=TOKEN)


def test_tls_with_a_token_compresses_a_golden_case_bit_for_bit(pki, tls_server, client):
    _, plain = _golden_job(client)
    with centroidkv.Client(tls_server.target, tls_ca=str(pki / "ca.pem"),
                           tls_server_name="localhost", auth_token=TOKEN, timeout=60) as c:
        assert c.tls
        case, result = _golden_job(c)
    _expect_bit_for_bit(result, case, plain)


def test_the_token_comes_from_the_environment(pki, tls_server, monkeypatch):
    monkeypatch.setenv("CENTROIDKV_TOKEN", TOKEN)
    with centroidkv.Client(tls_server.target, tls_ca=str(pki / "ca.pem"), timeout=60) as c:
        assert c.info().version
    monkeypatch.setenv("CENTROIDKV_TOKEN", "not-" + TOKEN)
    with centroidkv.Client(tls_server.target, tls_ca=str(pki / "ca.pem"), timeout=60) as c:
        with pytest.raises(centroidkv.UnauthenticatedError):
            c.info()


@pytest.mark.parametrize("token", [None, "", "wrong-token"])
def test_a_missing_or_bad_token_is_unauthenticated(pki, tls_server, token, monkeypatch):
    monkeypatch.delenv("CENTROIDKV_TOKEN", raising=False)
    keys = np.zeros((2, 16, 8), np.float32)
    with centroidkv.Client(tls_server.target, tls_ca=str(pki / "ca.pem"), auth_token=token,
                           timeout=60) as c:
        with pytest.raises(centroidkv.UnauthenticatedError) as caught:
            c.info()
        c._info = centroidkv.ServerInfo("", [], "", centroidkv.Limits(*[0] * 8), {})
        with pytest.raises(centroidkv.UnauthenticatedError) as on_stream:
            c.compress(keys, keys)
    for error in (caught.value, on_stream.value):
        assert isinstance(error, centroidkv.CompressError)
        assert error.code == grpc.StatusCode.UNAUTHENTICATED
        assert TOKEN not in str(error)


def test_mtls_needs_a_client_certificate_of_the_ca(pki, mtls_servers):
    target = mtls_servers[0].target
    ca = str(pki / "ca.pem")
    _refused(target, tls_ca=ca)
    _refused(target, tls_ca=ca, tls_cert=str(pki / "worker-x.pem"),
             tls_key=str(pki / "worker-x.key"))

    async def main():
        async with centroidkv.AsyncClient(target, tls_ca=ca, connect_timeout=1) as a:
            with pytest.raises(centroidkv.UnavailableError) as caught:
                await a.info()
        return caught.value

    assert "failed to connect" in asyncio.run(main()).message


def test_mtls_compresses_a_golden_case_bit_for_bit_sync_async_and_replicas(pki, mtls_servers,
                                                                          client):
    _, plain = _golden_job(client)
    security = dict(tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "worker-a.pem"),
                    tls_key=str(pki / "worker-a.key"))
    with centroidkv.Client(mtls_servers[0].target, timeout=60, **security) as c:
        case, result = _golden_job(c)
    _expect_bit_for_bit(result, case, plain)

    async def main():
        async with centroidkv.AsyncClient(mtls_servers[1].target, timeout=60, **security) as a:
            return await a.compress(case["keys"], case["values"], output_dtype="float32",
                                    return_assignment=True, **case["config"])

    _expect_bit_for_bit(asyncio.run(main()), case, plain)
    replicas = ",".join(p.target for p in mtls_servers)
    with centroidkv.Client(replicas, timeout=60, tls_server_name="localhost", **security) as c:
        layers = c.compress_layers([(case["keys"], case["values"])] * 4, output_dtype="float32",
                                   **case["config"])
    for r in layers:
        np.testing.assert_array_equal(r.keys.view(np.uint32), plain.keys.view(np.uint32))


def test_bad_security_options_name_the_option(pki, tmp_path):
    cases = [
        (dict(tls_cert=str(pki / "worker-a.pem")), "tls_cert"),
        (dict(tls_server_name="localhost"), "tls_server_name"),
        (dict(tls_ca=str(tmp_path / "missing.pem")), "tls_ca"),
        (dict(tls_ca=str(pki / "ca.pem"), tls_cert=str(pki / "worker-a.pem"),
              tls_key=str(tmp_path / "missing.key")), "tls_key"),
    ]
    for options, argument in cases:
        with pytest.raises(centroidkv.InvalidArgumentError) as caught:
            centroidkv.Client("127.0.0.1:1", **options)
        assert caught.value.argument == argument, caught.value
