"""Hugging Face transformers integration: a cache for generate() / forward calls whose
prefilled KV is compressed through a CentroidKV server, decoded with count-aware attention.

    from centroidkv.transformers import CentroidKVCache, enable
    enable(model)                                        # count-aware attention, once
    cache = CentroidKVCache(client, target_ratio=0.25)   # any SPEC parameter
    out = model.generate(ids, past_key_values=cache, max_new_tokens=64)

The cache stores the prompt like DynamicCache; when the prefill forward has filled it (the
first update of a call with more than one token is the prefill), it compresses every layer
with one compress_layers() stream and replaces each layer by its centroids. A centroid of c
tokens carries ln(c) in one extra key dimension (the bias-free widened form of
centroidkv.torch: ln(c) / scaling, -inf on padding between ragged heads); the attention
function registered as "centroidkv" widens the queries by a constant 1, so that the logit
is q.k * scaling + ln(c). New tokens are appended uncompressed (extra dimension 0), at their
true RoPE positions: the cache reports the number of tokens seen, not of entries kept, and
gives the mask the offset between the two. Batch size 1 (one sequence per cache).
Call compress() yourself (compress_on_prefill=False) to choose when.

Scored caches (docs/scored-jobs.md): `CentroidKVCache(client, target_ratio=0.25,
scorer="window", window=64, fit=False, ...)` scores every entry by the attention the
prefill's last `window` queries give it (SnapKV's observation window: summed over the
window and the KV head's query heads, average-pooled over 5 positions), splits one budget
over all layers x heads (centroidkv.budgets.global_budgets: the total is what the same
target_ratio / target_tokens keeps in every head) and sends each layer as a scored job;
`fit=True` also sends those queries as reference queries, and decoding uses the fitted
log-weights. The queries are taken by enable()'s hooks on each attention module (Llama-style
attention: q_proj, an optional q_norm, RoPE from position_embeddings).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import rotate_half

from .budgets import global_budgets
from .presets import SPEC
from .torch import padded_heads, widen_keys, widen_queries

ATTENTION_NAME = "centroidkv"


def causal_mask(queries: int, keys: int, device) -> torch.Tensor:
    """[1, 1, queries, keys] bool: the queries are the last `queries` of the `keys`."""
    rows = torch.arange(queries, device=device)[:, None]
    cols = torch.arange(keys, device=device)[None, :]
    return (cols <= keys - queries + rows)[None, None]


def _hide_masked_entries(module, query, key, mask):
    """kvpress's head-wise presses (AdaKV, KVzip, ...) keep every entry in the cache and name
    the evicted ones in module.masked_key_indices = (batch, kv head, position), cleared when
    a prefill starts (as many queries as keys). Those entries get -inf in the mask: exact,
    where kvpress's own patch substitutes fake keys that exist only for a few queries.
    Returns the mask, [B, H, q, kv] when entries are hidden."""
    if query.shape[2] == key.shape[2]:
        module.masked_key_indices = None
        return mask
    masked = getattr(module, "masked_key_indices", None)
    if masked is None:
        return mask
    batch, heads, queries, keys = key.shape[0], key.shape[1], query.shape[2], key.shape[2]
    if mask is None:
        mask = causal_mask(queries, keys, query.device)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, -math.inf)
    mask = mask.to(query.dtype).expand(batch, heads, queries, keys).clone()
    batch_index, head_index, position = masked
    mask[batch_index, head_index, :, position] = -math.inf
    return mask


def centroidkv_attention(module, query, key, value, attention_mask, dropout=0.0,
                         scaling=None, **kwargs):
    """transformers attention function: SDPA over keys that may carry the ln(count) column.
    query [B, Hq, q, d], key [B, H, kv, d or d + 1], value [B, H, kv, dv]. The parameters
    are in sdpa_attention_forward's order (kvpress's attention patch passes dropout sixth)."""
    if key.shape[-1] == query.shape[-1] + 1:
        query = widen_queries(query)
    if scaling is None:
        scaling = 1.0 / math.sqrt(value.shape[-1])
    mask = attention_mask
    if mask is not None and mask.dim() == 4 and mask.shape[-1] != key.shape[-2]:
        # The model builds one mask from layer 0's length; a layer of another length
        # (outlier heads kept whole) sees every stored entry and the new tokens causally.
        mask = causal_mask(query.shape[2], key.shape[-2], query.device)
    mask = _hide_masked_entries(module, query, key, mask)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        if mask is not None and mask.shape[1] > 1:
            mask = mask.repeat_interleave(groups, dim=1)
    is_causal = mask is None and query.shape[2] > 1
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
        scale=scaling, is_causal=is_causal)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    """Registers centroidkv_attention, unwrapped: importing kvpress wraps every registered
    attention function with its fake-key patch, which centroidkv_attention replaces by the
    exact mask (_hide_masked_entries); enable() registers it again for that reason."""
    AttentionInterface.register(ATTENTION_NAME, centroidkv_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


_register_attention()


def enable(model) -> None:
    """Makes `model` use the count-aware attention (identical to SDPA on uncompressed
    caches) and compress a CentroidKVCache passed as past_key_values right after the forward
    call that prefilled it (what generate() does first). Safe to call twice."""
    _register_attention()  # undoes kvpress's wrapper if kvpress was imported since
    model.set_attn_implementation(ATTENTION_NAME)
    if getattr(model, "_centroidkv_hook", None) is not None:
        return

    def hook(module, args, kwargs, output):
        cache = kwargs.get("past_key_values")
        if (isinstance(cache, CentroidKVCache) and cache.compress_on_prefill and
                not cache.compressed and cache._prefill_layers_seen > 0):
            cache.compress(scaling=getattr(module.model.layers[0].self_attn, "scaling", None))
        return output

    model._centroidkv_hook = model.register_forward_hook(hook, with_kwargs=True)

    def take_queries(module, args, kwargs):
        cache = kwargs.get("past_key_values", kwargs.get("past_key_value"))
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if (isinstance(cache, CentroidKVCache) and cache.scorer is not None and
                not cache.compressed and hidden is not None and hidden.shape[1] > 1):
            queries = queries_after_rope(module, hidden, kwargs["position_embeddings"])
            cache._queries[int(module.layer_idx)] = queries[:, -cache.window:].float()

    for layer in model.model.layers:
        layer.self_attn.register_forward_pre_hook(take_queries, with_kwargs=True)


def queries_after_rope(module, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
    """A Llama-style attention module's queries for `hidden` [1, q, hidden], after RoPE:
    [Hq, q, head_dim]."""
    queries = module.q_proj(hidden).view(*hidden.shape[:-1], -1, module.head_dim)
    if getattr(module, "q_norm", None) is not None:  # Qwen3-style: normed per head
        queries = module.q_norm(queries)
    queries = queries.transpose(1, 2)
    cos, sin = position_embeddings
    return (queries * cos.unsqueeze(1) + rotate_half(queries) * sin.unsqueeze(1))[0]


def window_scores(queries: torch.Tensor, keys: torch.Tensor, scale: float,
                  kernel: int = 5) -> torch.Tensor:
    """SnapKV's score of each of `keys` [H, n, d] from the window's `queries` [Hq, w, d] (the
    last w positions, causal within the window): softmax attention summed over the window
    and each KV head's query heads, average-pooled over `kernel` positions. [H, n] float32."""
    heads, n, dim = keys.shape
    group, w = queries.shape[0] // heads, queries.shape[1]
    q = queries.float().reshape(heads, group * w, dim)
    logits = torch.einsum("hqd,hnd->hqn", q, keys.float()) * scale
    seen = (n - w + torch.arange(w, device=keys.device)).repeat(group)  # each query's position
    logits = logits.masked_fill(torch.arange(n, device=keys.device)[None, None] > seen[None, :, None],
                                -float("inf"))
    summed = torch.softmax(logits, -1).sum(1)
    return torch.nn.functional.avg_pool1d(summed[:, None], kernel, stride=1,
                                          padding=kernel // 2)[:, 0]


class CompressedLayer(DynamicLayer):
    """One layer after compression: widened centroid keys, then appended tokens. `offset` is
    how many more tokens were seen than entries are kept."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, offset: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = keys, values
        self.offset = offset
        self.is_initialized = True

    def update(self, key_states, value_states, cache_kwargs=None):
        zeros = torch.zeros_like(key_states[..., :1])  # appended tokens: count 1, ln 1 = 0
        return super().update(torch.cat([key_states, zeros], dim=-1), value_states,
                              cache_kwargs)

    def get_seq_length(self) -> int:
        return self.keys.shape[-2] + self.offset

    def get_mask_sizes(self, cache_position):
        return self.keys.shape[-2] + cache_position.shape[0], self.offset

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a compressed CentroidKV cache cannot be cropped")


class CentroidKVCache(DynamicCache):
    """DynamicCache that compresses itself through `client` (a centroidkv.Client) after the
    prefill. `params`: compress_layers keyword arguments (SPEC parameters, backend, ...).
    scorer: None (the SPEC's job) or "window" (scored jobs, one budget over layers x heads;
    the module docstring); window: its queries; fit: send them as reference queries."""

    def __init__(self, client, *, compress_on_prefill: bool = True, scorer: Optional[str] = None,
                 window: int = 64, fit: bool = False, **params):
        super().__init__()
        if scorer not in (None, "window"):
            raise ValueError(f"CentroidKVCache: scorer {scorer!r} is not None or 'window'")
        if fit and scorer is None:
            raise ValueError("CentroidKVCache: fit needs a scorer (scorer='window')")
        if scorer is not None and ("target_ratio" in params) == ("target_tokens" in params):
            raise ValueError("CentroidKVCache: a scored cache needs exactly one of target_ratio "
                             "and target_tokens (the budget it splits over layers x heads)")
        self.client = client
        self.params = params
        self.scorer, self.window, self.fit = scorer, int(window), bool(fit)
        self._queries = {}  # layer -> the prefill's last window queries [Hq, w, d] (scorer)
        self.compress_on_prefill = compress_on_prefill
        self.compressed = False
        self.results = None  # the LayerResults, kept for inspection
        self._prefill_layers_seen = 0

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        out = super().update(key_states, value_states, layer_idx, cache_kwargs)
        if (self.compress_on_prefill and not self.compressed and key_states.shape[-2] > 1):
            self._prefill_layers_seen += 1
        return out

    def compress(self, scaling: Optional[float] = None) -> list:
        """Compresses every layer (one stream, pipelined) and replaces it by its centroids.
        scaling: the attention's logit scale (default 1 / sqrt(head_dim))."""
        if self.compressed:
            raise RuntimeError("this cache is already compressed")
        batch = self.layers[0].keys.shape[0]
        if batch != 1:
            raise ValueError(f"CentroidKVCache holds one sequence (batch {batch})")
        layers = [(layer.keys[0].contiguous(), layer.values[0].contiguous())
                  for layer in self.layers]
        scale = 1.0 / math.sqrt(layers[0][0].shape[-1]) if scaling is None else scaling
        params = self.params
        jobs = layers
        if self.scorer is not None:  # the budgets replace the target
            jobs = self._scored_jobs(layers, scale)
            params = {k: v for k, v in params.items() if k not in ("target_ratio", "target_tokens")}
        results = self.client.compress_layers(jobs, **params)
        for i, (result, (keys, _)) in enumerate(zip(results, layers)):
            padded = padded_heads(result, dtype=keys.dtype, device=keys.device)
            wide = widen_keys(padded.keys, padded.bias.to(keys.device), scale=scale)
            self.layers[i] = CompressedLayer(wide[None], padded.values[None],
                                             keys.shape[1] - wide.shape[1])
        self.compressed, self.results = True, results
        return results

    def _scored_jobs(self, layers: list, scale: float) -> list:
        """Each layer as a scored job: window scores, its heads' share of one global budget,
        the window's queries when fitted."""
        missing = [i for i in range(len(layers)) if i not in self._queries]
        if missing:
            raise RuntimeError(f"CentroidKVCache: no window queries for layers {missing}: call "
                               "centroidkv.transformers.enable(model) before the prefill")
        scores = [window_scores(self._queries[i], keys, scale).cpu().numpy()
                  for i, (keys, _) in enumerate(layers)]
        heads, tokens = layers[0][0].shape[0], layers[0][0].shape[1]
        per_head = (int(self.params["target_tokens"]) if "target_tokens" in self.params
                    else math.ceil(float(self.params["target_ratio"]) * tokens))
        budgets = global_budgets(
            scores, min(per_head, tokens) * heads * len(layers),
            sink=int(self.params.get("sink_tokens", SPEC["sink_tokens"])),
            recent=int(self.params.get("recent_tokens", SPEC["recent_tokens"])),
            passthrough_heads=self.params.get("passthrough_heads"))
        jobs = []
        for i, (keys, values) in enumerate(layers):
            job = dict(keys=keys, values=values, scores=scores[i],
                       head_budgets=budgets[i].tolist())
            if self.fit:
                job["queries"] = self._queries[i].cpu().numpy()
            jobs.append(job)
        return jobs
