"""CentroidKV's Python client: compress an LLM's KV cache through a CentroidKV server.

    import centroidkv
    client = centroidkv.Client("127.0.0.1:50051")
    result = client.compress(keys, values, target_ratio=0.25)   # keys [H, n, dk]
    result.keys, result.values, result.counts, result.offsets   # heads concatenated

centroidkv.Sequence compresses a sequence online while it decodes (splices per layer,
placed with CacheRows). centroidkv.torch has the count-aware attention helpers, centroidkv.transformers a cache for
Hugging Face transformers' generate(). The wire API is proto/centroidkv/v1/centroidkv.proto.
"""
from importlib import metadata as _metadata

from .client import Client
from .errors import (CancelledError, CompressError, DeadlineExceededError,
                     FailedPreconditionError, InternalError, InvalidArgumentError,
                     PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError,
                     UnavailableError)
from .result import HeadResult, LayerResult, Limits, ServerInfo
from .sequence import CacheRows, Sequence, Splice

try:  # the repository's VERSION, written into the package's metadata by setup.py
    __version__ = _metadata.version("centroidkv")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"

__all__ = ["Client", "AsyncClient", "CompressError", "InvalidArgumentError",
           "ResourceExhaustedError", "FailedPreconditionError", "UnavailableError",
           "DeadlineExceededError", "CancelledError", "InternalError", "UnauthenticatedError",
           "PermissionDeniedError", "LayerResult",
           "HeadResult", "ServerInfo", "Limits", "Sequence", "CacheRows", "Splice"]


def __getattr__(name):
    if name == "AsyncClient":  # grpc.aio is imported only by those who use it
        from .aio import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'centroidkv' has no attribute {name!r}")
