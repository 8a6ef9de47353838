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
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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
    prefill. `params`: compress_layers keyword arguments (SPEC parameters, backend, ...)."""

    def __init__(self, client, *, compress_on_prefill: bool = True, **params):
        super().__init__()
        self.client = client
        self.params = params
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
        results = self.client.compress_layers(layers, **self.params)
        for i, (result, (keys, _)) in enumerate(zip(results, layers)):
            padded = padded_heads(result, dtype=keys.dtype, device=keys.device)
            scale = 1.0 / math.sqrt(keys.shape[-1]) if scaling is None else scaling
            wide = widen_keys(padded.keys, padded.bias.to(keys.device), scale=scale)
            self.layers[i] = CompressedLayer(wide[None], padded.values[None],
                                             keys.shape[1] - wide.shape[1])
        self.compressed, self.results = True, results
        return results
