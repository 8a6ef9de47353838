"""Client: the synchronous API. compress() sends one layer job; compress_layers() sends all
layers of a sequence on one stream, pipelined (the request slabs are produced on gRPC's
sending thread while results are read here as they finish), and returns them in order.

Against a replica set (a comma list or dns:///), streams are spread by round_robin over
the healthy replicas, and the jobs of a stream that fails with UNAVAILABLE (a replica killed
or draining) are sent again on a new stream, with capped, jittered backoff; every job is
returned exactly once.
"""
from __future__ import annotations

import itertools
import random
import time
from typing import Iterable, Iterator, Optional

import grpc

from . import _wire
from ._jobs import Assembler, make_job, normalize_layer, stream_error
from .arrays import ResultMemory
from .errors import CompressError, UnavailableError, invalid_argument, make_error
from .result import LayerResult, ServerInfo, server_info_from_proto
from .security import channel_security
from .targets import parse_target
from .v1 import centroidkv_pb2 as pb

DEFAULT_SLAB_BYTES = 4 << 20  # large enough that Python's per-message cost stays small
MAX_RECEIVE_BYTES = 1 << 30
# Memory of dropped results kept for the next ones (arrays.ResultMemory): a sequence's
# worth of layers at 32k context (llama3-8b: 32 layers x 32 MiB at ratio 0.25).
DEFAULT_RESULT_POOL_BYTES = 1 << 30


def channel_options(target, extra=()) -> list:
    options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
               ("grpc.max_send_message_length", -1)]
    if target.service_config:
        options.append(("grpc.service_config", target.service_config))
    return options + list(extra)


def choose_slab_bytes(requested: Optional[int], info: ServerInfo) -> int:
    """Slab payload size: the request (or DEFAULT_SLAB_BYTES), never more than the server's
    GetInfo limits.max_slab_bytes (from servers older than it: its largest message less the
    slab's own fields)."""
    limit = info.limits.max_slab_bytes or (info.limits.max_message_bytes -
                                           _wire.SLAB_OVERHEAD_BYTES)
    if limit <= 0:
        limit = DEFAULT_SLAB_BYTES
    size = requested if requested is not None else DEFAULT_SLAB_BYTES
    if size < 1:
        raise invalid_argument("slab_bytes", f"must be positive (got {size})")
    return min(size, limit)


# After GetInfo found no ready connection within the connect timeout, one fail-fast call
# tells why (its UNAVAILABLE names the connection's last error).
PROBE_SECONDS = 5.0


def waited_in_vain(error: grpc.RpcError) -> bool:
    """GetInfo's wait for a ready connection ran out: worth a probe to say why."""
    return error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def get_info_error(error: grpc.RpcError, probe: Optional[grpc.RpcError],
                   waited: float) -> CompressError:
    """The CompressError of a failed GetInfo; `probe` (a fail-fast GetInfo's error) names
    the connection's last error when it is UNAVAILABLE."""
    if probe is not None and probe.code() == grpc.StatusCode.UNAVAILABLE:
        return make_error(probe.code(),
                          f"GetInfo: no connection within {waited:g} s: {probe.details()}")
    return make_error(error.code(), f"GetInfo: {error.details()}")


class Backoff:
    """Capped, jittered exponential backoff between resends."""

    def __init__(self, base: float = 0.05, cap: float = 2.0):
        self.base, self.cap = base, cap

    def delay(self, attempt: int) -> float:
        return min(self.cap, self.base * (2 ** attempt)) * random.uniform(0.5, 1.5)


class ClientCore:
    """What Client and AsyncClient share: the target, the options, the channel made by
    `grpc_module` (grpc or grpc.aio; plaintext or TLS), its two methods, the call metadata
    (the bearer token) and the numbering of jobs."""

    def __init__(self, grpc_module, target: str, *, timeout: Optional[float] = None,
                 connect_timeout: float = 30.0, slab_bytes: Optional[int] = None,
                 max_attempts: Optional[int] = None, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None, auth_token: Optional[str] = None,
                 result_pool_bytes: int = DEFAULT_RESULT_POOL_BYTES, grpc_options=()):
        self.target = parse_target(target)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._slab_request = slab_bytes
        self.max_attempts = max_attempts or (4 if self.target.is_replica_set else 1)
        self.backoff = Backoff()
        self.memory = ResultMemory(result_pool_bytes)
        security = channel_security(tls_ca, tls_cert, tls_key, tls_server_name, auth_token)
        self.tls = security.tls
        self._metadata = security.metadata or None
        options = channel_options(self.target, security.channel_options + list(grpc_options))
        if security.credentials is None:
            self._channel = grpc_module.insecure_channel(self.target.grpc_target, options=options)
        else:
            self._channel = grpc_module.secure_channel(self.target.grpc_target,
                                                       security.credentials, options=options)
        self._compress = self._channel.stream_stream(
            _wire.METHOD_COMPRESS, request_serializer=None,
            response_deserializer=_wire.decode_response)
        self._get_info = self._channel.unary_unary(
            _wire.METHOD_GET_INFO, request_serializer=pb.GetInfoRequest.SerializeToString,
            response_deserializer=pb.GetInfoResponse.FromString)
        self._register_region = self._channel.unary_unary(
            _wire.METHOD_REGISTER_REGION,
            request_serializer=pb.RegisterRegionRequest.SerializeToString,
            response_deserializer=pb.RegisterRegionResponse.FromString)
        self._unregister_region = self._channel.unary_unary(
            _wire.METHOD_UNREGISTER_REGION,
            request_serializer=pb.UnregisterRegionRequest.SerializeToString,
            response_deserializer=pb.UnregisterRegionResponse.FromString)
        self._info: Optional[ServerInfo] = None
        self._job_ids = itertools.count(1)  # next() is atomic: calls from several threads

    def _job_id(self) -> int:
        return next(self._job_ids)

    def _make_jobs(self, layers, options) -> dict:
        jobs = {}
        for index, layer in enumerate(layers):
            args, layer_options = normalize_layer(layer)
            job_id = self._job_id()
            jobs[job_id] = make_job(job_id, index, *args, **{**options, **layer_options})
        spaces = [id(job.output) for job in jobs.values() if job.output is not None]
        if len(spaces) != len(set(spaces)):
            raise invalid_argument("output", "one ResultSpace per layer: the layers of one "
                                   "call would overwrite each other's results")
        return jobs

    def _one_job(self, keys, values, counts, layer_index, options) -> dict:
        job_id = self._job_id()
        return {job_id: make_job(job_id, layer_index, keys, values, counts, **options)}

    def _rounds(self, jobs: dict, return_exceptions: bool) -> "ResendRounds":
        return ResendRounds(jobs, self.max_attempts, self.backoff, return_exceptions)


class ResendRounds:
    """The resend policy both clients' _run loops follow, written once: a call's jobs go out
    on one stream after another until each has an outcome. A job refused with UNAVAILABLE
    (a draining replica) and the jobs of a stream that failed with UNAVAILABLE are sent
    again, after the backoff, up to max_attempts streams; a job's error raises unless
    return_exceptions."""

    def __init__(self, jobs: dict, max_attempts: int, backoff: "Backoff",
                 return_exceptions: bool):
        self.pending = dict(jobs)  # the jobs still without an outcome: the next stream's
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._return_exceptions = return_exceptions
        self._attempt = 0
        self._retry: Optional[CompressError] = None

    def begin(self) -> dict:
        """The jobs the next stream carries."""
        self._retry = None
        return self.pending

    def finished(self, job_id, outcome):
        """One job's outcome from the stream: None when it is to be resent, else the outcome
        to yield (raises a job's error unless return_exceptions)."""
        if isinstance(outcome, UnavailableError):
            self._retry = outcome
            return None
        if isinstance(outcome, CompressError) and not self._return_exceptions:
            raise outcome
        del self.pending[job_id]
        return outcome

    def stream_failed(self, error: "UnavailableError") -> None:
        self._retry = error

    def next_delay(self) -> Optional[float]:
        """After a stream ended: None when every job has its outcome, else the seconds to wait
        before the next stream; raises when there is nothing to retry on or the attempts are
        used up."""
        if not self.pending:
            return None
        self._attempt += 1
        if self._retry is None:
            raise make_error(grpc.StatusCode.INTERNAL,
                             f"the stream ended with {len(self.pending)} jobs unanswered")
        if self._attempt >= self._max_attempts:
            raise self._retry
        return self._backoff.delay(self._attempt - 1)


class Client(ClientCore):
    """A connection to a CentroidKV server or replica set.

    target: "host:port", "unix:///path", a comma list of replicas, or "dns:///name:port".
    timeout: deadline in seconds of each call (None: none). slab_bytes: request slab payload
    (clamped to the server's limits.max_slab_bytes). max_attempts: streams tried per call
    when one fails with UNAVAILABLE (default 4 for a replica set, 1 for one address).
    tls_ca, tls_cert + tls_key (mTLS), tls_server_name, auth_token (default
    $CENTROIDKV_TOKEN): as the C++ client's options (centroidkv.security).
    result_pool_bytes: memory of dropped result arrays kept for the next results (default
    1 GiB; 0 keeps none): refilling fresh pages costs more than the copy itself.
    """

    def __init__(self, target: str, **options):
        super().__init__(grpc, target, **options)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        self._channel.close()
        self.memory.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- calls ---------------------------------------------------------------------------
    def info(self, refresh: bool = False) -> ServerInfo:
        """The server's version, backends, devices, limits and defaults (GetInfo)."""
        if self._info is None or refresh:
            timeout = self.connect_timeout if self.timeout is None else self.timeout
            try:
                reply = self._get_info(pb.GetInfoRequest(), timeout=timeout, wait_for_ready=True,
                                       metadata=self._metadata)
            except grpc.RpcError as e:
                probe = self._why_no_connection() if waited_in_vain(e) else None
                raise get_info_error(e, probe, timeout) from None
            self._info = server_info_from_proto(reply)
        return self._info

    def _why_no_connection(self) -> Optional[grpc.RpcError]:
        try:
            self._get_info(pb.GetInfoRequest(), timeout=PROBE_SECONDS, metadata=self._metadata)
        except grpc.RpcError as probe:
            return probe
        return None

    @property
    def slab_bytes(self) -> int:
        return choose_slab_bytes(self._slab_request, self.info())

    # -- shared memory (centroidkv.shm) -------------------------------------------------
    def shared_region(self, size: int):
        """A new SharedRegion of `size` bytes registered with the server (a unix socket
        connection only): arrays made with region.array() go to compress(...,
        region=region) by reference. Raises CompressError (FailedPreconditionError on TCP)."""
        from .shm import SharedRegion

        return SharedRegion(self, size)

    def register_region(self, name: str, offset: int, size: int) -> int:
        """Registers a file under /dev/shm (RegisterRegion); returns its region id."""
        try:
            reply = self._register_region(
                pb.RegisterRegionRequest(name=name, offset=offset, size=size),
                timeout=self.connect_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise make_error(e.code(), e.details() or "", field="name") from None
        return reply.region.region_id

    def unregister_region(self, region_id: int) -> None:
        try:
            self._unregister_region(pb.UnregisterRegionRequest(region_id=region_id),
                                    timeout=self.connect_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise make_error(e.code(), e.details() or "", field="region_id") from None

    def compress(self, keys, values=None, counts=None, *, layer_index: int = 0,
                 **options) -> LayerResult:
        """Compresses one layer: keys [H, n, dk] and values [H, n, dv] (or [n, H, d] with
        layout="token_major"), counts [H, n] or None; or ragged input, keys [rows, dk] with
        head_tokens [H] or offsets [H + 1]; or a LayerResult sent back as it is. Keyword
        arguments: every SPEC parameter (target_ratio, target_tokens, chunk_size,
        sink_tokens, recent_tokens, min_similarity, tighten_per_pass, max_passes,
        uniform_heads, passthrough_heads; None = the server's default), layout,
        output_dtype, return_assignment, backend, pad_heads, pad_to, exact_target,
        output_layout, timeout (the job's deadline in seconds, on the server), priority.
        fp8 (docs/fp8.md): torch float8 / ml_dtypes float8 keys and values, or uint8 codes
        with input_dtype="fp8_e4m3" / "fp8_e5m2", take key_scale and value_scale (a float,
        or one per head: vLLM's k_scale / v_scale); output_dtype="fp8_e4m3" / "fp8_e5m2"
        returns fp8 rows with the result's key_scales / value_scales, static when
        output_key_scale / output_value_scale are given, else per head from the rows.
        Scored, budgeted and fitted jobs (docs/scored-jobs.md): scores (one per input row,
        shaped as counts), head_budgets ([H], every kept entry counted), centroid_share,
        max_cluster_size; queries ([Hq, m, dk] reference queries after RoPE, Hq a multiple
        of H) with log_weight_bound, fit_block_tokens, fit_values, query_scale: the result's
        log_weights then replace ln(count) in attention (LayerResult.attention_bias()).
        Raises CompressError."""
        jobs = self._one_job(keys, values, counts, layer_index, options)
        return [result for _, result in self._run(jobs)][0]

    def compress_layers(self, layers: Iterable, *, return_exceptions: bool = False,
                        **options) -> list:
        """Compresses every layer of a sequence on one stream, pipelined, and returns the
        LayerResults in the order of `layers` (each (keys, values[, counts]), a LayerResult,
        or a dict of keys/values/counts and per-layer options). A job's error raises its
        CompressError and ends the call; with return_exceptions=True it takes the layer's
        place in the list instead and the other layers go on (as asyncio.gather). A failure
        of the whole stream raises either way."""
        results = {}
        jobs = self._make_jobs(layers, options)
        for job_id, result in self._run(jobs, return_exceptions):
            results[job_id] = result
        return [results[job_id] for job_id in jobs]

    def iter_compress_layers(self, layers: Iterable, *, return_exceptions: bool = False,
                             **options) -> Iterator[LayerResult]:
        """As compress_layers, yielding each LayerResult (or, with return_exceptions, a
        job's CompressError) as soon as it is complete, in completion order
        (result.layer_index / error.layer says which)."""
        for _, result in self._run(self._make_jobs(layers, options), return_exceptions):
            yield result

    # -- internals -----------------------------------------------------------------------
    def _run(self, jobs: dict, return_exceptions: bool = False) -> Iterator[tuple]:
        """Yields (job_id, LayerResult | CompressError) for every job exactly once,
        resending on a new stream the jobs of a stream (or the jobs) that failed with
        UNAVAILABLE."""
        slab_bytes = self.slab_bytes
        rounds = self._rounds(jobs, return_exceptions)
        while True:
            try:
                for job_id, outcome in self._stream(rounds.begin(), slab_bytes):
                    done = rounds.finished(job_id, outcome)
                    if done is not None:
                        yield job_id, done
            except UnavailableError as e:
                rounds.stream_failed(e)
            delay = rounds.next_delay()
            if delay is None:
                return
            time.sleep(delay)

    def _stream(self, jobs: dict, slab_bytes: int) -> Iterator[tuple]:
        """One Compress stream carrying `jobs`; yields (job_id, LayerResult | CompressError)
        as each finishes. A failed stream raises its CompressError."""
        def requests():
            for job in list(jobs.values()):
                yield from job.requests(slab_bytes)

        jobs = dict(jobs)  # the caller removes jobs as they are returned
        assembler = Assembler(jobs, self.memory)
        call = self._compress(requests(), timeout=self.timeout, metadata=self._metadata)
        try:
            for reply in call:
                done = assembler.feed(reply)
                if done is not None:
                    yield done
        except grpc.RpcError as e:
            raise stream_error(e, jobs) from None
        finally:
            call.cancel()  # a no-op once the stream has ended; ends it if the caller stopped
