"""Count-aware attention over a compressed layer (torch).

A merged entry that stands for c original tokens gets ln(c) added to its logit (a fitted
job's real-valued log-weight instead: LayerResult.log_weights), so that attention over the
centroids approximates attention over the tokens they replaced:

    softmax(q k^T * scale + ln c) V          (scale = 1 / sqrt(dk) by default)

From a LayerResult: `log_count_bias` (ln c per entry), `padded_heads` (per-head tensors
[H, T, d] padded to the longest head, pad entries' bias -inf), `attention` (the formula,
one call, grouped-query heads included), and the bias-free form for kernels that take no
bias: `widen_keys` appends ln(c) / scale as one more key dimension and `widen_queries` a
constant 1, so that q' k'^T * scale == q k^T * scale + ln c exactly in real arithmetic.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np
import torch

from .result import LayerResult


class PaddedHeads(NamedTuple):
    keys: torch.Tensor    # [H, T, dk]
    values: torch.Tensor  # [H, T, dv]
    bias: torch.Tensor    # [H, T] float32: ln(count), -inf on pad entries
    lengths: torch.Tensor  # [H] int64: entries of each head


def _as_tensor(x, dtype=None, device=None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    else:
        a = np.ascontiguousarray(x)
        # Counts and offsets come as uint32; torch.from_numpy takes uint32 only from torch
        # 2.3 (the torch extra supports 2.2, client/python/check_oldest.sh): widen them.
        t = torch.from_numpy(a.astype(np.int64) if a.dtype == np.uint32 else a)
    return t.to(device=device, dtype=dtype if dtype is not None else t.dtype)


def log_count_bias(counts, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """ln(count) per entry ([total] or any shape), in `dtype`."""
    c = _as_tensor(counts)
    return torch.log(c.to(torch.float64)).to(dtype=dtype, device=device)


def padded_heads(result: LayerResult, *, dtype=None, device=None) -> PaddedHeads:
    """The result's heads as [H, T, d] tensors (T = the longest head; fp8 rows widened with
    their scales), with the additive bias [H, T]: ln(count) for real entries (a fitted
    job's log-weights instead), -inf for padding."""
    offsets = _as_tensor(result.offsets).to(torch.int64).cpu()
    lengths = offsets[1:] - offsets[:-1]
    heads, longest = result.num_heads, int(lengths.max()) if lengths.numel() else 0
    if result.key_scales is not None:  # fp8 rows: each code x its head's scale
        keys = _as_tensor(result.float_keys(), dtype or torch.float32, device)
        values = _as_tensor(result.float_values(), dtype or torch.float32, device)
    else:
        keys = _as_tensor(result.keys, dtype, device)
        values = _as_tensor(result.values, dtype, device)
    if result.log_weights is not None:  # a fitted job: its log-weights replace ln(count)
        bias_rows = _as_tensor(result.log_weights, torch.float32, device)
    else:
        bias_rows = log_count_bias(result.counts, device=device)
    # Row r of head h sits at offsets[h] + r; pad slots point at row 0 and are masked.
    slot = torch.arange(longest)
    valid = slot[None, :] < lengths[:, None]                         # [H, T]
    rows = torch.where(valid, offsets[:-1, None] + slot[None, :], 0)  # [H, T]
    rows_d, valid_d = rows.to(keys.device), valid.to(keys.device)
    k = keys[rows_d] * valid_d[..., None]
    v = values[rows_d] * valid_d[..., None]
    bias = torch.where(valid_d, bias_rows[rows_d], torch.tensor(-math.inf, device=keys.device))
    return PaddedHeads(k.reshape(heads, longest, -1), v.reshape(heads, longest, -1), bias,
                       lengths)


def _repeat_kv(x: torch.Tensor, query_heads: int) -> torch.Tensor:
    heads = x.shape[0]
    if query_heads % heads != 0:
        raise ValueError(f"{query_heads} query heads are not a multiple of {heads} KV heads")
    return x.repeat_interleave(query_heads // heads, dim=0)


def attention(q: torch.Tensor, layer, *, scale: Optional[float] = None) -> torch.Tensor:
    """softmax(q k^T * scale + ln c) V per head. q: [Hq, m, dk] (Hq a multiple of the
    layer's H: grouped-query attention); layer: a LayerResult or its PaddedHeads.
    Returns [Hq, m, dv] in q's dtype (computed in float32)."""
    padded = padded_heads(layer, device=q.device) if isinstance(layer, LayerResult) else layer
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = _repeat_kv(padded.keys, q.shape[0]).float()
    v = _repeat_kv(padded.values, q.shape[0]).float()
    bias = _repeat_kv(padded.bias, q.shape[0]).float()
    logits = torch.matmul(q.float(), k.transpose(-1, -2)) * scale + bias[:, None, :]
    return torch.matmul(torch.softmax(logits, dim=-1), v).to(q.dtype)


def widen_keys(keys: torch.Tensor, bias: torch.Tensor, *, scale: Optional[float] = None):
    """keys [..., T, d] -> [..., T, d + 1], the extra dimension holding bias / scale
    (sqrt(d) * ln c at the default scale; -inf for pad entries)."""
    scale = 1.0 / math.sqrt(keys.shape[-1]) if scale is None else scale
    extra = (bias.to(torch.float32) / scale).to(keys.dtype)
    return torch.cat([keys, extra[..., None]], dim=-1)


def widen_queries(q: torch.Tensor) -> torch.Tensor:
    """q [..., m, d] -> [..., m, d + 1], the extra dimension a constant 1."""
    return torch.cat([q, torch.ones_like(q[..., :1])], dim=-1)
