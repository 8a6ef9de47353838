"""Server targets: one address, or a replica set (a comma list or a dns:/// name) turned
into one gRPC target with round_robin and health checking, as the C++ ReplicaPool does
(client/replica_pool.cc)."""
from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass

from .errors import invalid_argument

# round_robin places each stream on the next READY replica; the health check (the server's
# standard health service) takes a draining replica (NOT_SERVING) out of the rotation.
REPLICA_SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": "centroidkv.v1.CentroidKV"},
})


@dataclass
class Target:
    grpc_target: str
    replicas: int          # addresses named; 0 for dns: (gRPC decides)
    service_config: str    # "" for a single address

    @property
    def is_replica_set(self) -> bool:
        return self.service_config != ""


def parse_target(target: str) -> Target:
    if not target:
        raise invalid_argument("target", "empty")
    entries = target.split(",")
    if len(entries) == 1:
        if target.startswith("dns:"):
            return Target(target, 0, REPLICA_SERVICE_CONFIG)
        return Target(target, 1, "")
    schemes = ("ipv4:", "ipv6:", "unix:")
    grpc_list = target.startswith(schemes) and not any(
        "://" in e or e.startswith(("ipv", "unix:", "dns:")) for e in entries[1:])
    if grpc_list and not target.startswith("unix:"):
        return Target(target, len(entries), REPLICA_SERVICE_CONFIG)
    family, addresses = None, []
    for i, raw in enumerate(entries):
        entry = raw.strip()
        if not entry:
            raise invalid_argument("target", f"entry {i + 1} of '{target}' is empty")
        if grpc_list and i > 0:
            entry = "unix:" + entry
        for fam, address in _entry_addresses(entry):
            if family is not None and fam != family:
                raise invalid_argument("target", f"'{entry}' is of another address family "
                                       "than the entries before it")
            family = fam
            addresses.append(address)
    return Target(f"{family}:" + ",".join(addresses), len(addresses), REPLICA_SERVICE_CONFIG)


def _entry_addresses(entry: str):
    if entry.startswith("dns:"):
        raise invalid_argument("target", f"a dns: target names its own replica set; it "
                               f"cannot be one entry of a list ('{entry}')")
    if entry.startswith("unix:"):
        path = entry[len("unix:"):]
        path = path[2:] if path.startswith("//") else path
        if not path:
            raise invalid_argument("target", "empty unix socket path")
        return [("unix", path)]
    for scheme in ("ipv4", "ipv6"):
        if entry.startswith(scheme + ":"):
            return [(scheme, entry[len(scheme) + 1:])]
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port:
        raise invalid_argument("target", f"'{entry}' is not HOST:PORT, ipv4:, ipv6: or unix:")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(host)
        return [("ipv4", f"{ip}:{port}")] if ip.version == 4 else [("ipv6", f"[{ip}]:{port}")]
    except ValueError:
        pass
    # A host name: resolved once, here (a dns: target is re-resolved by gRPC instead).
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise invalid_argument("target", f"cannot resolve '{host}': {e}") from None
    v4 = sorted({f"{a[4][0]}:{port}" for a in found if a[0] == socket.AF_INET})
    v6 = sorted({f"[{a[4][0]}]:{port}" for a in found if a[0] == socket.AF_INET6})
    return [("ipv4", a) for a in v4] if v4 else [("ipv6", a) for a in v6]
