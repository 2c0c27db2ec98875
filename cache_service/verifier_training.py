"""Fits the verifier's classifier on the tuning split of bench/data/cache_pairs.jsonl and writes
cache_service/verifier_model.npz (the trees as arrays, cache_service/tree_ensemble.py; + .json: what it was
fitted on). Never reads the frozen splits (test, external, fresh).

Every labelled pair becomes the turn pairs the verifier would be asked about: a single question pair as
itself; a conversation pair turn by turn, skipping turns worded the same (pair_checks.wording). A turn pair
is positive when one answer serves both (a pair that should hit, or the reworded last question of a
conversation whose earlier turns changed) and negative otherwise. Pairs the vetoes refuse (numbers, negation)
never reach the classifier, so they are left out; the other checks' objections are features
(pair_checks.check_flags). Gradient-boosted trees (scikit-learn, pinned): small, fast (~0.1
ms for four candidates), and they can learn that near-identical questions are the dangerous ones (one
substituted word).

`bench/cache_quality.py` fits the same recipe once per cross-validation fold (FOLDS folds of the tuning
topics) to choose the thresholds on predictions for pairs the classifier has not seen.

    .venv/bin/python -m cache_service.verifier_training [--embedding-model all-mpnet-base-v2]

Each embedding model has its own classifier (cache_service/embedding_models.py): the features are read off
the model's vectors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import sklearn
from sklearn.ensemble import HistGradientBoostingClassifier

from cache_service.embedder import Embedder
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, EMBEDDING_MODELS
from cache_service.pair_checks import expand_contractions, same_wording, veto
from cache_service.pair_features import FEATURE_NAMES, pair_features, text_features
from cache_service.token_states import TokenEncoder
from cache_service.tree_ensemble import TreeEnsemble

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "cache_pairs.jsonl"
PARTITION_KINDS = ("tenant",)  # decided by the partition, not by meaning: nothing to learn from
FOLDS = 5

Pair = tuple[str, str, bool]


def fold_of(topic: str) -> int:
    return int(hashlib.sha256(topic.encode()).hexdigest(), 16) % FOLDS


def load_rows(path: Path = DATA) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tune_rows(rows: list[dict], held_out_fold: int | None = None) -> list[dict]:
    """The tuning split's rows the models learn from (all, or all but one cross-validation fold)."""
    return [
        r
        for r in rows
        if r["split"] == "tune" and r["kind"] not in PARTITION_KINDS and fold_of(r["topic"]) != held_out_fold
    ]


def turns(side: str | list[dict[str, str]]) -> list[str]:
    return [side] if isinstance(side, str) else [m["content"] for m in side]


def _comparable(x: str, y: str) -> bool:
    return not same_wording(x, y) and not veto(x, y)


def turn_pairs(row: dict) -> list[Pair]:
    a, b = turns(row["a"]), turns(row["b"])
    if len(a) != len(b):
        return []
    out = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        x, y = expand_contractions(x), expand_contractions(y)  # as the verifier reads them
        if _comparable(x, y):
            last_of_conversation = len(a) > 1 and i == len(a) - 1
            out.append((x, y, bool(row["should_hit"]) or last_of_conversation))
    return out


def labelled_pairs(rows: list[dict]) -> list[Pair]:
    return [p for r in rows for p in turn_pairs(r)]


def fit_classifier(embedder: TokenEncoder, pairs: list[Pair]) -> HistGradientBoostingClassifier:
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    states = {}
    for start in range(0, len(texts), 64):
        chunk = texts[start : start + 64]
        states.update(zip(chunk, embedder.encode_tokens(chunk), strict=True))
    features = np.stack([pair_features(states[a], states[b], text_features(a, b)) for a, b, _ in pairs])
    labels = np.array([same for _, _, same in pairs])
    model = HistGradientBoostingClassifier(max_depth=3, max_iter=200, learning_rate=0.05, random_state=0)
    return model.fit(features, labels)


def train(rows: list[dict], embedder: TokenEncoder) -> tuple[HistGradientBoostingClassifier, dict[str, int]]:
    """The classifier fitted on the given tuning rows, and a note of what it learned from."""
    pairs = labelled_pairs(rows)
    note = {"pairs": len(pairs), "positives": sum(1 for *_, same in pairs if same)}
    return fit_classifier(embedder, pairs), note


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--embedding-model", default=DEFAULT_EMBEDDING_MODEL, choices=sorted(EMBEDDING_MODELS)
    )
    args = parser.parse_args()
    model_file = EMBEDDING_MODELS[args.embedding_model].verifier_file
    embedder = Embedder(dtype="float32", model=args.embedding_model)
    classifier, note = train(tune_rows(load_rows()), embedder)
    TreeEnsemble.from_sklearn(classifier).save(model_file)
    meta = {
        "features": list(FEATURE_NAMES),
        "data": str(DATA.relative_to(DATA.parent.parent.parent)),
        "data_sha256": hashlib.sha256(DATA.read_bytes()).hexdigest(),
        "split": "tune (every fold)",
        **note,
        "embedding_model": embedder.model,
        "embedding_dtype": embedder.dtype,
        "context_layers": list(embedder.context_layers),
        "scikit_learn": sklearn.__version__,
    }
    model_file.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
