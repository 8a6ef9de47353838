"""CompressError and its per-gRPC-code subclasses: what every failure of a call raises."""
from __future__ import annotations

import re
from typing import Optional

import grpc

# Field names the server's messages start with or mention (StartJob, CompressionParams,
# TensorSlab), longest first so that "start_job.num_heads" wins over "num_heads".
_FIELDS = sorted([
    "start_job.job_id", "start_job.num_heads", "start_job.num_tokens", "start_job.key_dim",
    "start_job.value_dim", "start_job.dtype", "start_job.layout", "start_job.output_dtype",
    "start_job.backend", "slab.byte_offset", "slab.tensor", "slab.data",
    "slab.job_id", "num_heads", "num_tokens", "key_dim", "value_dim", "target_ratio",
    "target_tokens", "chunk_size", "sink_tokens", "recent_tokens", "min_similarity",
    "tighten_per_pass", "max_passes", "uniform_heads", "passthrough_heads", "counts", "keys",
    "values", "dtype", "layout", "output_dtype", "backend", "max_job_bytes",
    "max_stream_bytes", "max_message_bytes"], key=len, reverse=True)
_FIELD_RE = re.compile(r"(?<![A-Za-z0-9_.])(" + "|".join(re.escape(f) for f in _FIELDS) +
                       r")(?![A-Za-z0-9_])")
_JOB_RE = re.compile(r"\bjob (\d+)\b")


class CompressError(Exception):
    """A failed call. `code` is the grpc.StatusCode, `message` the server's (or the client's)
    text, `field` the request field it names (or None), `job_id` / `layer` the job it
    concerns when known (None for a failure of the whole stream before any job)."""

    def __init__(self, code: grpc.StatusCode, message: str, *, field: Optional[str] = None,
                 job_id: Optional[int] = None, layer: Optional[int] = None):
        self.code = code
        self.message = message
        self.field = field if field is not None else field_named_in(message)
        self.job_id = job_id
        self.layer = layer
        where = "" if layer is None else f" (layer {layer})"
        super().__init__(f"{code.name}: {message}{where}")


class InvalidArgumentError(CompressError):
    pass


class ResourceExhaustedError(CompressError):
    pass


class FailedPreconditionError(CompressError):
    pass


class UnavailableError(CompressError):
    pass


class DeadlineExceededError(CompressError):
    pass


class CancelledError(CompressError):
    pass


class InternalError(CompressError):
    pass


_SUBCLASS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.INTERNAL: InternalError,
}
_CODE_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def field_named_in(message: str) -> Optional[str]:
    """The first request field a server message names, e.g. 'chunk_size'."""
    match = _FIELD_RE.search(message or "")
    return match.group(1) if match else None


def job_named_in(message: str) -> Optional[int]:
    match = _JOB_RE.search(message or "")
    return int(match.group(1)) if match else None


def make_error(code, message: str, **where) -> CompressError:
    """The CompressError subclass for `code` (a grpc.StatusCode or a google.rpc.Code int)."""
    if isinstance(code, int):
        code = _CODE_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return _SUBCLASS.get(code, CompressError)(code, message, **where)


def invalid_argument(field: str, message: str) -> CompressError:
    """A request the client refuses before sending it."""
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}",
                                field=field)
