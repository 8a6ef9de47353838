"""CompressError and its per-gRPC-code subclasses: what every failure of a call raises."""
from __future__ import annotations

import re
from typing import Optional

import grpc

# Field names the server's messages start with or mention (StartJob, CompressionParams,
# TensorSlab), longest first so that "start_job.num_heads" wins over "num_heads".
_PARAMS = ("target_ratio", "target_tokens", "chunk_size", "sink_tokens", "recent_tokens",
           "min_similarity", "tighten_per_pass", "max_passes", "uniform_heads",
           "passthrough_heads")
_START_JOB = ("job_id", "num_heads", "num_tokens", "key_dim", "value_dim", "dtype", "layout",
              "output_dtype", "backend", "head_tokens", "pad_heads", "pad_to", "exact_target",
              "timeout_ms", "priority", "output_layout", "return_assignment", "has_counts",
              "key_scales", "value_scales", "output_key_scales", "output_value_scales")
_FIELDS = sorted(
    [f"start_job.params.{p}" for p in _PARAMS] + [f"start_job.{f}" for f in _START_JOB] +
    ["slab.byte_offset", "slab.tensor", "slab.data", "slab.job_id", "keys", "values", "counts",
     "max_job_bytes", "max_stream_bytes", "max_message_bytes", "max_slab_bytes"] +
    list(_PARAMS) + list(_START_JOB), key=len, reverse=True)
_FIELD_RE = re.compile(r"(?<![A-Za-z0-9_.])(" + "|".join(re.escape(f) for f in _FIELDS) +
                       r")(?![A-Za-z0-9_])")
_JOB_RE = re.compile(r"\bjob (\d+)\b")


class CompressError(Exception):
    """A failed call or job. `code` is the grpc.StatusCode, `message` the server's (or the
    client's) text; `field` the request field at fault as the proto spells it
    ("start_job.params.chunk_size", "keys", "slab.data"; from the server's JobError, else
    the field the message names, or None) and `argument` the keyword of compress() it comes
    from ("chunk_size", "keys", "timeout"); `head` / `token` the head and the entry within
    it at fault where one is (a NaN, a bad count, a passthrough head); `job_id` / `layer` the
    job it concerns when known (None for a failure of the whole stream)."""

    def __init__(self, code: grpc.StatusCode, message: str, *, field: Optional[str] = None,
                 job_id: Optional[int] = None, layer: Optional[int] = None,
                 head: Optional[int] = None, token: Optional[int] = None):
        self.code = code
        self.message = message
        self.field = field or field_named_in(message)
        self.argument = argument_of(self.field)
        self.head = head
        self.token = token
        self.job_id = job_id
        self.layer = layer
        where = [] if layer is None else [f"layer {layer}"]
        where += [] if head is None else [f"head {head}"]
        where += [] if token is None else [f"token {token}"]
        super().__init__(f"{code.name}: {message}" + (f" ({', '.join(where)})" if where else ""))


class UnauthenticatedError(CompressError):
    """No, a malformed or an unknown bearer token (auth_token / $CENTROIDKV_TOKEN)."""


class PermissionDeniedError(CompressError):
    pass


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
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}
_CODE_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def field_named_in(message: str) -> Optional[str]:
    """The first request field a server message names, e.g. 'chunk_size'."""
    match = _FIELD_RE.search(message or "")
    return match.group(1) if match else None


# The compress() keyword a wire field comes from, where it is not the field's last part.
_ARGUMENT_OF_FIELD = {
    "start_job.num_heads": "keys", "start_job.num_tokens": "keys", "start_job.key_dim": "keys",
    "start_job.value_dim": "values", "start_job.dtype": "keys", "start_job.has_counts": "counts",
    "start_job.timeout_ms": "timeout", "slab.data": "slab_bytes", "slab.tensor": "counts",
    "start_job.job_id": None, "slab.job_id": None, "slab.byte_offset": None, "request": None,
}


def argument_of(field: Optional[str]) -> Optional[str]:
    """The keyword argument of compress() that a wire field comes from, e.g.
    'start_job.params.chunk_size' -> 'chunk_size', 'start_job.timeout_ms' -> 'timeout'."""
    if not field:
        return None
    if field in _ARGUMENT_OF_FIELD:
        return _ARGUMENT_OF_FIELD[field]
    return field.rsplit(".", 1)[-1]


def job_named_in(message: str) -> Optional[int]:
    match = _JOB_RE.search(message or "")
    return int(match.group(1)) if match else None


def make_error(code, message: str, **where) -> CompressError:
    """The CompressError subclass for `code` (a grpc.StatusCode or a google.rpc.Code int)."""
    if isinstance(code, int):
        code = _CODE_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return _SUBCLASS.get(code, CompressError)(code, message, **where)


def field_of(argument: str) -> str:
    """The wire field a compress() keyword fills ('chunk_size' -> 'start_job.params.chunk_size')."""
    if argument in _PARAMS:
        return f"start_job.params.{argument}"
    if argument == "timeout":
        return "start_job.timeout_ms"
    if argument in _START_JOB:
        return f"start_job.{argument}"
    return argument


def invalid_argument(argument: str, message: str) -> CompressError:
    """A request the client refuses before sending it: `argument` the keyword at fault (its
    wire field goes in `field`, as the server would name it)."""
    error = InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"{argument}: {message}",
                                 field=field_of(argument))
    error.argument = argument
    return error
