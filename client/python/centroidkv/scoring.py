"""Importance scores and reference queries computed in the model, for scored and fitted jobs
(docs/scored-jobs.md), with any kvpress scorer press (kvpress; extra `[kvpress]`):

- KVzipPress: its own replay ("Repeat the previous context") runs as its block ends; each
  entry's score is its largest attention from the replay's queries (arXiv 2505.23416). Its
  eviction is not applied: the scores are taken instead. The replay's queries (after RoPE)
  are the reference queries.
- any ScorerPress (SnapKVPress, ExpectedAttentionPress, KnormPress, TOVAPress, ...): its
  `score()` on each layer during the prefill; the prefill's last `window` queries are the
  reference queries.

`capture(model, scorer, ...)` is a context manager around the prefill; on exit `scores`
({layer: [H, n] float32 numpy}), `queries` ({layer: [Hq, m, d] float32 numpy}, when asked),
`keys` / `values` ({layer: [H, n, d] torch}) and `cache` hold what it saw. The cache is left
as the prefill made it, uncompressed.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from transformers.models.llama.modeling_llama import rotate_half

from kvpress.presses.base_press import is_prefilling
from kvpress.presses.kvzip_press import KVzipPress
from kvpress.presses.scorer_press import ScorerPress
from kvpress.utils import get_prerope_query_states


def queries_after_rope(module, hidden_states, kwargs) -> torch.Tensor:
    """The layer's queries for `hidden_states` [1, q, hidden], after RoPE: [Hq, q, d]."""
    queries = get_prerope_query_states(module, hidden_states)  # [1, Hq, q, d]
    cos, sin = kwargs["position_embeddings"]
    queries = queries * cos.unsqueeze(1) + rotate_half(queries) * sin.unsqueeze(1)
    return queries[0]


@dataclass
class Capture:
    scorer: Any
    queries_wanted: bool = False
    window: int = 64           # a ScorerPress's reference queries: the prefill's last ones
    max_queries: int = 512     # per query head, evenly subsampled beyond this
    scores: dict = field(default_factory=dict)
    queries: dict = field(default_factory=dict)
    keys: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    cache: Any = None
    _replay: dict = field(default_factory=dict)  # layer -> [query tensors] of the replay
    _phase: str = "prefill"

    def _hook(self, module, args, kwargs, output):
        layer = int(module.layer_idx)
        cache = kwargs.get("past_key_values") or kwargs.get("past_key_value")
        hidden = kwargs["hidden_states"]
        if self._phase == "prefill":
            if not is_prefilling(kwargs["cache_position"], hidden.shape[1]):
                return output
            self.cache = cache
            keys, values = cache.layers[layer].keys, cache.layers[layer].values
            self.keys[layer], self.values[layer] = keys[0], values[0]
            if isinstance(self.scorer, ScorerPress):
                with torch.no_grad():
                    s = self.scorer.score(module, hidden, keys, values, output[1], kwargs)
                self.scores[layer] = s[0].float().cpu().numpy()
            if self.queries_wanted and not isinstance(self.scorer, KVzipPress):
                with torch.no_grad():
                    q = queries_after_rope(module, hidden[:, -self.window:], {
                        "position_embeddings": tuple(
                            p[:, -self.window:] for p in kwargs["position_embeddings"])})
                self.queries[layer] = q.float().cpu().numpy()
        elif self.queries_wanted:  # KVzip's replay
            with torch.no_grad():
                self._replay.setdefault(layer, []).append(
                    queries_after_rope(module, hidden, kwargs).float().cpu())
        return output

    def _grab_kvzip_scores(self, model) -> None:
        """Replaces KVzipPress.compress_post: the scores, no eviction."""
        values = self.scorer.score_val  # [L, 1, H, n] (n: the context, prefix included)
        for layer in range(values.shape[0]):
            self.scores[layer] = values[layer, 0].float().cpu().numpy()

    def _finish_replay(self) -> None:
        for layer, parts in self._replay.items():
            q = torch.cat(parts, dim=1)  # [Hq, m, d]
            if q.shape[1] > self.max_queries:
                keep = torch.linspace(0, q.shape[1] - 1, self.max_queries).round().long()
                q = q[:, keep]
            self.queries[layer] = q.numpy()


@contextmanager
def capture(model, scorer, *, queries: bool = False, window: int = 64, max_queries: int = 512):
    """Scores (and reference queries) of one prefill, as the module docstring says."""
    if not isinstance(scorer, (KVzipPress, ScorerPress)):
        raise TypeError(f"scorer {type(scorer).__name__}: a KVzipPress or a kvpress "
                        "ScorerPress (SnapKVPress, ExpectedAttentionPress, ...)")
    run = Capture(scorer, queries, window, max_queries)
    layers = model.model.layers
    hooks = [layer.self_attn.register_forward_hook(run._hook, with_kwargs=True)
             for layer in layers]
    try:
        if isinstance(scorer, KVzipPress):
            scorer.compress_post = run._grab_kvzip_scores  # scores, not its eviction
            ratio = scorer.compression_ratio
            scorer.compression_ratio = ratio or 0.5  # KVzip replays only when it compresses
            try:
                with scorer(model):
                    yield run
                    run._phase = "replay"  # its block's exit runs the replay
            finally:
                del scorer.compress_post
                scorer.compression_ratio = ratio
            run._finish_replay()
        else:
            yield run
    finally:
        for hook in hooks:
            hook.remove()
    missing = [i for i in range(len(layers)) if i not in run.scores]
    if missing:
        raise RuntimeError(f"no scores for layers {missing}: the scorer saw no prefill")
