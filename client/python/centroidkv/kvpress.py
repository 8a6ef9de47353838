"""CentroidKV as a kvpress press (NVIDIA's kvpress, PyPI `kvpress`; extra `[kvpress]`).

    from transformers import pipeline
    from centroidkv.kvpress import CentroidKVPress
    import kvpress  # noqa: F401  (registers the "kv-press-text-generation" pipeline)

    press = CentroidKVPress(client, target_ratio=0.25)     # or compression_ratio=0.75
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    answer = pipe(context, question=question, press=press)["answer"]

During prefill, after each attention layer has run, the press sends that layer's keys and
values to the server (one `Client.compress` job per layer, any target the Client takes),
on a worker thread while the model computes the next layers, and when the model's forward
returns it puts back the centroids (pipelined: the prefill waits for the last job, not for
each in turn). A centroid that stands for c tokens carries ln(c) in one extra
key dimension, the form that `centroidkv.transformers` decodes with. The model is switched
to its count-aware attention ("centroidkv", identical to SDPA on plain caches) when the
press is applied, so every later query adds ln(c) to the merged keys' logits.

Budgets, two conventions: kvpress's `compression_ratio` is the share of the cache
*removed* (0.75 keeps a quarter); CentroidKV's `target_ratio` is the share *kept* (0.25
keeps a quarter); `target_tokens` keeps that many entries per head. Give exactly one. The
other options are `Client.compress`'s SPEC parameters and job options (chunk_size,
sink_tokens, recent_tokens, min_similarity, max_passes, tighten_per_pass, uniform_heads,
backend, timeout, ...). Their defaults are the service's (the SPEC preset: chunk 256, sink
16, recent 64); the reports run the small-model preset (centroidkv.presets.SMALL_MODEL).
`passthrough_heads` is a list of KV heads for every layer or a dict {layer: [heads]}: those
heads come back whole (outlier heads), and they count in the budget: the other heads share
what is left (centroidkv.budgets.equal_budgets), or the press raises BudgetError naming
passthrough_heads when nothing is.

Scored presses (docs/scored-jobs.md): `scorer=` any kvpress scorer press (KVzipPress,
SnapKVPress, ExpectedAttentionPress, KnormPress, ...) computes each entry's importance in
the model (centroidkv.scoring); one budget over all layers x heads is allocated as KVzip
does (centroidkv.budgets.global_budgets), and each layer becomes a scored job: its sink and
top-scored entries kept exact, `centroid_share` of each head's room (the server's default,
0.15; 0: score
top-k eviction, KVzip's own selection with its memory really freed) as centroids of the
unkept tail. `fit=True` also sends reference queries (KVzip's replay queries, else the
prefill's last `fit_window`) and decodes with the fitted log-weights. A scored press runs
after the prefill (all layers' scores are needed for the budget), not pipelined with it.

Shared memory: where the server may map this process's memory (a unix socket to a server
with shared memory on: ServerInfo.shared_memory), each `with press(model)` writes every
layer's keys and values into one registered region (centroidkv.shm) and the jobs name them
by reference instead of sending them as slabs; the region is closed when the block ends.
`shared_memory=None` (default) uses it where possible, True insists (an error where it is
not), False never. fp32 and fp16 caches only (bf16 has no numpy dtype: sent as slabs).

Like kvpress's own presses, the compressed cache reports the entries it holds as its
length, and kvpress's pipeline passes the true positions of the question and answer
tokens. A failed job (a NaN in the cache, a server gone, a bad option) raises
CentroidKVPressError naming the layer; the cache is never left silently uncompressed.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from kvpress.presses.base_press import BasePress, is_prefilling

from .budgets import BudgetError, equal_budgets, global_budgets, total_entries, whole_heads
from .errors import CompressError
from .torch import padded_heads, widen_keys
from .transformers import CompressedLayer, enable


class CentroidKVPressError(RuntimeError):
    """A layer's compression failed: `layer` says which, `error` is the cause (a
    CompressError from the server or client, or the ValueError of a bad shape)."""

    def __init__(self, layer: int, error: Exception):
        self.layer = layer
        self.error = error
        super().__init__(f"CentroidKV press, layer {layer}: {error}")


@dataclass
class CentroidKVPress(BasePress):
    """Merges each layer's KV cache during prefill through a CentroidKV server."""

    client: Any = None
    target_ratio: Optional[float] = None
    target_tokens: Optional[int] = None
    passthrough_heads: Optional[Union[Sequence[int], Mapping[int, Sequence[int]]]] = None
    shared_memory: Optional[bool] = None  # None: where the server may map our memory
    options: dict = field(default_factory=dict)  # more Client.compress keywords
    results: dict = field(default_factory=dict, init=False, repr=False)  # layer -> LayerResult

    def __init__(self, client, *, target_ratio=None, compression_ratio=None, target_tokens=None,
                 passthrough_heads=None, shared_memory=None, scorer=None, fit=False,
                 fit_window=64, allocation="global", **options):
        given = [name for name, v in (("target_ratio", target_ratio),
                                      ("compression_ratio", compression_ratio),
                                      ("target_tokens", target_tokens)) if v is not None]
        if len(given) != 1:
            raise ValueError("CentroidKVPress: give exactly one of target_ratio (share kept), "
                             "compression_ratio (kvpress's share removed) and target_tokens"
                             + (f" (got {', '.join(given)})" if given else ""))
        if target_ratio is not None and not 0.0 < float(target_ratio) <= 1.0:
            raise ValueError(f"CentroidKVPress: target_ratio {target_ratio} is not in (0, 1] "
                             "(the share of the cache kept)")
        if compression_ratio is not None and not 0.0 <= float(compression_ratio) < 1.0:
            raise ValueError(f"CentroidKVPress: compression_ratio {compression_ratio} is not "
                             "in [0, 1) (kvpress's share of the cache removed)")
        if target_tokens is not None and (isinstance(target_tokens, bool) or
                                          int(target_tokens) != target_tokens or
                                          target_tokens < 1):
            raise ValueError(f"CentroidKVPress: target_tokens {target_tokens!r} is not a "
                             "positive integer")
        for name in ("keys", "values", "counts", "layer_index", "layout", "region", "output"):
            if name in options:
                raise ValueError(f"CentroidKVPress: {name} is set by the press")
        if scorer is None and (fit or "centroid_share" in options):
            raise ValueError("CentroidKVPress: fit and centroid_share need a scorer")
        self.client = client
        self.scorer = scorer
        self.fit = bool(fit)
        self.fit_window = int(fit_window)
        if allocation not in ("global", "equal"):
            raise ValueError(f"CentroidKVPress: allocation {allocation!r} is not 'global' "
                             "(one top-k over layers x heads, as KVzip) or 'equal'")
        self.allocation = allocation
        self.target_ratio = target_ratio
        self._compression_ratio = compression_ratio
        self._removed = 0.0  # the share removed by the last prefill (for target_tokens)
        self.target_tokens = target_tokens
        self.passthrough_heads = passthrough_heads
        self.options = options
        self.shared_memory = shared_memory
        self.results = {}
        self._region = None  # the shared memory region of the current `with press(model)`
        self._worker = None  # the thread that runs this block's jobs, one at a time
        self._pending = {}  # layer -> (attention module, cache, keys, job) until installed
        self._failed = None  # the first layer whose job failed (-1: the prefill raised)

    def kept_ratio(self) -> Optional[float]:
        """The share of each head kept (None with target_tokens)."""
        if self.target_tokens is not None:
            return None
        return float(self.target_ratio if self.target_ratio is not None
                     else 1.0 - self._compression_ratio)

    @property
    def compression_ratio(self) -> float:
        """kvpress's convention, the share of the cache removed, whichever budget was given
        (kvpress's ComposedPress and pipelines read it); with target_tokens, the share the
        last prefill removed."""
        if self._compression_ratio is not None:
            return float(self._compression_ratio)
        if self.target_ratio is not None:
            return 1.0 - float(self.target_ratio)
        return self._removed

    def heads_kept_whole(self, layer: int) -> Optional[list]:
        if self.passthrough_heads is None:
            return None
        return whole_heads(self.passthrough_heads, layer)

    def _total(self, layers: int, heads: int, tokens: int) -> int:
        """The whole cache's budget in entries."""
        if self.target_tokens is not None:
            return layers * heads * min(int(self.target_tokens), tokens)
        return total_entries(self.kept_ratio(), layers, heads, tokens)

    def _layer_budget(self, module, keys) -> Optional[list]:
        """With passthrough heads, each layer's [H] budgets: the heads kept whole take their
        length out of the cache's budget and the others share the rest (BudgetError naming
        passthrough_heads when they cannot)."""
        if not self.passthrough_heads:
            return None
        config = module.config
        heads, tokens = keys.shape[0], keys.shape[1]
        layers = config.num_hidden_layers
        budgets = equal_budgets(self._total(layers, heads, tokens), layers, heads, tokens,
                                sink=int(self._option("sink_tokens", 16)),
                                recent=int(self._option("recent_tokens", 64)),
                                passthrough_heads=self.passthrough_heads)
        return budgets[int(module.layer_idx)].tolist()

    def _option(self, name, default):
        value = self.options.get(name)
        return default if value is None else value

    def post_init_from_model(self, model) -> None:
        enable(model)  # count-aware attention for every query after the prefill

    @contextmanager
    def __call__(self, model):
        """kvpress's context manager. The layers' jobs run on one worker thread while the
        model computes the next layers; the base model's forward hook waits for them and
        puts the centroids into the cache before the prefill returns. Closes this block's
        shared memory region at the end. With a scorer: the scored flow (_scored)."""
        if self.scorer is not None:
            with self._scored(model):
                yield
            return
        base = model.model.language_model if hasattr(model.model, "language_model") else model.model
        installer = base.register_forward_hook(self._install_pending, with_kwargs=True)
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="centroidkv-press") as worker:
                self._worker = worker
                try:
                    with super().__call__(model):
                        yield
                finally:
                    self._failed = -1  # jobs still queued (a forward that raised) are not sent
        finally:
            installer.remove()
            self._worker, self._pending, self._failed = None, {}, None
            if self._region is not None:
                self._region.close()
                self._region = None

    def _in_region(self, module, keys, values):
        """keys [H, n, d] and values as arrays in this block's shared memory region (made at
        the first layer, room for every layer), or None where shared memory is not used."""
        dtype = {torch.float32: np.float32, torch.float16: np.float16}.get(keys.dtype)
        if self.shared_memory is False or (dtype is None and not self.shared_memory):
            return None
        if self._worker is None:  # hooked by another press: no block of ours closes a region
            if self.shared_memory:
                raise ValueError("shared_memory=True needs the press's own `with press(model)` "
                                 "block (not another press's hooks)")
            return None
        if dtype is None:
            raise ValueError(f"shared_memory=True takes fp32 or fp16 caches, not {keys.dtype}")
        if self._region is None:
            if self.shared_memory is None and not self.client.info().shared_memory:
                return None
            per_layer = (keys.numel() + values.numel()) * keys.element_size() + 2 * 64
            layers = getattr(module.config, "num_hidden_layers", 1)
            self._region = self.client.shared_region(layers * per_layer)
        k = self._region.array(tuple(keys.shape), dtype)
        v = self._region.array(tuple(values.shape), dtype)
        k[...] = keys.detach().cpu().numpy()
        v[...] = values.detach().cpu().numpy()
        return k, v

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """The layer's centroids as (widened keys [1, H, T, d + 1], values [1, H, T, d]),
        heads padded to the longest (pad entries get -inf in the extra key dimension).
        kvpress's press interface, synchronous; the press's own hook pipelines instead."""
        result = self._compress_layer(module.layer_idx, self._request(module, keys, values))
        return self._widened(module, result, keys)

    def _request(self, module, keys, values):
        """What the layer's job sends (on the calling thread: the copy into shared memory
        must happen before the cache moves on)."""
        layer = module.layer_idx
        if keys.shape[0] != 1:
            raise CentroidKVPressError(layer, ValueError(
                f"batch {keys.shape[0]}: the press compresses one sequence at a time"))
        budget = ({"target_tokens": int(self.target_tokens)} if self.target_tokens is not None
                  else {"target_ratio": self.kept_ratio()})
        heads = self.heads_kept_whole(layer)
        if heads is not None:
            budget["passthrough_heads"] = heads
            try:
                budget["head_budgets"] = self._layer_budget(module, keys[0])
            except BudgetError as error:
                raise CentroidKVPressError(layer, error) from error
        try:
            shared = self._in_region(module, keys[0], values[0])
        except (CompressError, ValueError, TypeError) as error:
            raise CentroidKVPressError(layer, error) from error
        if shared is not None:
            return shared, dict(region=self._region, **budget)
        # in the cache's own dtype (fp32, fp16 or bf16 go on the wire as they are)
        return (keys[0].contiguous(), values[0].contiguous()), budget

    def _compress_layer(self, layer, request):
        """The layer's LayerResult from the server (on the worker thread when pipelined)."""
        if self._failed is not None:
            raise CentroidKVPressError(layer, RuntimeError(
                "not sent: " + ("the prefill failed" if self._failed < 0 else
                                f"layer {self._failed} failed first")))
        (keys, values), options = request
        try:
            result = self.client.compress(keys, values, layer_index=layer, **options,
                                          **self.options)
        except (CompressError, ValueError, TypeError) as error:
            self._failed = layer if self._failed is None else self._failed
            raise CentroidKVPressError(layer, error) from error
        self.results[layer] = result
        heads, tokens = keys.shape[0], keys.shape[1]
        self._removed = 1.0 - int(result.offsets[-1]) / max(1, heads * tokens)
        return result

    def _widened(self, module, result, keys):
        padded = padded_heads(result, dtype=keys.dtype, device=keys.device)
        scaling = getattr(module, "scaling", None) or 1.0 / math.sqrt(keys.shape[-1])
        wide = widen_keys(padded.keys, padded.bias.to(keys.device), scale=scaling)
        return wide[None], padded.values[None]

    def forward_hook(self, module, input, kwargs, output):
        """kvpress's hook, except that the layer's job is queued (the next layers go on
        meanwhile) and the layer is replaced, once the model's forward is done, by one whose
        new tokens get a zero (ln 1) in the extra key dimension."""
        cache = kwargs["past_key_values"]
        if not is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):
            return output
        layer = module.layer_idx
        if isinstance(cache.layers[layer], CompressedLayer) or layer in self._pending:
            raise CentroidKVPressError(layer, RuntimeError("this layer is already compressed"))
        keys, values = cache.layers[layer].keys, cache.layers[layer].values
        if self._worker is None:  # hooked by another press (kvpress's ComposedPress): in turn
            wide_keys, values = self.compress(module, kwargs["hidden_states"], keys, values,
                                              output[1], kwargs)
            cache.layers[layer] = CompressedLayer(wide_keys, values, 0)
            return output
        job = self._worker.submit(self._compress_layer, layer, self._request(module, keys, values))
        self._pending[layer] = (module, cache, keys, job)
        return output

    @contextmanager
    def _scored(self, model):
        """Scored jobs: the scorer's scores (and reference queries) of the prefill, one budget
        over all layers x heads, then one scored job per layer on one stream, each layer's
        cache replaced by its rows."""
        from . import scoring  # kvpress's scorers, imported only for a scored press

        self.post_init_from_model(model)  # count-aware attention for the scored rows
        with scoring.capture(model, self.scorer, queries=self.fit,
                             window=self.fit_window) as run:
            yield
        layers = sorted(run.scores)
        heads, tokens = run.keys[layers[0]].shape[0], run.keys[layers[0]].shape[1]
        sink = int(self._option("sink_tokens", 16))
        recent = int(self._option("recent_tokens", 64))
        total = self._total(len(layers), heads, tokens)
        try:
            if self.allocation == "global":
                budgets = global_budgets([run.scores[layer] for layer in layers], total,
                                         sink=sink, recent=recent,
                                         passthrough_heads=self.passthrough_heads)
            else:
                budgets = equal_budgets(total, len(layers), heads, tokens, sink=sink,
                                        recent=recent, passthrough_heads=self.passthrough_heads,
                                        least_extra=0)
        except BudgetError as error:
            raise CentroidKVPressError(-1, error) from error
        jobs = []
        for layer, budget in zip(layers, budgets):
            job = dict(keys=run.keys[layer].contiguous(), values=run.values[layer].contiguous(),
                       scores=run.scores[layer], head_budgets=budget.tolist())
            whole = self.heads_kept_whole(layer)
            if whole:
                job["passthrough_heads"] = whole
            if self.fit:
                job["queries"] = run.queries[layer]
            jobs.append(job)
        options = dict(self.options)
        options.setdefault("sink_tokens", sink)
        options.setdefault("recent_tokens", recent)
        try:
            results = self.client.compress_layers(jobs, **options)
        except (CompressError, ValueError, TypeError) as error:
            raise CentroidKVPressError(getattr(error, "layer", -1) or -1, error) from error
        for layer, result in zip(layers, results):
            self.results[layer] = result
            module = model.model.layers[layer].self_attn
            wide_keys, values = self._widened(module, result, run.keys[layer][None])
            run.cache.layers[layer] = CompressedLayer(wide_keys, values, 0)
        kept = sum(int(r.offsets[-1]) for r in results)
        self._removed = 1.0 - kept / max(1, len(layers) * heads * tokens)

    def _install_pending(self, base, args, kwargs, output):
        """After the model's forward: each queued layer's centroids into its cache, in layer
        order; the first layer that failed raises (later ones are not sent)."""
        pending, self._pending = self._pending, {}
        for layer in sorted(pending):
            module, cache, keys, job = pending[layer]
            wide_keys, values = self._widened(module, job.result(), keys)
            cache.layers[layer] = CompressedLayer(wide_keys, values, 0)
        return output
