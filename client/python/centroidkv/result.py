"""What calls return: LayerResult (one compressed layer) and ServerInfo (GetInfo)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional


class HeadResult(NamedTuple):
    keys: Any      # [entries_h, dk]
    values: Any    # [entries_h, dv]
    counts: Any    # [entries_h]


@dataclass
class LayerResult:
    """One compressed layer, heads concatenated along the entry axis: head h owns rows
    offsets[h] .. offsets[h+1] of keys [total, dk], values [total, dv] and counts [total]
    (how many original tokens each entry stands for). assignment [H, n] maps every input
    entry to its head-local output row (None unless asked for). numpy in, numpy out (counts
    uint32, offsets int64, assignment int32); torch in, torch out (those three as int64)."""

    keys: Any
    values: Any
    counts: Any
    offsets: Any
    assignment: Optional[Any]
    layer_index: int
    num_heads: int
    num_tokens: int
    backend: str
    passes_run: int
    compute_seconds: float
    queue_seconds: float

    @property
    def total_entries(self) -> int:
        return int(self.offsets[-1])

    def head(self, h: int) -> HeadResult:
        if not 0 <= h < self.num_heads:
            raise IndexError(f"head {h} outside [0, {self.num_heads})")
        lo, hi = int(self.offsets[h]), int(self.offsets[h + 1])
        return HeadResult(self.keys[lo:hi], self.values[lo:hi], self.counts[lo:hi])


@dataclass
class Limits:
    max_heads: int
    max_tokens: int
    max_dim: int
    max_job_bytes: int
    max_stream_bytes: int
    max_total_bytes: int
    max_message_bytes: int
    result_slab_bytes: int


@dataclass
class Device:
    backend: str
    name: str
    memory_bytes: int
    compute_capability: tuple


@dataclass
class ServerInfo:
    version: str
    backends: list
    default_backend: str
    limits: Limits
    defaults: dict          # every SPEC parameter's default, by name
    devices: list = field(default_factory=list)  # [Device]
    worker_threads: int = 0


def server_info_from_proto(reply) -> ServerInfo:
    from google.protobuf.json_format import MessageToDict

    l = reply.limits
    limits = Limits(l.max_heads, l.max_tokens, l.max_dim, l.max_job_bytes, l.max_stream_bytes,
                    l.max_total_bytes, l.max_message_bytes, l.result_slab_bytes)
    defaults = MessageToDict(reply.defaults, preserving_proto_field_name=True)
    devices = [Device(d.backend, d.name, d.memory_bytes, (d.compute_major, d.compute_minor))
               for d in reply.device_info]
    return ServerInfo(reply.version, list(reply.backends), reply.default_backend, limits,
                      defaults, devices, reply.worker_threads)
