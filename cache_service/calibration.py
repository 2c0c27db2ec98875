"""The risk knob: CACHE_MAX_FALSE_HIT_RATE (the operator's ceiling on false hits) -> the semantic tier's
cosine threshold.

cache_service/calibration.json holds, per embedding model, the lowest cosine threshold at which the whole
cache (exact, canonical and semantic tiers with their vetoes), on the tune split, kept the one-sided 95%
upper confidence bound of its false-hit rate within that budget pooled, and within 1.5 times it for every
kind of trap (tools/cache/evaluate.py --write-calibration, rule in tools/cache/ceiling.py; the frozen
splits are never used). A ceiling between two calibrated budgets takes the
stricter one; below the smallest, the semantic tier is off (exact and canonical hits only).
"""

from __future__ import annotations

import functools
import json

from cache_service.artifacts import path_of

CALIBRATION_FILE = path_of("calibration")  # listed in cache_service/artifacts.json
BUDGETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.1)
SEMANTIC_OFF = 1.01  # above any cosine: no semantic hit


@functools.cache
def _table() -> dict[str, dict[float, float]]:
    models = json.loads(CALIBRATION_FILE.read_text())["models"]
    return {m: {float(b): float(t) for b, t in v.items()} for m, v in models.items()}


def calibrated_models() -> list[str]:
    return sorted(_table())


def thresholds_for(model: str, max_false_hit_rate: float) -> float:
    """The semantic tier's cosine threshold for `model` at the ceiling `max_false_hit_rate`."""
    table = _table().get(model)
    if table is None:
        raise ValueError(
            f"no calibration for embedding model {model}: run tools.cache.evaluate --embedding-model {model} "
            "--write-calibration, or set CACHE_SIMILARITY_THRESHOLD"
        )
    allowed = [b for b in table if b <= max_false_hit_rate + 1e-12]
    return table[max(allowed)] if allowed else SEMANTIC_OFF
