"""Layer jobs, shared by Client and AsyncClient: a call's arguments -> a StartJob and the
slabs that follow it; the replies of a stream -> finished LayerResults (or CompressErrors).
No I/O happens here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import grpc
import numpy as np

from . import _wire
from .arrays import DTYPE_SIZE, Kind, counts_to_wire, dtype_code, ints_from_wire, rows_from_wire, to_wire
from .errors import CompressError, invalid_argument, make_error
from .result import LayerResult
from .v1 import centroidkv_pb2 as pb

_LAYOUTS = {"head_major": pb.LAYOUT_HEAD_MAJOR, "token_major": pb.LAYOUT_TOKEN_MAJOR}
_BACKENDS = {"auto": pb.BACKEND_AUTO, "cpu": pb.BACKEND_CPU, "gpu": pb.BACKEND_GPU,
             "reference": pb.BACKEND_REFERENCE, "identity": pb.BACKEND_IDENTITY}
_UINT_PARAMS = ("chunk_size", "sink_tokens", "recent_tokens", "max_passes")
_FLOAT_PARAMS = ("min_similarity", "tighten_per_pass")
PARAM_NAMES = ("target_ratio", "target_tokens") + _UINT_PARAMS + _FLOAT_PARAMS + (
    "uniform_heads", "passthrough_heads")
JOB_OPTION_NAMES = PARAM_NAMES + ("layout", "output_dtype", "return_assignment", "backend")


def compression_params(target_ratio=None, target_tokens=None, chunk_size=None,
                       sink_tokens=None, recent_tokens=None, min_similarity=None,
                       tighten_per_pass=None, max_passes=None, uniform_heads=None,
                       passthrough_heads=None) -> pb.CompressionParams:
    """SPEC section 2's parameters; None leaves a parameter at the server's default."""
    params = pb.CompressionParams()
    if target_ratio is not None and target_tokens is not None:
        raise invalid_argument("target_ratio", "set only one of target_ratio and target_tokens")
    given = dict(target_ratio=target_ratio, target_tokens=target_tokens, chunk_size=chunk_size,
                 sink_tokens=sink_tokens, recent_tokens=recent_tokens,
                 min_similarity=min_similarity, tighten_per_pass=tighten_per_pass,
                 max_passes=max_passes)
    for name, value in given.items():
        if value is None:
            continue
        if name in ("target_tokens",) + _UINT_PARAMS:
            if isinstance(value, bool) or int(value) != value or not 0 <= int(value) < 2**32:
                raise invalid_argument(name, f"must be a non-negative integer (got {value!r})")
            value = int(value)
        else:
            value = float(value)
        setattr(params, name, value)
    if uniform_heads is not None:
        params.uniform_heads = bool(uniform_heads)
    if passthrough_heads is not None:
        heads = [int(h) for h in passthrough_heads]
        if any(h < 0 or h >= 2**32 for h in heads):
            raise invalid_argument("passthrough_heads", f"names a negative head ({heads})")
        params.passthrough_heads.extend(heads)
    return params


@dataclass
class Job:
    """One layer job ready to send: its StartJob and the tensors whose slabs follow."""

    job_id: int
    layer_index: int
    start: pb.StartJob
    tensors: list  # [(pb.Tensor, WireArray)]
    kind: Kind

    def requests(self, slab_bytes: int) -> Iterator[bytes]:
        """The serialized requests of this job: StartJob, then every tensor in slabs."""
        yield _wire.encode_start_job(self.start)
        for tensor, array in self.tensors:
            data = array.data
            for offset in range(0, len(data), slab_bytes):
                yield _wire.encode_slab(self.job_id, tensor, offset,
                                        data[offset:offset + slab_bytes])


def make_job(job_id: int, layer_index: int, keys, values, counts=None, *,
             layout: str = "head_major", output_dtype=None, return_assignment: bool = False,
             backend: str = "auto", **params) -> Job:
    unknown = set(params) - set(PARAM_NAMES)
    if unknown:
        raise TypeError(f"unknown compression parameter(s): {', '.join(sorted(unknown))}")
    if layout not in _LAYOUTS:
        raise invalid_argument("layout", f"'{layout}' is not head_major or token_major")
    if backend not in _BACKENDS:
        raise invalid_argument("backend", f"'{backend}' is not one of {', '.join(_BACKENDS)}")
    k, kind = to_wire(keys, "keys")
    v, _ = to_wire(values, "values")
    for name, array in (("keys", k), ("values", v)):
        if len(array.shape) != 3:
            raise invalid_argument(name, f"must be 3-D ({layout}), got shape {array.shape}")
    if k.dtype != v.dtype:
        raise invalid_argument("values", "must have the dtype of keys")
    if k.shape[:2] != v.shape[:2]:
        raise invalid_argument("values", f"shape {v.shape} does not match keys {k.shape}")
    heads, tokens = (k.shape[0], k.shape[1]) if layout == "head_major" else (k.shape[1], k.shape[0])
    tensors = [(pb.TENSOR_KEYS, k), (pb.TENSOR_VALUES, v)]
    if counts is not None:
        c = counts_to_wire(counts)
        if c.shape != k.shape[:2]:
            raise invalid_argument("counts", f"shape {c.shape} does not match keys' {k.shape[:2]}")
        tensors.append((pb.TENSOR_COUNTS, c))
    start = pb.StartJob(
        job_id=job_id, layer_index=layer_index, num_heads=heads, num_tokens=tokens,
        key_dim=k.shape[2], value_dim=v.shape[2], dtype=k.dtype, layout=_LAYOUTS[layout],
        has_counts=counts is not None, params=compression_params(**params),
        return_assignment=bool(return_assignment),
        output_dtype=dtype_code(output_dtype, "output_dtype"), backend=_BACKENDS[backend])
    return Job(job_id, layer_index, start, tensors, kind)


@dataclass
class _Partial:
    header: pb.JobResult
    buffers: dict = field(default_factory=dict)  # pb.Tensor -> np.uint8 array
    missing: int = 0


class Assembler:
    """Reassembles the replies of one stream. feed() takes each decoded reply and returns
    the (job_id, LayerResult | CompressError) it completed, or None."""

    def __init__(self, jobs: dict):
        self.jobs = jobs  # job_id -> Job, for the layer index and the caller's kind
        self.partial: dict = {}

    def feed(self, reply) -> Optional[tuple]:
        if isinstance(reply, _wire.Slab):
            return self._slab(reply)
        which = reply.WhichOneof("message")
        if which == "result":
            return self._header(reply.result)
        if which == "error":
            error = reply.error
            job = self.jobs.get(error.job_id)
            return error.job_id, make_error(error.code, error.message, job_id=error.job_id,
                                            layer=job.layer_index if job else None)
        return None

    def _header(self, header: pb.JobResult):
        sizes = {pb.TENSOR_OUT_KEYS: header.out_keys_bytes,
                 pb.TENSOR_OUT_VALUES: header.out_values_bytes,
                 pb.TENSOR_OUT_COUNTS: header.out_counts_bytes,
                 pb.TENSOR_ASSIGNMENT: header.assignment_bytes}
        part = _Partial(header, {t: np.empty(n, np.uint8) for t, n in sizes.items()},
                        sum(sizes.values()))
        self.partial[header.job_id] = part
        return self._finish(header.job_id) if part.missing == 0 else None

    def _slab(self, slab: _wire.Slab):
        part = self.partial.get(slab.job_id)
        if part is None:
            return None  # a cancelled job's
        buf = part.buffers.get(slab.tensor)
        end = slab.byte_offset + len(slab.data)
        if buf is None or end > len(buf):
            self.partial.pop(slab.job_id)
            return slab.job_id, make_error(grpc.StatusCode.DATA_LOSS,
                                           "server sent a result slab past the tensor's end",
                                           job_id=slab.job_id)
        buf[slab.byte_offset:end] = np.frombuffer(slab.data, np.uint8)
        part.missing -= len(slab.data)
        return self._finish(slab.job_id) if part.missing <= 0 else None

    def _finish(self, job_id: int):
        part = self.partial.pop(job_id)
        header, b = part.header, part.buffers
        job = self.jobs[job_id]
        kind = job.kind
        if header.dtype not in DTYPE_SIZE:
            return job_id, make_error(grpc.StatusCode.DATA_LOSS,
                                      f"result dtype {header.dtype} unknown", job_id=job_id)
        heads, tokens = header.num_heads, header.num_tokens
        assignment = None
        if header.has_assignment:
            assignment = ints_from_wire(
                b[pb.TENSOR_ASSIGNMENT].view(np.int32).reshape(heads, tokens), kind)
        result = LayerResult(
            keys=rows_from_wire(b[pb.TENSOR_OUT_KEYS], header.dtype, header.key_dim, kind),
            values=rows_from_wire(b[pb.TENSOR_OUT_VALUES], header.dtype, header.value_dim, kind),
            counts=ints_from_wire(b[pb.TENSOR_OUT_COUNTS].view(np.uint32), kind),
            offsets=ints_from_wire(np.asarray(header.offsets, dtype=np.int64), kind),
            assignment=assignment, layer_index=header.layer_index, num_heads=heads,
            num_tokens=tokens, backend=header.backend, passes_run=header.passes_run,
            compute_seconds=header.compute_seconds, queue_seconds=header.queue_seconds)
        return job_id, result


def stream_error(error: grpc.RpcError, jobs: dict) -> CompressError:
    """The CompressError for a stream that ended with `error`, attributed to the job its
    message names ("job 3: ...") when it names one of ours."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    message = error.details() if callable(getattr(error, "details", None)) else str(error)
    from .errors import job_named_in

    job_id = job_named_in(message or "")
    job = jobs.get(job_id) if job_id is not None else None
    return make_error(code, message or "", job_id=job_id if job else None,
                      layer=job.layer_index if job else None)


def normalize_layer(layer: Any) -> tuple:
    """A compress_layers item: (keys, values), (keys, values, counts) or a dict with
    keys/values[/counts]."""
    if isinstance(layer, dict):
        return layer["keys"], layer["values"], layer.get("counts")
    if len(layer) == 2:
        return layer[0], layer[1], None
    if len(layer) == 3:
        return tuple(layer)
    raise TypeError("a layer is (keys, values), (keys, values, counts) or a dict")
