"""Same-node shared memory for the Python client: a region of this process's
memory, a file under /dev/shm mapped here and registered with the server, whose numpy
arrays (or torch CPU tensors, torch.from_numpy of them) a job may name by reference:

    with client.shared_region(64 << 20) as region:
        keys = region.array((8, 4096, 128), np.float16)      # zero-copy views
        values = region.array((8, 4096, 128), np.float16)
        keys[:] = ...; values[:] = ...                         # write the KV in place
        result = client.compress(keys, values, region=region)  # no input slabs sent

With AsyncClient the region is awaited and closed asynchronously (AsyncSharedRegion):

    async with await aclient.shared_region(64 << 20) as region:
        keys = region.array(...); values = region.array(...)
        result = await aclient.compress(keys, values, region=region)

Only the StartJob crosses the socket; the server reads the tensors in place. The result
comes back as slabs, or into the region too when the job names a ResultSpace:

        out = region.result_space(8, 4096, 128, 128, np.float16)  # room for any result
        result = client.compress(keys, values, region=region, output=out)
        # result.keys / values / counts are views of `out`: no result slabs were sent, and
        # the server's cpu backend wrote the rows there itself. They stay valid until `out`
        # is named by another job.

Only over a unix socket to a server with shared memory on (ServerInfo.shared_memory);
elsewhere registering fails with FailedPreconditionError.
"""
from __future__ import annotations

import itertools
import mmap
import os
from typing import Optional

import numpy as np

from .arrays import DTYPE_SIZE, dtype_code
from .errors import invalid_argument

_SHM_DIR = "/dev/shm"
_ALIGNMENT = 64
_names = itertools.count()


class SharedRegion:
    """A registered shared memory region (Client.shared_region). Arrays are carved from it
    in order (each 64-byte aligned) with array(); close() (or the with block's end)
    unregisters, unmaps and removes the file. The arrays must not be used after close()."""

    def __init__(self, client, size: int, *, register: bool = True):
        """Creates, sizes and maps the file; registers it with `client` unless `register`
        is False (AsyncSharedRegion registers it with an await)."""
        if size <= 0:
            raise invalid_argument("size", f"must be positive (got {size})")
        self.name = f"/ckv-py-{os.getpid()}-{next(_names)}"
        self.size = int(size)
        self._client = client
        self._cursor = 0
        self.region_id: Optional[int] = None
        path = _SHM_DIR + self.name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o660)
        try:
            os.fchmod(fd, 0o660)  # a sidecar server of another uid maps it via the group
            os.ftruncate(fd, self.size)
            # Reserve the memory now: a /dev/shm too small is an OSError here, not a SIGBUS
            # at the first write of a page (here or in the server).
            os.posix_fallocate(fd, 0, self.size)
            self._map = mmap.mmap(fd, self.size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._base = self._bytes.__array_interface__["data"][0]
        if register:
            try:
                self.region_id = client.register_region(self.name, 0, self.size)
            except BaseException:
                self._release()
                raise

    def array(self, shape, dtype) -> np.ndarray:
        """A new C-contiguous array of `shape` and `dtype` in the region (zero-filled at
        first use; not zeroed when the region was written before)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = -(-self._cursor // _ALIGNMENT) * _ALIGNMENT
        if start + nbytes > self.size:
            raise invalid_argument("shape", f"{nbytes} bytes do not fit the region's "
                                   f"{self.size - start} free bytes")
        self._cursor = start + nbytes
        return self._bytes[start:start + nbytes].view(dtype).reshape(shape)

    def result_space(self, heads: int, tokens: int, key_dim: int, value_dim: int,
                     dtype, *, pad_to: int = 0, return_assignment: bool = False):
        """A ResultSpace in the region: room for the result of any job of `heads` heads of
        `tokens` tokens (key_dim / value_dim wide) whose rows come back in `dtype` (the
        job's output_dtype, else its input dtype), padded to `pad_to` if asked, with the
        assignment if `return_assignment`. compress(..., output=space) then receives its
        result here instead of as slabs."""
        code = dtype_code(dtype, "dtype")
        if code == 0:
            raise invalid_argument("dtype", "must be float32, float16, bfloat16, fp8_e4m3 or "
                                   "fp8_e5m2")
        for name, value in (("heads", heads), ("tokens", tokens), ("key_dim", key_dim),
                            ("value_dim", value_dim)):
            if int(value) <= 0:
                raise invalid_argument(name, f"must be positive (got {value})")
        sizes = largest_result_bytes(int(heads), max(int(tokens), int(pad_to)), int(key_dim),
                                     int(value_dim), code,
                                     int(heads) * int(tokens) if return_assignment else None)
        buffers = {name: self.array((size,), np.uint8) for name, size in sizes.items()}
        return ResultSpace(self, code, keys=buffers["keys"], values=buffers["values"],
                           counts=buffers["counts"], assignment=buffers.get("assignment"))

    def span_of(self, data: memoryview) -> Optional[tuple]:
        """(offset, bytes) of a flat byte view inside the region, or None."""
        view = np.frombuffer(data, dtype=np.uint8)
        address = view.__array_interface__["data"][0]
        offset = address - self._base
        if offset < 0 or offset + view.nbytes > self.size:
            return None
        return offset, view.nbytes

    def close(self) -> None:
        if self.region_id is not None:
            try:
                self._client.unregister_region(self.region_id)
            except Exception:  # noqa: BLE001 - the server may be gone; it unmaps on exit
                pass
            self.region_id = None
        self._release()

    def _release(self) -> None:
        if getattr(self, "_map", None) is None:
            return
        self._bytes = None
        try:
            self._map.close()
        except BufferError:
            pass  # arrays still refer to it: the mapping goes with them
        self._map = None
        try:
            os.unlink(_SHM_DIR + self.name)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def largest_result_bytes(heads: int, rows_per_head: int, key_dim: int, value_dim: int,
                         dtype: int, assignment_entries: Optional[int]) -> dict:
    """Bytes of each tensor of a job's largest result (the C++ MaxResultTensorBytes):
    keys, values and counts for `rows_per_head` rows of every head (the tokens, or pad_to
    when larger) in `dtype` (a pb.DType), and the assignment's int32 entries (one per input
    token) when `assignment_entries` is not None."""
    rows = heads * rows_per_head
    element = DTYPE_SIZE[dtype]
    sizes = {"keys": rows * key_dim * element, "values": rows * value_dim * element,
             "counts": rows * 4}
    if assignment_entries is not None:
        sizes["assignment"] = assignment_entries * 4
    return sizes


class ResultSpace:
    """Room in a SharedRegion for one job's result at a time (SharedRegion.result_space):
    the server writes the rows, counts and assignment here and sends only the header; the
    LayerResult's arrays are views of this memory, valid until the space is named again."""

    def __init__(self, region: SharedRegion, dtype: int, *, keys: np.ndarray,
                 values: np.ndarray, counts: np.ndarray, assignment: Optional[np.ndarray]):
        self.region = region
        self.dtype = dtype  # pb.DType of the rows it has room for
        self.keys, self.values, self.counts, self.assignment = keys, values, counts, assignment

    def fill(self, span_keys, span_values, span_counts, span_assignment) -> None:
        """Names this space's buffers in a StartJob's region_output spans."""
        pairs = [(self.keys, span_keys), (self.values, span_values), (self.counts, span_counts)]
        if span_assignment is not None:
            pairs.append((self.assignment, span_assignment))
        for array, span in pairs:
            offset, size = self.region.span_of(array.data)
            span.region_id, span.offset, span.bytes = self.region.region_id, offset, size


class AsyncSharedRegion(SharedRegion):
    """SharedRegion for AsyncClient (AsyncClient.shared_region awaits its registration):
    aclose() (or the async with block's end) unregisters, unmaps and removes the file."""

    def __init__(self, client, size: int):
        super().__init__(client, size, register=False)

    async def _register(self) -> None:
        try:
            self.region_id = await self._client.register_region(self.name, 0, self.size)
        except BaseException:
            self._release()
            raise

    async def aclose(self) -> None:
        if self.region_id is not None:
            try:
                await self._client.unregister_region(self.region_id)
            except Exception:  # noqa: BLE001 - the server may be gone; it unmaps on exit
                pass
            self.region_id = None
        self._release()

    def close(self) -> None:
        raise TypeError("AsyncSharedRegion: use 'await region.aclose()' or 'async with'")

    def __enter__(self):
        raise TypeError("AsyncSharedRegion: use 'async with'")

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
