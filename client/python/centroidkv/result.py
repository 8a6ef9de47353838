"""What calls return: LayerResult (one compressed layer) and ServerInfo (GetInfo)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional


class HeadResult(NamedTuple):
    keys: Any      # [entries_h, dk]
    values: Any    # [entries_h, dv]
    counts: Any    # [entries_h]


@dataclass
class LayerResult:
    """One compressed layer. Head-major (the default): heads concatenated along the entry
    axis, head h owns rows offsets[h] .. offsets[h+1] of keys [total, dk], values
    [total, dv] and counts [total] (how many original tokens each entry stands for).
    Token-major (output_layout="token_major"): keys [L, H, dk], values [L, H, dv], counts
    [L, H], every head L rows (offsets h * L). Padded results (pad_heads, pad_to, token-major)
    end shorter heads with count-0 rows (zero keys and values) that attention must mask
    (centroidkv.torch does). assignment maps every input entry to its head-local output row
    (-1 for count-0 padding input): [H, n], or [sum] for ragged input (None unless asked
    for). numpy in, numpy out (counts uint32, offsets int64, assignment int32); torch in,
    torch out (those three as int64).

    The honest account, per head (numpy int64 arrays, [H]): head_entries (real rows, count
    > 0), head_input_tokens (sum of the input counts), head_tokens (input rows);
    stop_reasons (why each head stopped: "target_reached", "passthrough",
    "similarity_floor", "max_passes", "protected", "uniform_heads"); target_tokens (t) and
    target_reached (every compressed head has at most t entries).

    fp8 results (output_dtype "fp8_e4m3" / "fp8_e5m2"): keys and values hold the fp8 codes
    (torch float8 tensors, ml_dtypes arrays, or uint8 codes), key_scales / value_scales
    (float32 [H]) each head's scale: a row element of head h stands for its fp8 value x
    key_scales[h] (vLLM's k_scale / v_scale, per head). float_keys() / float_values() widen
    any result's rows to float32 with its scales.

    Scored and budgeted jobs (scores=, head_budgets=; docs/scored-jobs.md): head_budgets and
    head_exact_entries ([H]; the rest of head_entries are tail centroids). Fitted jobs
    (queries=): log_weights, laid out as counts, each row's real-valued log-weight, added to
    its key's logit instead of ln(count) (-inf for padding rows); attention_bias() gives
    whichever applies.

    A LayerResult goes back for another round as it is: client.compress(result, ...)."""

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
    layout: str = "head_major"
    padded_length: int = 0
    target_tokens: int = 0
    target_reached: bool = True
    head_entries: Any = None
    head_input_tokens: Any = None
    head_tokens: Any = None
    stop_reasons: tuple = ()
    dtype: str = ""               # of keys and values: "float32", ..., "fp8_e4m3"
    key_scales: Any = None        # fp8 results: [H] float32 scales, else None
    value_scales: Any = None
    head_budgets: Any = None        # budgeted jobs: [H] int64, each head's budget
    head_exact_entries: Any = None  # scored jobs: [H] int64, entries kept exact
    log_weights: Any = None         # fitted jobs: float32, one per row (as counts)

    def float_keys(self):
        """The keys as float32 numpy rows, fp8 codes times their head's scale."""
        return self._widened(self.keys, self.key_scales)

    def float_values(self):
        """The values as float32 numpy rows, fp8 codes times their head's scale."""
        return self._widened(self.values, self.value_scales)

    def _widened(self, rows, scales):
        import numpy as np

        from .arrays import fp8_to_float32, is_torch
        from .v1 import centroidkv_pb2 as pb
        a = rows.detach().cpu() if is_torch(rows) else rows
        if scales is None:
            return (a.float().numpy() if is_torch(a) else np.asarray(a, np.float32))
        code = pb.DTYPE_FP8_E4M3 if self.dtype == "fp8_e4m3" else pb.DTYPE_FP8_E5M2
        raw = a.view(sys.modules["torch"].uint8).numpy() if is_torch(a) else np.asarray(a)
        wide = fp8_to_float32(raw, code)
        if self.layout == "token_major":  # [L, H, d]: head h is axis 1
            return wide * np.asarray(scales, np.float32)[None, :, None]
        per_row = np.repeat(np.asarray(scales, np.float32), np.diff(np.asarray(self.offsets)))
        return wide * per_row[:, None]

    def attention_bias(self):
        """What attention adds to each row's logit, laid out as counts (float32 numpy, or a
        torch tensor for torch results): the fitted log-weights, else ln(count) (-inf for
        count-0 padding)."""
        import numpy as np

        from .arrays import is_torch
        if self.log_weights is not None:
            return self.log_weights
        if is_torch(self.counts):
            return self.counts.float().log()
        with np.errstate(divide="ignore"):
            return np.log(np.asarray(self.counts, np.float32))

    @property
    def total_entries(self) -> int:
        """Rows of the result, padding included."""
        return int(self.offsets[-1])

    @property
    def missed_heads(self) -> list:
        """The heads left above the target (their stop_reasons say why)."""
        if self.head_entries is None:
            return []
        return [h for h, reason in enumerate(self.stop_reasons)
                if reason != "passthrough" and int(self.head_entries[h]) > self.target_tokens]

    def head(self, h: int) -> HeadResult:
        """Head h's rows (padding rows included, count 0)."""
        if not 0 <= h < self.num_heads:
            raise IndexError(f"head {h} outside [0, {self.num_heads})")
        if self.layout == "token_major":
            return HeadResult(self.keys[:, h], self.values[:, h], self.counts[:, h])
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
    max_slab_bytes: int = 0  # largest slab payload taken (0 from older servers)
    max_chunk_size: int = 0  # largest chunk_size a job may ask for (0 from servers before it)


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
    shared_memory: bool = False  # this connection may register regions (centroidkv.shm)


def server_info_from_proto(reply) -> ServerInfo:
    from google.protobuf.json_format import MessageToDict

    l = reply.limits
    limits = Limits(l.max_heads, l.max_tokens, l.max_dim, l.max_job_bytes, l.max_stream_bytes,
                    l.max_total_bytes, l.max_message_bytes, l.result_slab_bytes, l.max_slab_bytes,
                    l.max_chunk_size)
    defaults = MessageToDict(reply.defaults, preserving_proto_field_name=True)
    devices = [Device(d.backend, d.name, d.memory_bytes, (d.compute_major, d.compute_minor))
               for d in reply.device_info]
    return ServerInfo(reply.version, list(reply.backends), reply.default_backend, limits,
                      defaults, devices, reply.worker_threads, reply.shared_memory)
