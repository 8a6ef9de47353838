"""AsyncClient: the asyncio API on grpc.aio, the same calls as Client.

Cancelling the task that awaits compress() / compress_layers() (or leaving a
stream_layers() loop) sends CancelJob for every job still in flight, half-closes the stream
and lets the server end it, so the server drops the jobs and frees their memory at once.
Replica sets are retried on UNAVAILABLE as Client does, each job returned exactly once.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable, Optional

import grpc
import grpc.aio

from . import _wire
from ._jobs import Assembler, stream_error
from .client import (PROBE_SECONDS, ClientCore, choose_slab_bytes, get_info_error,
                     waited_in_vain)
from .errors import UnavailableError, make_error
from .result import LayerResult, ServerInfo, server_info_from_proto
from .v1 import centroidkv_pb2 as pb

# How long a cancelled call waits for the server to acknowledge the CancelJobs by ending
# the stream before it cancels the RPC itself.
CANCEL_GRACE_SECONDS = 5.0


class AsyncClient(ClientCore):
    """Like Client (same target forms and options), for asyncio code."""

    def __init__(self, target: str, **options):
        super().__init__(grpc.aio, target, **options)

    async def close(self) -> None:
        await self._channel.close()
        self.memory.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def info(self, refresh: bool = False) -> ServerInfo:
        if self._info is None or refresh:
            timeout = self.connect_timeout if self.timeout is None else self.timeout
            try:
                reply = await self._get_info(pb.GetInfoRequest(), timeout=timeout,
                                             wait_for_ready=True, metadata=self._metadata)
            except grpc.RpcError as e:
                probe = await self._why_no_connection() if waited_in_vain(e) else None
                raise get_info_error(e, probe, timeout) from None
            self._info = server_info_from_proto(reply)
        return self._info

    # -- shared memory (centroidkv.shm) -------------------------------------------------
    async def shared_region(self, size: int):
        """As Client.shared_region: a new AsyncSharedRegion of `size` bytes, registered
        (a unix socket connection only); `async with await aclient.shared_region(n) as r`.
        Raises CompressError (FailedPreconditionError on TCP)."""
        from .shm import AsyncSharedRegion

        region = AsyncSharedRegion(self, size)
        await region._register()
        return region

    async def register_region(self, name: str, offset: int, size: int) -> int:
        """As Client.register_region."""
        try:
            reply = await self._register_region(
                pb.RegisterRegionRequest(name=name, offset=offset, size=size),
                timeout=self.connect_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise make_error(e.code(), e.details() or "", field="name") from None
        return reply.region.region_id

    async def unregister_region(self, region_id: int) -> None:
        """As Client.unregister_region."""
        try:
            await self._unregister_region(pb.UnregisterRegionRequest(region_id=region_id),
                                          timeout=self.connect_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise make_error(e.code(), e.details() or "", field="region_id") from None

    async def compress(self, keys, values=None, counts=None, *, layer_index: int = 0,
                       **options) -> LayerResult:
        """As Client.compress."""
        jobs = self._one_job(keys, values, counts, layer_index, options)
        results = [result async for _, result in self._run(jobs)]
        return results[0]

    async def compress_layers(self, layers: Iterable, *, return_exceptions: bool = False,
                              **options) -> list:
        """As Client.compress_layers (return_exceptions as asyncio.gather's)."""
        jobs = self._make_jobs(layers, options)
        results = {}
        async for job_id, result in self._run(jobs, return_exceptions):
            results[job_id] = result
        return [results[job_id] for job_id in jobs]

    async def stream_layers(self, layers: Iterable, *, return_exceptions: bool = False,
                            **options) -> AsyncIterator[LayerResult]:
        """Yields each layer's LayerResult as it completes (result.layer_index says which);
        with return_exceptions, a job's CompressError in its place (error.layer)."""
        async for _, result in self._run(self._make_jobs(layers, options), return_exceptions):
            yield result

    # -- internals -----------------------------------------------------------------------
    async def _why_no_connection(self) -> Optional[grpc.RpcError]:
        try:
            await self._get_info(pb.GetInfoRequest(), timeout=PROBE_SECONDS,
                                 metadata=self._metadata)
        except grpc.RpcError as probe:
            return probe
        return None

    async def _run(self, jobs: dict, return_exceptions: bool = False):
        slab_bytes = choose_slab_bytes(self._slab_request, await self.info())
        rounds = self._rounds(jobs, return_exceptions)
        while True:
            try:
                async for job_id, outcome in self._stream(rounds.begin(), slab_bytes):
                    done = rounds.finished(job_id, outcome)
                    if done is not None:
                        yield job_id, done
            except UnavailableError as e:
                rounds.stream_failed(e)
            delay = rounds.next_delay()
            if delay is None:
                return
            await asyncio.sleep(delay)

    async def _stream(self, jobs: dict, slab_bytes: int):
        """One Compress stream carrying `jobs`; yields (job_id, LayerResult | CompressError)
        as each finishes. The call is read and written by tasks of its own: grpc.aio cancels
        an RPC whose read or write is cancelled, and a cancelled caller must still be able
        to send CancelJob on it."""
        call = self._compress(timeout=self.timeout, metadata=self._metadata)
        jobs = dict(jobs)  # the caller removes jobs as they are returned
        assembler = Assembler(jobs, self.memory)
        finished, started = set(), set()  # started: StartJob may have reached the server
        stop = []  # set by a cancellation: the writer stops between two messages
        # The write side stays open until every result is in, so that a cancellation can
        # still send CancelJob for jobs whose input has all gone out.
        answered = asyncio.Event()
        outcomes: asyncio.Queue = asyncio.Queue()

        async def write_all():
            for job in list(jobs.values()):
                started.add(job.job_id)
                for request in job.requests(slab_bytes):
                    if stop:
                        return
                    await call.write(request)
            await answered.wait()
            if not stop:
                await call.done_writing()

        async def read_all():
            try:
                while (reply := await call.read()) is not grpc.aio.EOF:
                    done = assembler.feed(reply)
                    if done is not None:
                        finished.add(done[0])
                        if len(finished) == len(jobs):
                            answered.set()
                        outcomes.put_nowait(done)
                outcomes.put_nowait(None)
            except grpc.RpcError as e:
                outcomes.put_nowait(stream_error(e, jobs))
            except BaseException as e:  # noqa: B036 (handed to the consumer)
                outcomes.put_nowait(e)
                raise

        writer = asyncio.ensure_future(write_all())
        reader = asyncio.ensure_future(read_all())
        clean_end = False
        try:
            while (item := await outcomes.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
            await writer  # its errors, if any (a failed write also ends the read side)
            clean_end = True
        finally:
            if not clean_end:
                stop.append(True)
                answered.set()
                await _cancel_jobs(call, writer, reader, started - finished)


async def _cancel_jobs(call, writer, reader, job_ids: set) -> None:
    """Lets the writer stop, tells the server to drop `job_ids` (CancelJob), half-closes and
    waits for the server to end the stream; cancels the RPC if it does not within
    CANCEL_GRACE_SECONDS, or on any error."""
    try:
        await asyncio.wait_for(_drop_and_drain(call, writer, reader, job_ids),
                               CANCEL_GRACE_SECONDS)
    except (asyncio.TimeoutError, asyncio.CancelledError, grpc.RpcError, Exception):
        pass
    finally:
        call.cancel()
        for task in (writer, reader):
            task.cancel()


async def _drop_and_drain(call, writer, reader, job_ids: set) -> None:
    try:
        await writer
    except (asyncio.CancelledError, Exception):
        pass
    if call.done():
        return
    for job_id in sorted(job_ids):
        await call.write(_wire.encode_cancel(job_id))
    await call.done_writing()
    await reader  # drops what still comes, until the server ends the stream
