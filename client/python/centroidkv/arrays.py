"""Caller arrays <-> wire bytes: numpy arrays and torch tensors (fp32, fp16, bf16, fp8) in,
the same kind out. torch is imported only when the caller passes a tensor.

fp8 (OCP E4M3 / E5M2, one byte per element, standing for value x scale): torch
float8_e4m3fn / float8_e5m2 tensors, ml_dtypes float8 arrays, or uint8 numpy arrays of the
codes with input_dtype="fp8_e4m3" / "fp8_e5m2". fp8 results come back as the same kind
(uint8 code arrays when the caller sent uint8 codes and ml_dtypes is not installed).

On the way out an array becomes a flat uint8 view of its own memory (no copy when it is
C-contiguous on the CPU); on the way in, result bytes land in a preallocated numpy buffer
that the returned arrays / tensors share.
"""
from __future__ import annotations

import mmap
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .errors import invalid_argument
from .v1 import centroidkv_pb2 as pb

DTYPE_NAMES = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16,
               "bfloat16": pb.DTYPE_BFLOAT16, "fp8_e4m3": pb.DTYPE_FP8_E4M3,
               "fp8_e5m2": pb.DTYPE_FP8_E5M2}
DTYPE_SIZE = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2,
              pb.DTYPE_FP8_E4M3: 1, pb.DTYPE_FP8_E5M2: 1}
FP8_DTYPES = (pb.DTYPE_FP8_E4M3, pb.DTYPE_FP8_E5M2)
# numpy (ml_dtypes) and torch names of the fp8 formats.
_FP8_NAMES = {"float8_e4m3fn": pb.DTYPE_FP8_E4M3, "float8_e5m2": pb.DTYPE_FP8_E5M2}
_NUMPY_DTYPE = {pb.DTYPE_FLOAT32: np.dtype(np.float32), pb.DTYPE_FLOAT16: np.dtype(np.float16)}


def is_torch(x: Any) -> bool:
    return "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)


@dataclass
class Kind:
    """What the caller passed, so results come back the same way."""

    torch: bool
    device: Any = None            # torch device of the input
    numpy_bf16: Any = None        # the numpy bfloat16 dtype (ml_dtypes) the caller used
    numpy_fp8: bool = False       # the caller sent ml_dtypes float8 arrays


@dataclass
class WireArray:
    dtype: int                    # pb.DType (or 0 for counts)
    shape: tuple
    data: memoryview              # flat, C-contiguous bytes of the array
    owner: Any                    # keeps `data`'s memory alive


def dtype_code(dtype: Any, field: str) -> int:
    """pb.DType of a dtype given as a name, a numpy dtype or a torch dtype."""
    if dtype is None:
        return pb.DTYPE_UNSPECIFIED
    name = str(dtype).replace("torch.", "")
    name = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
            "fp16": "float16", "fp8": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
            "float8_e5m2": "fp8_e5m2"}.get(name, name)
    if name not in DTYPE_NAMES:
        raise invalid_argument(field, f"dtype {dtype} is not one of float32, float16, "
                               "bfloat16, fp8_e4m3, fp8_e5m2")
    return DTYPE_NAMES[name]


_SUPPORTED = "float32, float16, bfloat16 or fp8 (float8_e4m3fn, float8_e5m2)"


def to_wire(x: Any, field: str, fp8: int = 0) -> tuple[WireArray, Kind]:
    """keys / values: a float32, float16, bfloat16 or fp8 array or tensor; `fp8` (a pb fp8
    dtype) reads a uint8 numpy array as fp8 codes."""
    if is_torch(x):
        torch = sys.modules["torch"]
        kind = Kind(torch=True, device=x.device)
        code = {torch.float32: pb.DTYPE_FLOAT32, torch.float16: pb.DTYPE_FLOAT16,
                torch.bfloat16: pb.DTYPE_BFLOAT16}.get(x.dtype)
        if code is None:
            code = _FP8_NAMES.get(str(x.dtype).replace("torch.", ""))
        if code is None and fp8 and x.dtype == torch.uint8:
            code = fp8
        if code is None:
            raise invalid_argument(field, f"dtype {x.dtype} is not {_SUPPORTED}")
        if fp8 and code != fp8:
            raise invalid_argument(field, f"dtype {x.dtype} is not the input_dtype "
                                   f"{pb.DType.Name(fp8)}")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        flat = t.reshape(-1).view(torch.uint8).numpy()
        return WireArray(code, tuple(x.shape), memoryview(flat), t), kind
    a = np.asarray(x)
    kind = Kind(torch=False)
    if a.dtype == np.float32 or a.dtype == np.float16:
        code = DTYPE_NAMES[a.dtype.name]
    elif a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:  # ml_dtypes.bfloat16
        code = pb.DTYPE_BFLOAT16
        kind.numpy_bf16 = a.dtype
    elif a.dtype.name in _FP8_NAMES and a.dtype.itemsize == 1:  # ml_dtypes float8
        code = _FP8_NAMES[a.dtype.name]
        kind.numpy_fp8 = True
    elif fp8 and a.dtype == np.uint8:
        code = fp8
    else:
        raise invalid_argument(field, f"dtype {a.dtype} is not {_SUPPORTED} (uint8 fp8 codes "
                               "need input_dtype='fp8_e4m3' or 'fp8_e5m2')")
    if fp8 and code != fp8:
        raise invalid_argument(field, f"dtype {a.dtype} is not the input_dtype "
                               f"{pb.DType.Name(fp8)}")
    a = np.ascontiguousarray(a)
    return WireArray(code, a.shape, memoryview(a.reshape(-1).view(np.uint8)), a), kind


def counts_to_wire(x: Any) -> WireArray:
    """counts: a 2-D array of non-negative integers, sent as uint32."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "ui":
        raise invalid_argument("counts", f"dtype {a.dtype} is not an integer type")
    if a.dtype != np.uint32:
        if a.size and (a.min() < 0 or a.max() > 0xFFFFFFFF):
            raise invalid_argument("counts", "values must be in [0, 2^32)")
        a = a.astype(np.uint32)
    a = np.ascontiguousarray(a)
    return WireArray(0, a.shape, memoryview(a.reshape(-1).view(np.uint8)), a)


def floats_to_wire(x: Any, field: str, shape: Optional[tuple] = None) -> WireArray:
    """Scores or reference queries: any real array or tensor, sent as float32; `shape`, when
    given, is the shape it must have."""
    if is_torch(x):
        x = x.detach().float().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
        raise invalid_argument(field, f"dtype {a.dtype} is not a real number type")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if shape is not None and a.shape != tuple(shape):
        raise invalid_argument(field, f"must have shape {tuple(shape)}, got {a.shape}")
    return WireArray(pb.DTYPE_FLOAT32, a.shape, memoryview(a.reshape(-1).view(np.uint8)), a)


# Result buffers of at least this size come from ResultMemory: mapped with their pages
# populated at once, and recycled when the caller has dropped every array made from them.
# A fresh np.empty buffer is filled page fault by page fault, each fault also asking for a
# huge page (numpy madvises MADV_HUGEPAGE, and with THP "madvise" the kernel compacts
# memory on the spot): measured on the 2-vCPU VM, 68-95 ms to fill 16 MiB from np.empty,
# 15-20 ms from a fresh populated mapping, 2 ms into memory already mapped.
POOLED_MIN_BYTES = 1 << 20
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000 if sys.platform == "linux" else 0)


class ResultMemory:
    """Memory for received result tensors. A buffer of at least POOLED_MIN_BYTES is an
    anonymous mapping (size rounded up to a MiB); when the last array or tensor made from
    it is gone, the mapping is kept for the next result of that size, up to `keep_bytes` in
    all (0: never kept). Thread-safe (arrays die on any thread)."""

    def __init__(self, keep_bytes: int):
        self.keep_bytes = keep_bytes
        self._free: dict = {}  # rounded size -> [mmap]
        self._kept = 0
        self._lock = threading.Lock()

    def buffer(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of `nbytes`, alive as long as any array made from it."""
        if nbytes < POOLED_MIN_BYTES:
            return np.empty(nbytes, np.uint8)
        size = -(-nbytes // POOLED_MIN_BYTES) * POOLED_MIN_BYTES
        memory = None
        with self._lock:
            free = self._free.get(size)
            if free:
                memory = free.pop()
                self._kept -= size
        if memory is None:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE
            memory = mmap.mmap(-1, size, flags=flags)
        array = np.frombuffer(memory, np.uint8, count=nbytes)
        # numpy's own memoryview of the mapping is the base every view, reshape and
        # torch.from_numpy of `array` keeps alive: when it goes, the mapping is free.
        weakref.finalize(array.base, self._give_back, memory, size).atexit = False
        return array

    def _give_back(self, memory: mmap.mmap, size: int) -> None:
        with self._lock:
            if self._kept + size <= self.keep_bytes:
                self._free.setdefault(size, []).append(memory)
                self._kept += size
                return
        memory.close()

    @property
    def kept_bytes(self) -> int:
        return self._kept

    def close(self) -> None:
        """Unmaps what is kept and keeps nothing from now on (results alive stay valid)."""
        with self._lock:
            self.keep_bytes = 0
            free, self._free, self._kept = self._free, {}, 0
        for memories in free.values():
            for memory in memories:
                memory.close()


def rows_from_wire(buf: np.ndarray, dtype: int, shape: tuple, kind: Kind):
    """Keys or values of `shape` ([total, dim], or [L, H, dim]) from the received bytes, in
    the caller's kind."""
    if kind.torch:
        torch = sys.modules["torch"]
        tdtype = {pb.DTYPE_FLOAT32: torch.float32, pb.DTYPE_FLOAT16: torch.float16,
                  pb.DTYPE_BFLOAT16: torch.bfloat16, pb.DTYPE_FP8_E4M3: torch.float8_e4m3fn,
                  pb.DTYPE_FP8_E5M2: torch.float8_e5m2}[dtype]
        t = torch.from_numpy(buf).view(tdtype).reshape(shape)
        return t if kind.device is None or kind.device.type == "cpu" else t.to(kind.device)
    if dtype == pb.DTYPE_BFLOAT16:
        bf16 = kind.numpy_bf16 or _ml_bfloat16()
        if bf16 is not None:
            return buf.view(bf16).reshape(shape)
        # No numpy bfloat16 type installed: widen exactly to float32 (bf16 is its top half).
        return (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype in FP8_DTYPES:
        # ml_dtypes float8 to a caller who sent those, else uint8 codes (result.float_keys()
        # widens either).
        fp8 = _ml_fp8(dtype) if kind.numpy_fp8 else None
        return buf.view(fp8 if fp8 is not None else np.uint8).reshape(shape)
    return buf.view(_NUMPY_DTYPE[dtype]).reshape(shape)


def fp8_to_float32(codes: np.ndarray, dtype: int) -> np.ndarray:
    """fp8 codes (uint8, any shape) widened exactly to float32, from the formats'
    definitions (OCP: E4M3 without infinities, NaN 0x7f/0xff; E5M2 as IEEE)."""
    c = np.asarray(codes).view(np.uint8).astype(np.int32)
    mantissa_bits, bias = (3, 7) if dtype == pb.DTYPE_FP8_E4M3 else (2, 15)
    magnitude = c & 0x7F
    exponent = magnitude >> mantissa_bits
    mantissa = magnitude & ((1 << mantissa_bits) - 1)
    normal = np.ldexp(((1 << mantissa_bits) + mantissa).astype(np.float64),
                      exponent - bias - mantissa_bits)
    subnormal = np.ldexp(mantissa.astype(np.float64), 1 - bias - mantissa_bits)
    value = np.where(exponent == 0, subnormal, normal)
    if dtype == pb.DTYPE_FP8_E4M3:
        value = np.where(magnitude == 0x7F, np.nan, value)
    else:
        top = exponent == 0x1F
        value = np.where(top & (mantissa == 0), np.inf, np.where(top, np.nan, value))
    return np.where(c & 0x80, -value, value).astype(np.float32)


def _ml_fp8(dtype: int) -> Optional[np.dtype]:
    try:
        import ml_dtypes  # noqa: F401 (optional: numpy has no fp8 type of its own)
    except ImportError:
        return None
    module = sys.modules["ml_dtypes"]
    return np.dtype(module.float8_e4m3fn if dtype == pb.DTYPE_FP8_E4M3 else module.float8_e5m2)


def ints_from_wire(a: np.ndarray, kind: Kind):
    """counts / offsets / assignment: numpy as received; torch as int64 (what indexing and
    arithmetic take)."""
    if kind.torch:
        torch = sys.modules["torch"]
        t = torch.from_numpy(a.astype(np.int64, copy=False))
        return t if kind.device is None or kind.device.type == "cpu" else t.to(kind.device)
    return a


def _ml_bfloat16() -> Optional[np.dtype]:
    module = sys.modules.get("ml_dtypes")
    return np.dtype(module.bfloat16) if module is not None else None
