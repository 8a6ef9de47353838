"""Sequence: online (decode-time) compression of one sequence, with the same plan and the
same splices as the C++ client's Sequence (client/include/centroidkv/client/sequence.h).

The worker appends each new token's keys and values per layer; once a full chunk has left
the protected recent window, the sequence sends it as a layer job (one per layer) and hands
back a Splice per layer: the token positions [first_position, end_position) that its rows
now stand for, a version, and the rows (keys, values, counts) per head. Splices name
positions, not row indices, so one applied late or out of order lands right
(CacheRows.place), and one whose rows a newer splice already replaced is stale (None).

    seq = Sequence("unix:///run/ckv.sock", num_layers=32, num_heads=8, key_dim=128,
                   value_dim=128, budget_entries=2048)
    rows = CacheRows(32)
    for each token:
        for layer in range(32): seq.append(layer, k, v)        # [H, dk], [H, dv]
        seq.end_token(); rows.append_token()
        for s in seq.take_splices():                          # never blocks
            place = rows.place(s)
            if place is not None: cache[s.layer][:, place[0]:place[1]] = s.keys ...

fp8 caches: dtype="fp8_e4m3" (or "fp8_e5m2") with the cache's key_scales and value_scales
(1 entry, one per layer as vLLM's k_scale / v_scale, or num_layers x num_heads); rows are
appended as uint8 codes (or ml_dtypes / torch float8 arrays, read as their codes) and every
splice comes back as uint8 codes in the same scales: each job sends its layer's scales and
asks for fp8 results with them (static), so merged and re-merged rows keep the cache's
scales (the C++ Sequence does the same).

Policies: "ratio" (each chunk becomes ceil(chunk_ratio * chunk_tokens) entries) and
"budget" (a chunk stays as it is while there is room; while the regions between the sinks
and the newest positions hold more than budget - sinks - (recent + chunk - 1) rows per head,
the oldest region and the next one merge in one job to the size that fits). Jobs run on an
AsyncClient in a thread of the sequence's own; cancel() cancels them on the server.
Thread-safe.
"""
from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from .errors import CancelledError, CompressError, invalid_argument
from .presets import SMALL_MODEL

FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")


@dataclass
class Splice:
    """The rows that now stand for positions [first_position, end_position) of `layer`."""
    layer: int
    first_position: int
    end_position: int
    version: int
    keys: np.ndarray    # [H, rows_per_head, key_dim] (fp8 caches: uint8 codes)
    values: np.ndarray  # [H, rows_per_head, value_dim]
    counts: np.ndarray  # [H, rows_per_head] uint32; 0 marks a padding row

    @property
    def rows_per_head(self) -> int:
        return int(self.counts.shape[1])


@dataclass
class _Planned:
    version: int
    first: int
    end: int
    target: int
    inputs: Tuple[int, ...] = ()
    raw: bool = False


@dataclass
class _LayerJob:
    state: str = "waiting"          # waiting, in_flight, done, released
    result: Optional[Splice] = None  # once done (raw regions: their rows)
    future: object = None


@dataclass
class _Layer:
    raw_keys: list = field(default_factory=list)    # [H, dk] per position from raw_first
    raw_values: list = field(default_factory=list)
    raw_first: int = 0
    appended: bool = False
    jobs: List[_LayerJob] = field(default_factory=list)


class Sequence:
    def __init__(self, target: str, *, num_layers: int, num_heads: int, key_dim: int,
                 value_dim: int, sink_tokens: int = SMALL_MODEL["sink_tokens"],
                 recent_tokens: int = SMALL_MODEL["recent_tokens"],
                 chunk_tokens: int = SMALL_MODEL["chunk_size"], policy: str = "budget", chunk_ratio: float = 0.5,
                 budget_entries: int = 0, dtype="float32", key_scales=None, value_scales=None,
                 backend: str = "auto", client_options: Optional[dict] = None, **compression):
        if policy not in ("budget", "ratio"):
            raise invalid_argument("policy", f"'{policy}' is not budget or ratio")
        for name, value, least in (("num_layers", num_layers, 1), ("num_heads", num_heads, 1),
                                   ("key_dim", key_dim, 1), ("value_dim", value_dim, 1),
                                   ("sink_tokens", sink_tokens, 0),
                                   ("recent_tokens", recent_tokens, 0),
                                   ("chunk_tokens", chunk_tokens, 2)):
            if value < least:
                raise invalid_argument(name, f"{value} must be at least {least}")
        if not 0.0 < chunk_ratio <= 1.0:
            raise invalid_argument("chunk_ratio", f"{chunk_ratio} must be in (0, 1]")
        self._room = budget_entries - sink_tokens - (recent_tokens + chunk_tokens - 1)
        if policy == "budget" and self._room < 2:
            raise invalid_argument(
                "budget_entries", f"{budget_entries} leaves {self._room} rows per head for "
                f"merged regions after sinks ({sink_tokens}) and the recent window plus a "
                f"chunk less one ({recent_tokens + chunk_tokens - 1}); at least 2 are needed")
        self.num_layers, self.num_heads = num_layers, num_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.sink_tokens, self.recent_tokens, self.chunk_tokens = (sink_tokens, recent_tokens,
                                                                   chunk_tokens)
        self.policy, self.chunk_ratio, self.budget_entries = policy, chunk_ratio, budget_entries
        self.fp8 = dtype if dtype in FP8_DTYPES else None  # the wire name of an fp8 cache
        self.dtype = np.dtype(np.uint8 if self.fp8 else dtype)
        self._scales = [self._layer_scales(name, given, num_layers, num_heads)
                        for name, given in (("key_scales", key_scales),
                                            ("value_scales", value_scales))]
        self._job_options = dict(compression, backend=backend, sink_tokens=0, recent_tokens=0,
                                 exact_target=True, pad_heads=True)
        self._lock = threading.Condition()
        self._error: Optional[BaseException] = None
        self._stopped = False
        self._position = 0
        self._next_chunk = sink_tokens
        self._plan: List[_Planned] = []
        self._regions: List[Tuple[int, int, int, int]] = []  # (first, end, rows, job)
        self._layers = [_Layer(raw_first=sink_tokens) for _ in range(num_layers)]
        self._ready: List[Splice] = []
        self._in_flight = 0
        self._waiting = 0
        self.jobs_submitted = 0
        self.remerges_planned = 0
        # The event loop thread and its AsyncClient.
        from .aio import AsyncClient

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="centroidkv-sequence")
        self._thread.start()

        async def connect():
            return AsyncClient(target, **(client_options or {}))

        self._client = asyncio.run_coroutine_threadsafe(connect(), self._loop).result()

    # -- the worker's calls ----------------------------------------------------------------
    @property
    def position(self) -> int:
        return self._position

    def append(self, layer: int, keys, values) -> None:
        """Copies one token's keys [H, key_dim] and values [H, value_dim] for `layer`."""
        with self._lock:
            self._check_open()
            if not 0 <= layer < self.num_layers:
                raise invalid_argument("layer", f"{layer} is not in [0, {self.num_layers})")
            entry = self._layers[layer]
            if entry.appended:
                raise invalid_argument("layer", f"{layer} already has position "
                                       f"{self._position}: call end_token()")
            entry.appended = True
            if self._position < self.sink_tokens:
                return
            k = self._rows(keys, (self.num_heads, self.key_dim))
            v = self._rows(values, (self.num_heads, self.value_dim))
            entry.raw_keys.append(k)
            entry.raw_values.append(v)

    def end_token(self) -> None:
        """Ends the token (every layer must have it) and submits the jobs it makes due.
        Raises the sequence's error if a job failed for good."""
        with self._lock:
            self._check_open()
            missing = [i for i, entry in enumerate(self._layers) if not entry.appended]
            if missing:
                raise invalid_argument("layer", f"{missing[0]} has no row for position "
                                       f"{self._position}")
            for entry in self._layers:
                entry.appended = False
            self._position += 1
            if self._error is not None:
                raise self._error
            self._plan_jobs()

    def take_splices(self) -> List[Splice]:
        """The splices that have arrived since the last call; never blocks."""
        with self._lock:
            ready, self._ready = self._ready, []
            return ready

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until every planned job has come back; raises the sequence's error."""
        with self._lock:
            done = self._lock.wait_for(
                lambda: self._error is not None or self._stopped or
                (self._in_flight == 0 and self._waiting == 0), timeout)
            if self._error is not None:
                raise self._error
            if self._stopped:
                raise CancelledError("the sequence was cancelled or closed")
            if not done:
                raise TimeoutError(f"jobs still in flight after {timeout} s")

    def planned_rows(self) -> int:
        """Rows per head once every planned splice is applied."""
        with self._lock:
            if self._position <= self.sink_tokens:
                return self._position
            return (self.sink_tokens + sum(r[2] for r in self._regions) +
                    self._position - self._next_chunk)

    def cancel(self) -> None:
        """Cancels every job in flight on the server; no splice comes after it. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            futures = [job.future for entry in self._layers for job in entry.jobs
                       if job.state == "in_flight" and job.future is not None]
            self._ready = []
            self._lock.notify_all()
        for future in futures:
            future.cancel()
        self._shutdown()

    def close(self) -> None:
        """flush(), then closes the client; a failed sequence is cancelled."""
        try:
            self.flush()
        except BaseException:
            self.cancel()
            raise
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self.cancel()

    def _layer_scales(self, name: str, given, layers: int, heads: int):
        """Per layer: the scale (a float, every head) or the per-head list the jobs send."""
        if not self.fp8:
            if given is not None:
                raise invalid_argument(name, f"given for dtype {self.dtype.name}: scales are "
                                       "for fp8 caches only")
            return None
        if given is None:
            raise invalid_argument(name, f"an fp8 cache ({self.fp8}) needs its scales")
        flat = np.asarray(given, dtype=np.float32).reshape(-1)
        if flat.size not in (1, layers, layers * heads):
            raise invalid_argument(name, f"{flat.size} entries: an fp8 cache needs 1, num_layers "
                                   f"({layers}) or num_layers x num_heads ({layers * heads})")
        bad = np.flatnonzero(~(np.isfinite(flat) & (flat > 0)))
        if bad.size:
            raise invalid_argument(name, f"[{bad[0]}] {flat[bad[0]]} must be finite and > 0")
        if flat.size == 1:
            return [float(flat[0])] * layers
        if flat.size == layers:
            return [float(x) for x in flat]
        return [flat[l * heads:(l + 1) * heads].tolist() for l in range(layers)]

    def _rows(self, rows, shape):
        """One token's rows as this sequence stores them (fp8: the codes)."""
        if self.fp8:
            if type(rows).__module__.startswith("torch"):
                rows = rows.detach().cpu()
                if "float8" in str(rows.dtype):
                    import torch
                    rows = rows.view(torch.uint8)
                rows = rows.numpy()
            rows = np.asarray(rows)
            if rows.dtype.itemsize == 1 and rows.dtype != np.uint8:  # ml_dtypes float8
                rows = rows.view(np.uint8)
            if rows.dtype != np.uint8:
                raise invalid_argument("keys", f"{rows.dtype} rows for an fp8 cache: give its "
                                       "uint8 codes or float8 arrays")
        return np.array(rows, dtype=self.dtype).reshape(shape)

    def _fp8_options(self, layer: int) -> dict:
        if not self.fp8:
            return {}
        keys, values = self._scales[0][layer], self._scales[1][layer]
        return dict(input_dtype=self.fp8, key_scale=keys, value_scale=values,
                    output_dtype=self.fp8, output_key_scale=keys, output_value_scale=values)

    # -- planning --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._stopped:
            raise CancelledError("the sequence was cancelled or closed")

    def _plan_jobs(self) -> None:
        chunk = self.chunk_tokens
        while self._position - self._next_chunk >= self.recent_tokens + chunk:
            first_new = len(self._plan)
            raw = self.policy == "budget"
            target = chunk if raw else max(1, min(chunk, math.ceil(self.chunk_ratio * chunk - 1e-9)))
            self._plan.append(_Planned(first_new + 1, self._next_chunk, self._next_chunk + chunk,
                                       target, (), raw))
            self._regions.append((self._next_chunk, self._next_chunk + chunk, target, first_new))
            self._next_chunk += chunk
            if raw:
                self._plan_remerges()
            for index in range(first_new, len(self._plan)):
                self.remerges_planned += bool(self._plan[index].inputs)
            for layer in range(self.num_layers):
                entry = self._layers[layer]
                for index in range(first_new, len(self._plan)):
                    planned = self._plan[index]
                    job = _LayerJob()
                    entry.jobs.append(job)
                    if not planned.inputs:
                        k, v = self._take_raw(entry, planned)
                        if planned.raw:
                            job.state = "done"
                            job.result = Splice(layer, planned.first, planned.end,
                                                planned.version, k, v,
                                                np.ones(k.shape[:2], np.uint32))
                            continue
                        job.result = Splice(layer, planned.first, planned.end, planned.version,
                                            k, v, np.ones(k.shape[:2], np.uint32))
                    self._waiting += 1
                self._start_ready(layer)

    def _plan_remerges(self) -> None:
        middle = sum(r[2] for r in self._regions)
        while middle > self._room and not (len(self._regions) == 1 and self._regions[0][2] <= 1):
            take = 2 if len(self._regions) >= 2 else 1
            rows = sum(r[2] for r in self._regions[:take])
            target = max(1, rows - (middle - self._room))
            first, end = self._regions[0][0], self._regions[take - 1][1]
            inputs = tuple(r[3] for r in self._regions[:take])
            self._plan.append(_Planned(len(self._plan) + 1, first, end, target, inputs))
            self._regions[:take] = [(first, end, target, len(self._plan) - 1)]
            middle += target - rows

    def _take_raw(self, entry: _Layer, planned: _Planned):
        count = planned.end - planned.first
        skip = planned.first - entry.raw_first
        k = np.stack(entry.raw_keys[skip:skip + count], axis=1)  # [H, tokens, dk]
        v = np.stack(entry.raw_values[skip:skip + count], axis=1)
        del entry.raw_keys[:skip + count]
        del entry.raw_values[:skip + count]
        entry.raw_first = planned.end
        return k, v

    # -- jobs ------------------------------------------------------------------------------
    def _start_ready(self, layer: int) -> None:
        entry = self._layers[layer]
        for index, job in enumerate(entry.jobs):
            if job.state != "waiting" or self._error is not None:
                continue
            planned = self._plan[index]
            if not all(entry.jobs[i].state == "done" for i in planned.inputs):
                continue
            if planned.inputs:
                args = self._remerge_input(entry, planned)
            else:
                chunk = job.result
                job.result = None
                args = dict(keys=chunk.keys, values=chunk.values, counts=chunk.counts)
            job.state = "in_flight"
            self._waiting -= 1
            self._in_flight += 1
            self.jobs_submitted += 1
            coroutine = self._client.compress(layer_index=layer, target_tokens=planned.target,
                                              **args, **self._job_options,
                                              **self._fp8_options(layer))
            job.future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
            job.future.add_done_callback(
                lambda future, layer=layer, index=index: self._on_result(layer, index, future))

    def _remerge_input(self, entry: _Layer, planned: _Planned) -> dict:
        """The inputs' real rows (count > 0), head by head, oldest region first; ragged."""
        keys, values, counts, offsets = [], [], [], [0]
        for head in range(self.num_heads):
            for i in planned.inputs:
                part = entry.jobs[i].result
                real = part.counts[head] > 0
                keys.append(part.keys[head][real])
                values.append(part.values[head][real])
                counts.append(part.counts[head][real])
            offsets.append(sum(len(c) for c in counts))
        for i in planned.inputs:
            entry.jobs[i].result = None
            entry.jobs[i].state = "released"
        return dict(keys=np.concatenate(keys), values=np.concatenate(values),
                    counts=np.concatenate(counts), offsets=np.asarray(offsets, np.int64))

    def _on_result(self, layer: int, index: int, future) -> None:
        with self._lock:
            job = self._layers[layer].jobs[index]
            if self._stopped or job.state != "in_flight":
                return
            self._in_flight -= 1
            if future.cancelled():
                job.state = "released"
                self._lock.notify_all()
                return
            error = future.exception()
            if error is not None:
                job.state = "released"
                if self._error is None:
                    planned = self._plan[index]
                    self._error = error if isinstance(error, CompressError) else CompressError(
                        str(error))
                    self._error.args = (f"layer {layer} positions [{planned.first}, "
                                        f"{planned.end}): {error}",)
                self._lock.notify_all()
                return
            result = future.result()
            planned = self._plan[index]
            heads = self.num_heads
            if self.fp8 and not self._in_cache_scales(layer, result):
                job.state = "released"
                self._error = self._error or CompressError(
                    f"layer {layer} positions [{planned.first}, {planned.end}): fp8 rows came "
                    "back in other scales than the cache's")
                self._lock.notify_all()
                return
            rows = int(result.offsets[1] - result.offsets[0])
            splice = Splice(layer, planned.first, planned.end, planned.version,
                            np.asarray(result.keys).reshape(heads, rows, self.key_dim),
                            np.asarray(result.values).reshape(heads, rows, self.value_dim),
                            np.asarray(result.counts, np.uint32).reshape(heads, rows))
            job.state = "done"
            job.result = splice
            self._ready.append(splice)
            self._start_ready(layer)
            self._lock.notify_all()

    def _in_cache_scales(self, layer: int, result) -> bool:
        return all(np.array_equal(np.asarray(got, np.float32),
                                  np.broadcast_to(np.float32(given), (self.num_heads,)))
                   for got, given in ((result.key_scales, self._scales[0][layer]),
                                      (result.value_scales, self._scales[1][layer])))

    def _shutdown(self) -> None:
        async def close():
            await self._client.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)


class CacheRows:
    """What each row of a worker's cache stands for, per layer (every head of a layer has
    the same rows): runs of rows with the positions they cover and the version of the
    splice that wrote them (0: uncompressed tokens, one row per position)."""

    def __init__(self, num_layers: int):
        self._layers: List[list] = [[] for _ in range(num_layers)]  # [first, end, version, rows]
        self.position = 0

    def append_token(self) -> None:
        for runs in self._layers:
            if runs and runs[-1][2] == 0 and runs[-1][1] == self.position:
                runs[-1][1] += 1
                runs[-1][3] += 1
            else:
                runs.append([self.position, self.position + 1, 0, 1])
        self.position += 1

    def rows(self, layer: int) -> int:
        return sum(run[3] for run in self._layers[layer])

    def place(self, splice: Splice) -> Optional[Tuple[int, int]]:
        """The rows [begin, end) `splice` replaces (the map is updated as if the caller did
        it), or None when a newer splice already covers its positions (stale: drop it)."""
        if not 0 <= splice.layer < len(self._layers):
            raise invalid_argument("splice.layer", f"{splice.layer} is not in "
                                   f"[0, {len(self._layers)})")
        first, end = splice.first_position, splice.end_position
        if first < 0 or end <= first or end > self.position:
            raise invalid_argument("splice", f"positions [{first}, {end}) are not within the "
                                   f"{self.position} positions appended")
        runs = self._layers[splice.layer]
        if any(r[1] > first and r[0] < end and r[2] >= splice.version for r in runs):
            return None
        cut = []
        for run in runs:  # uncompressed runs are cut at the splice's edges
            pieces = [run]
            for edge in (first, end):
                last = pieces[-1]
                if last[2] == 0 and last[0] < edge < last[1]:
                    pieces[-1:] = [[last[0], edge, 0, edge - last[0]],
                                   [edge, last[1], 0, last[1] - edge]]
            cut.extend(pieces)
        begin = 0
        row_begin = 0
        while begin < len(cut) and cut[begin][1] <= first:
            row_begin += cut[begin][3]
            begin += 1
        stop, row_end = begin, row_begin
        while stop < len(cut) and cut[stop][0] < end:
            if cut[stop][0] < first or cut[stop][1] > end:
                raise invalid_argument("splice", f"version {splice.version} for [{first}, "
                                       f"{end}) cuts through the rows of version {cut[stop][2]}")
            row_end += cut[stop][3]
            stop += 1
        cut[begin:stop] = [[first, end, splice.version, splice.rows_per_head]]
        self._layers[splice.layer] = cut
        return row_begin, row_end
