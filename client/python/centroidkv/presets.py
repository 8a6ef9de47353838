"""The named parameter sets every tool starts from, mirrored once from the C++
types/include/centroidkv/types/presets.h (tests/python/test_presets.py keeps them equal):

- SPEC: SPEC section 2's defaults, what the service runs for a job without parameters
  (chunk 256, sink 16, recent 64);
- SMALL_MODEL: the quality tools' and reports' set for small models with short prefills
  (chunk 32, sink 4, recent 32; tuned on calibration texts, docs/results/quality_tuning.md).

Each is a dict of Client.compress keywords: `client.compress(k, v, **SMALL_MODEL)`,
`CentroidKVPress(client, target_ratio=0.25, **SMALL_MODEL)`.
"""
from __future__ import annotations

SPEC = {"chunk_size": 256, "sink_tokens": 16, "recent_tokens": 64}
SMALL_MODEL = {"chunk_size": 32, "sink_tokens": 4, "recent_tokens": 32}
PRESETS = {"spec": SPEC, "small-model": SMALL_MODEL}


def preset(name: str) -> dict:
    """A copy of the preset called `name` ("spec", "small-model")."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
