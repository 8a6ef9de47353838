"""TLS, mTLS and the bearer token of a client: the options of the C++ client
(client/channel_security.cc, docs/security.md) turned into gRPC credentials, channel options
and call metadata.

TLS is on when tls_ca or tls_cert is given (without tls_ca the server is checked against the
system's roots); tls_cert + tls_key is the client certificate for mTLS; tls_server_name is
the name the server's certificate must carry (default: the target's host). auth_token (or
$CENTROIDKV_TOKEN when None) goes out as `authorization: Bearer <token>` on every call,
plaintext channels included. The certificate files are read once, when the client is made
(unlike the C++ client, grpcio has no file watcher: make a new client after a rotation).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import grpc

from .errors import invalid_argument

TOKEN_VARIABLE = "CENTROIDKV_TOKEN"


@dataclass
class ChannelSecurity:
    credentials: Optional[grpc.ChannelCredentials]  # None: plaintext
    channel_options: list
    metadata: tuple  # sent with every call

    @property
    def tls(self) -> bool:
        return self.credentials is not None


def _read(path: str, argument: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise invalid_argument(argument, f"cannot read '{path}': {e.strerror}") from None


def channel_security(tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                     tls_key: Optional[str] = None, tls_server_name: Optional[str] = None,
                     auth_token: Optional[str] = None) -> ChannelSecurity:
    if bool(tls_cert) != bool(tls_key):
        raise invalid_argument("tls_cert", "give tls_cert and tls_key both or neither")
    if auth_token is None:
        auth_token = os.environ.get(TOKEN_VARIABLE, "")
    metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
    if not tls_ca and not tls_cert:
        if tls_server_name:
            raise invalid_argument("tls_server_name", "needs TLS (tls_ca or tls_cert)")
        return ChannelSecurity(None, [], metadata)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
        private_key=_read(tls_key, "tls_key") if tls_key else None,
        certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None)
    options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
    return ChannelSecurity(credentials, options, metadata)
