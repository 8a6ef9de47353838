"""Layer jobs, shared by Client and AsyncClient: a call's arguments -> a StartJob and the
slabs that follow it; the replies of a stream -> finished LayerResults (or CompressErrors).
No I/O happens here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import grpc
import numpy as np

from . import _wire
from .arrays import (DTYPE_SIZE, FP8_DTYPES, Kind, ResultMemory, counts_to_wire, dtype_code,
                     floats_to_wire, ints_from_wire, is_torch, rows_from_wire, to_wire)
from .errors import CompressError, invalid_argument, make_error
from .result import LayerResult
from .shm import ResultSpace, largest_result_bytes
from .v1 import centroidkv_pb2 as pb

_LAYOUTS = {"head_major": pb.LAYOUT_HEAD_MAJOR, "token_major": pb.LAYOUT_TOKEN_MAJOR}
_BACKENDS = {"auto": pb.BACKEND_AUTO, "cpu": pb.BACKEND_CPU, "gpu": pb.BACKEND_GPU,
             "reference": pb.BACKEND_REFERENCE, "identity": pb.BACKEND_IDENTITY}
STOP_REASONS = {value: name[len("STOP_REASON_"):].lower()
                for name, value in pb.StopReason.items()}
_UINT_PARAMS = ("chunk_size", "sink_tokens", "recent_tokens", "max_passes")
_FLOAT_PARAMS = ("min_similarity", "tighten_per_pass")
PARAM_NAMES = ("target_ratio", "target_tokens") + _UINT_PARAMS + _FLOAT_PARAMS + (
    "uniform_heads", "passthrough_heads")
# Scored, budgeted and fitted jobs (docs/scored-jobs.md): compress() keywords besides the
# tensors scores= and queries=.
SCORED_NAMES = ("head_budgets", "centroid_share", "max_cluster_size")
FIT_NAMES = ("log_weight_bound", "fit_block_tokens", "fit_values", "query_scale")


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
    output: Any = None  # the ResultSpace the server writes the result to, if any

    @property
    def ragged(self) -> bool:
        return len(self.start.head_tokens) > 0

    def requests(self, slab_bytes: int) -> Iterator[bytes]:
        """The serialized requests of this job: StartJob, then every tensor in slabs."""
        yield _wire.encode_start_job(self.start)
        for tensor, array in self.tensors:
            data = array.data
            for offset in range(0, len(data), slab_bytes):
                yield _wire.encode_slab(self.job_id, tensor, offset,
                                        data[offset:offset + slab_bytes])


def _uint(name: str, value, low: int = 0) -> int:
    if isinstance(value, bool) or int(value) != value or not low <= int(value) < 2**32:
        raise invalid_argument(name, f"must be an integer in [{low}, 2^32) (got {value!r})")
    return int(value)


def _head_tokens(head_tokens, offsets, rows: int) -> list:
    """Per-head entry counts of ragged input, from head_tokens [H] or offsets [H + 1]."""
    if head_tokens is not None and offsets is not None:
        raise invalid_argument("offsets", "give head_tokens or offsets, not both")
    if offsets is not None:
        o = np.asarray(offsets.detach().cpu().numpy() if is_torch(offsets) else offsets)
        if o.ndim != 1 or len(o) < 2 or o.dtype.kind not in "ui":
            raise invalid_argument("offsets", f"must be integers [H + 1] (got shape {o.shape}, "
                                   f"dtype {o.dtype})")
        o = o.astype(np.int64)
        if o[0] != 0 or o[-1] != rows or np.any(np.diff(o) < 0):
            raise invalid_argument("offsets", f"must rise from 0 to the {rows} rows of keys")
        tokens = np.diff(o).tolist()
    else:
        t = head_tokens.detach().cpu().numpy() if is_torch(head_tokens) else head_tokens
        tokens = [_uint("head_tokens", x) for x in np.asarray(t).reshape(-1).tolist()]
        if sum(tokens) != rows:
            raise invalid_argument("head_tokens", f"sum to {sum(tokens)}, but keys have {rows} rows")
    if not tokens:
        raise invalid_argument("head_tokens", "no head")
    return tokens


def make_job(job_id: int, layer_index: int, keys, values=None, counts=None, *,
             layout: str = "head_major", output_dtype=None, return_assignment: bool = False,
             backend: str = "auto", head_tokens=None, offsets=None, pad_heads: bool = False,
             pad_to: Optional[int] = None, exact_target: bool = False,
             output_layout: Optional[str] = None, timeout: Optional[float] = None,
             priority: Optional[int] = None, region=None, output=None, input_dtype=None,
             key_scale=None, value_scale=None, output_key_scale=None,
             output_value_scale=None, scores=None, queries=None, head_budgets=None,
             centroid_share=None, max_cluster_size=None, log_weight_bound=None,
             fit_block_tokens=None, fit_values=None, query_scale=None, **params) -> Job:
    """The Job of one compress() call. `keys` may be a LayerResult (a previous result sent
    back as it is: its rows, counts, per-head lengths and fp8 scales). fp8 input takes
    key_scale / value_scale (a float, or one per head); an fp8 output_dtype takes static
    output_key_scale / output_value_scale, or none for per-head dynamic ones. With `region` (a SharedRegion)
    the tensors must lie in it and go by reference: the StartJob names them, no slabs. With
    `output` (a ResultSpace) the server writes the result there: no result slabs.
    `scores` (one per input row, shaped as counts) makes a scored job, `queries`
    ([Hq, m, dk] after RoPE) a fitted one; both always go as slabs (docs/scored-jobs.md)."""
    unknown = set(params) - set(PARAM_NAMES)
    if unknown:
        raise TypeError(f"unknown compression parameter(s): {', '.join(sorted(unknown))}")
    if isinstance(keys, LayerResult):
        if values is not None or counts is not None or head_tokens is not None or \
                offsets is not None:
            raise TypeError("compress(result): values, counts, head_tokens and offsets come "
                            "from the result")
        if key_scale is None and keys.key_scales is not None:  # fp8 rows (maybe uint8 codes)
            key_scale, value_scale = keys.key_scales, keys.value_scales
            input_dtype = input_dtype or keys.dtype
        keys, values, counts, layout, offsets = _result_as_input(keys)
    elif values is None:
        raise TypeError("compress() needs keys and values (or a LayerResult)")
    if layout not in _LAYOUTS:
        raise invalid_argument("layout", f"'{layout}' is not head_major or token_major")
    if output_layout is not None and output_layout not in _LAYOUTS:
        raise invalid_argument("output_layout", f"'{output_layout}' is not head_major or "
                               "token_major")
    if backend not in _BACKENDS:
        raise invalid_argument("backend", f"'{backend}' is not one of {', '.join(_BACKENDS)}")
    fp8 = dtype_code(input_dtype, "input_dtype")
    if fp8 and fp8 not in FP8_DTYPES:
        raise invalid_argument("input_dtype", "names the fp8 format of uint8 codes: "
                               "fp8_e4m3 or fp8_e5m2")
    k, kind = to_wire(keys, "keys", fp8)
    v, _ = to_wire(values, "values", fp8)
    ragged = head_tokens is not None or offsets is not None
    rank = 2 if ragged else 3
    what = "2-D [rows, d] (ragged input)" if ragged else f"3-D ({layout})"
    for name, array in (("keys", k), ("values", v)):
        if len(array.shape) != rank:
            raise invalid_argument(name, f"must be {what}, got shape {array.shape}")
    if k.dtype != v.dtype:
        raise invalid_argument("values", "must have the dtype of keys")
    if k.shape[:-1] != v.shape[:-1]:
        raise invalid_argument("values", f"shape {v.shape} does not match keys {k.shape}")
    tokens_per_head: list = []
    if ragged:
        if layout != "head_major":
            raise invalid_argument("layout", "ragged input (head_tokens / offsets) is head-major")
        tokens_per_head = _head_tokens(head_tokens, offsets, k.shape[0])
        heads, tokens = len(tokens_per_head), max(tokens_per_head)
    elif layout == "head_major":
        heads, tokens = k.shape[0], k.shape[1]
    else:
        heads, tokens = k.shape[1], k.shape[0]
    tensors = [(pb.TENSOR_KEYS, k), (pb.TENSOR_VALUES, v)]
    if counts is not None:
        c = counts_to_wire(counts)
        if c.shape != k.shape[:-1]:
            raise invalid_argument("counts", f"shape {c.shape} does not match keys' {k.shape[:-1]}")
        tensors.append((pb.TENSOR_COUNTS, c))
    start = pb.StartJob(
        job_id=job_id, layer_index=layer_index, num_heads=heads, num_tokens=tokens,
        key_dim=k.shape[-1], value_dim=v.shape[-1], dtype=k.dtype, layout=_LAYOUTS[layout],
        has_counts=counts is not None, params=compression_params(**params),
        return_assignment=bool(return_assignment),
        output_dtype=dtype_code(output_dtype, "output_dtype"), backend=_BACKENDS[backend],
        head_tokens=tokens_per_head, pad_heads=bool(pad_heads), exact_target=bool(exact_target))
    for name, scale, into in (("key_scale", key_scale, start.key_scales),
                              ("value_scale", value_scale, start.value_scales),
                              ("output_key_scale", output_key_scale, start.output_key_scales),
                              ("output_value_scale", output_value_scale,
                               start.output_value_scales)):
        if scale is not None:
            into.extend(_scales(name, scale))
    if k.dtype in FP8_DTYPES and (not start.key_scales or not start.value_scales):
        raise invalid_argument("key_scale" if not start.key_scales else "value_scale",
                               f"is needed for {pb.DType.Name(k.dtype)} input (a float, or one "
                               "per head; vLLM's k_scale / v_scale)")
    if pad_to is not None:
        start.pad_to = _uint("pad_to", pad_to)
    if output_layout is not None:
        start.output_layout = _LAYOUTS[output_layout]
    if region is not None:
        _by_reference(region, tensors, start)
        tensors = []
    tensors += _scored_and_fitted(start, k.shape[:-1], heads, k.shape[-1], scores, queries,
                                  head_budgets, centroid_share, max_cluster_size,
                                  log_weight_bound, fit_block_tokens, fit_values, query_scale)
    if output is not None:
        _output_to(output, start, max(tokens, pad_to or 0))
    if timeout is not None:
        if not timeout > 0:
            raise invalid_argument("timeout", f"must be positive seconds (got {timeout!r})")
        start.timeout_ms = _uint("timeout", max(1, math.ceil(float(timeout) * 1000)))
    if priority is not None:
        if isinstance(priority, bool) or int(priority) != priority or \
                not -2**31 <= int(priority) < 2**31:
            raise invalid_argument("priority", f"must be an int32 (got {priority!r})")
        start.priority = int(priority)
    return Job(job_id, layer_index, start, tensors, kind, output)


def _scored_and_fitted(start: pb.StartJob, rows_shape: tuple, heads: int, key_dim: int,
                       scores, queries, head_budgets, centroid_share, max_cluster_size,
                       log_weight_bound, fit_block_tokens, fit_values, query_scale) -> list:
    """The StartJob fields and slab tensors of a scored / budgeted / fitted job."""
    tensors = []
    if scores is not None:
        tensors.append((pb.TENSOR_SCORES, floats_to_wire(scores, "scores", rows_shape)))
        start.has_scores = True
    if head_budgets is not None:
        b = head_budgets.detach().cpu().numpy() if is_torch(head_budgets) else head_budgets
        start.head_budgets.extend(_uint("head_budgets", x, 1)
                                  for x in np.asarray(b).reshape(-1).tolist())
    if centroid_share is not None:
        start.selection.centroid_share = float(centroid_share)
    if max_cluster_size is not None:
        start.selection.max_cluster_size = _uint("max_cluster_size", max_cluster_size)
    fit_given = any(x is not None for x in (log_weight_bound, fit_block_tokens, fit_values,
                                            query_scale))
    if queries is None:
        if fit_given:
            raise invalid_argument("queries", "the fit's options need reference queries")
        return tensors
    q = floats_to_wire(queries, "queries")
    if len(q.shape) != 3 or q.shape[2] != key_dim:
        raise invalid_argument("queries", f"must be [query_heads, queries, {key_dim}] (the keys' "
                               f"dim), got shape {q.shape}")
    if q.shape[0] == 0 or q.shape[0] % heads != 0:
        raise invalid_argument("queries", f"has {q.shape[0]} query heads, not a multiple of the "
                               f"{heads} KV heads")
    fit = start.fit
    fit.num_query_heads, fit.num_queries = q.shape[0], q.shape[1]
    if log_weight_bound is not None:
        fit.log_weight_bound = float(log_weight_bound)
    if fit_block_tokens is not None:
        fit.block_tokens = _uint("fit_block_tokens", fit_block_tokens, 1)
    if fit_values is not None:
        fit.fit_values = bool(fit_values)
    if query_scale is not None:
        fit.query_scale = float(query_scale)
    tensors.append((pb.TENSOR_QUERIES, q))
    return tensors


def _scales(name: str, scale) -> list:
    """An fp8 scale argument (a number, a sequence, a numpy array or a tensor) as floats."""
    if is_torch(scale):
        scale = scale.detach().float().cpu().numpy()
    values = np.asarray(scale, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise invalid_argument(name, "is empty (give a float, or one per head)")
    return [float(x) for x in values]


def _by_reference(region, tensors: list, start: pb.StartJob) -> None:
    """Names the job's input tensors as spans of `region` in `start` (region_input)."""
    fields = {pb.TENSOR_KEYS: ("keys", start.region_input.keys),
              pb.TENSOR_VALUES: ("values", start.region_input.values),
              pb.TENSOR_COUNTS: ("counts", start.region_input.counts)}
    for tensor, array in tensors:
        name, span = fields[tensor]
        where = region.span_of(array.data)
        if where is None:
            raise invalid_argument(name, "is not inside the shared region (make it with "
                                   "region.array(), C-contiguous, in the wire dtype)")
        span.region_id, span.offset, span.bytes = region.region_id, where[0], where[1]


def _output_to(space, start: pb.StartJob, length: int) -> None:
    """Names `space` (a ResultSpace) as the job's region_output, after checking that it has
    room for the job's largest result (a clear error here rather than a JobError later)."""
    if not isinstance(space, ResultSpace):
        raise invalid_argument("output", f"must be a ResultSpace (region.result_space(...)), "
                               f"got {type(space).__name__}")
    if space.region.region_id is None:
        raise invalid_argument("output", "its region is closed")
    dtype = start.output_dtype or start.dtype
    if dtype != space.dtype:
        raise invalid_argument("output", f"has room for {pb.DType.Name(space.dtype)} rows, "
                               f"the job returns {pb.DType.Name(dtype)}")
    entries = None  # assignment entries, when the job returns one
    if start.return_assignment:
        if space.assignment is None:
            raise invalid_argument("output", "has no room for the assignment "
                                   "(result_space(..., return_assignment=True))")
        entries = sum(start.head_tokens) if start.head_tokens else \
            start.num_heads * start.num_tokens
    need = largest_result_bytes(start.num_heads, length, start.key_dim, start.value_dim, dtype,
                                entries)
    for name, size in need.items():
        have = getattr(space, name).nbytes
        if have < size:
            raise invalid_argument("output", f"{name} needs {size} bytes for this job, the "
                                   f"space has {have} (a result_space of the job's shape)")
    out = start.region_output
    space.fill(out.out_keys, out.out_values, out.out_counts,
               out.assignment if start.return_assignment else None)


def _result_as_input(result: LayerResult) -> tuple:
    """(keys, values, counts, layout, offsets) that send `result`'s rows back as they are:
    token-major results as token-major input [L, H, d]; head-major ones as ragged input
    (padding rows have count 0 and are ignored by the server)."""
    if result.layout == "token_major":
        return result.keys, result.values, result.counts, "token_major", None
    return result.keys, result.values, result.counts, "head_major", result.offsets


@dataclass
class _Partial:
    header: pb.JobResult
    buffers: dict = field(default_factory=dict)  # pb.Tensor -> np.uint8 array
    missing: int = 0


class Assembler:
    """Reassembles the replies of one stream. feed() takes each decoded reply and returns
    the (job_id, LayerResult | CompressError) it completed, or None."""

    def __init__(self, jobs: dict, memory: ResultMemory):
        self.jobs = jobs  # job_id -> Job, for the layer index and the caller's kind
        self.memory = memory  # where result tensors are received
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
            return error.job_id, make_error(
                error.code, error.message, field=error.field or None, job_id=error.job_id,
                layer=job.layer_index if job else None,
                head=error.head if error.HasField("head") else None,
                token=error.token if error.HasField("token") else None)
        return None

    def _header(self, header: pb.JobResult):
        sizes = {pb.TENSOR_OUT_KEYS: header.out_keys_bytes,
                 pb.TENSOR_OUT_VALUES: header.out_values_bytes,
                 pb.TENSOR_OUT_COUNTS: header.out_counts_bytes,
                 pb.TENSOR_OUT_LOG_WEIGHTS: header.out_log_weights_bytes,
                 pb.TENSOR_ASSIGNMENT: header.assignment_bytes}
        if header.in_region:
            # Written into the job's ResultSpace: the header is the whole reply.
            job = self.jobs.get(header.job_id)
            space = job.output if job is not None else None
            if space is None:
                return header.job_id, make_error(
                    grpc.StatusCode.DATA_LOSS, "the server wrote a result to a region this "
                    "job did not name", job_id=header.job_id)
            arrays = {pb.TENSOR_OUT_KEYS: space.keys, pb.TENSOR_OUT_VALUES: space.values,
                      pb.TENSOR_OUT_COUNTS: space.counts, pb.TENSOR_ASSIGNMENT: space.assignment,
                      pb.TENSOR_OUT_LOG_WEIGHTS: getattr(space, "log_weights", None)}
            buffers = {t: (arrays[t][:n] if arrays[t] is not None else np.empty(0, np.uint8))
                       for t, n in sizes.items()}
            self.partial[header.job_id] = _Partial(header, buffers, 0)
            return self._finish(header.job_id)
        part = _Partial(header, {t: self.memory.buffer(n) for t, n in sizes.items()},
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
            rows = b[pb.TENSOR_ASSIGNMENT].view(np.int32)
            # Ragged input: one entry per input row, heads one after another ([sum]).
            assignment = ints_from_wire(rows if job.ragged else rows.reshape(heads, tokens), kind)
        token_major = header.layout == pb.LAYOUT_TOKEN_MAJOR
        # Token-major: rows [L, H, d], counts [L, H]; head-major: [total, d], [total].
        lead = (header.padded_length, heads) if token_major else (-1,)
        log_weights = None
        if header.out_log_weights_bytes:
            log_weights = b[pb.TENSOR_OUT_LOG_WEIGHTS].view(np.float32).reshape(lead).copy()
            if kind.torch:
                import torch

                log_weights = torch.from_numpy(log_weights).to(kind.device)
        result = LayerResult(
            keys=rows_from_wire(b[pb.TENSOR_OUT_KEYS], header.dtype, lead + (header.key_dim,), kind),
            values=rows_from_wire(b[pb.TENSOR_OUT_VALUES], header.dtype,
                                  lead + (header.value_dim,), kind),
            counts=ints_from_wire(b[pb.TENSOR_OUT_COUNTS].view(np.uint32).reshape(lead), kind),
            offsets=ints_from_wire(np.asarray(header.offsets, dtype=np.int64), kind),
            assignment=assignment, layer_index=header.layer_index, num_heads=heads,
            num_tokens=tokens, backend=header.backend, passes_run=header.passes_run,
            compute_seconds=header.compute_seconds, queue_seconds=header.queue_seconds,
            layout="token_major" if token_major else "head_major",
            padded_length=header.padded_length, target_tokens=header.target_tokens,
            target_reached=header.target_reached,
            head_entries=np.asarray(header.head_entries, dtype=np.int64),
            head_input_tokens=np.asarray(header.head_input_tokens, dtype=np.int64),
            head_tokens=np.asarray(header.head_tokens, dtype=np.int64),
            stop_reasons=tuple(STOP_REASONS.get(r, "unspecified") for r in header.stop_reasons),
            dtype=pb.DType.Name(header.dtype)[len("DTYPE_"):].lower(),
            key_scales=np.asarray(header.key_scales, np.float32) if header.key_scales else None,
            value_scales=(np.asarray(header.value_scales, np.float32)
                          if header.value_scales else None),
            head_budgets=(np.asarray(header.head_budgets, np.int64)
                          if header.head_budgets else None),
            head_exact_entries=(np.asarray(header.head_exact_entries, np.int64)
                                if header.head_exact_entries else None),
            log_weights=log_weights)
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
    """A compress_layers item as (args, options): (keys, values), (keys, values, counts), a
    LayerResult (sent back as it is), or a dict with keys/values[/counts] and any per-layer
    option (head_tokens / offsets of ragged input, pad_to, priority, ...)."""
    if isinstance(layer, LayerResult):
        return (layer,), {}
    if isinstance(layer, dict):
        options = dict(layer)
        args = (options.pop("keys"), options.pop("values"), options.pop("counts", None))
        return args, options
    if len(layer) == 2:
        return (layer[0], layer[1], None), {}
    if len(layer) == 3:
        return tuple(layer), {}
    raise TypeError("a layer is (keys, values), (keys, values, counts), a LayerResult or a dict")
