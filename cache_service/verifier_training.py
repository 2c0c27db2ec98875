"""Trains the verifier's two learned parts on the tuning split of bench/data/cache_pairs.jsonl and writes them
beside this file; never reads the test split.

- the classifier over word-piece alignment features (cache_service/pair_features.py): gradient-boosted
  trees, exported as arrays (`verifier_model.npz`, cache_service/tree_ensemble.py; + .json: what it was
  fitted on);
- the cross-encoder (cache_service/cross_encoder.py): low-rank adapters and a head on the packaged MiniLM
  (`verifier_adapter.npz`).

Training pairs: every labelled pair becomes the turn pairs the verifier would be asked about (a single
question as itself, a conversation turn by turn, identical turns skipped); a turn pair is positive when one
answer serves both (a pair that should hit, or the reworded last question of a conversation whose earlier
turns changed). Pairs the cheap checks already veto never reach either model, so they are left out.

The cross-encoder's recipe was chosen by cross-validation on the tuning split (docs/SEMANTIC_CACHE.md): adding
pairs drawn across answer groups (two questions of one group as positives, close questions of different
groups as negatives) with a gentler learning rate made it worse there, so it learns from the labelled pairs
alone.

`bench/cache_quality.py` runs the same recipe per cross-validation fold (FOLDS folds of the tuning topics)
to choose the thresholds on predictions for pairs each model has not seen.

    .venv/bin/python -m cache_service.verifier_training
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
from sklearn.ensemble import HistGradientBoostingClassifier

from cache_service.cross_encoder import ADAPTER_FILE, adapted_linears, load_encoder, lora_init, pair_logits
from cache_service.embedder import Embedder
from cache_service.keys import normalize_text
from cache_service.pair_checks import expand_contractions, veto
from cache_service.pair_features import FEATURE_NAMES, pair_features
from cache_service.tree_ensemble import TreeEnsemble
from cache_service.verifier import MODEL_FILE

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "cache_pairs.jsonl"
PARTITION_KINDS = ("tenant",)  # decided by the partition, not by meaning: nothing to learn from
FOLDS = 5
# Cross-encoder recipe (chosen by cross-validation on the tuning split, docs/SEMANTIC_CACHE.md).
RANK, EPOCHS, LEARNING_RATE, BATCH, SEED = 8, 8, 1e-3, 16, 0

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
    return normalize_text(x) != normalize_text(y) and not veto(x, y)


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


def fit_classifier(embedder: Embedder, pairs: list[Pair]) -> HistGradientBoostingClassifier:
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    states = {}
    for start in range(0, len(texts), 64):
        chunk = texts[start : start + 64]
        states.update(zip(chunk, embedder.encode_tokens(chunk), strict=True))
    features = np.stack([pair_features(states[a], states[b]) for a, b, _ in pairs])
    labels = np.array([same for _, _, same in pairs])
    model = HistGradientBoostingClassifier(max_depth=3, max_iter=200, learning_rate=0.05, random_state=0)
    return model.fit(features, labels)


def train_cross_encoder(pairs: list[Pair], seed: int = SEED) -> dict[str, np.ndarray]:
    """Low-rank adapters (rank RANK) on every linear layer of the encoder and a head, trained with the
    encoder's own weights frozen, on both orders of every pair; returns the arrays of the adapter file."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # the embedder pins one thread for serving; training wants all
    try:
        return _train_cross_encoder(torch, pairs, seed)
    finally:
        torch.set_num_threads(threads)


def _train_cross_encoder(torch: Any, pairs: list[Pair], seed: int) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    encoder, tokenizer = load_encoder()
    for p in encoder.parameters():
        p.requires_grad_(False)
    adapters: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
    for name, linear in adapted_linears(encoder):
        a, b = lora_init(RANK, linear.in_features, linear.out_features, generator)
        adapters[name] = (torch.nn.Parameter(a), torch.nn.Parameter(b))
        _add_adapter(linear, *adapters[name])
    head = torch.nn.Linear(encoder.config.hidden_size, 1)
    params = [p for ab in adapters.values() for p in ab] + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.01)
    data = [(a, b, float(s)) for a, b, s in pairs] + [(b, a, float(s)) for a, b, s in pairs]
    steps = EPOCHS * math.ceil(len(data) / BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, LEARNING_RATE, total_steps=steps, pct_start=0.1)
    order = random.Random(seed)
    encoder.train()
    for _ in range(EPOCHS):
        order.shuffle(data)
        for start in range(0, len(data), BATCH):
            batch = data[start : start + BATCH]
            logits = pair_logits(encoder, tokenizer, head, [x for x, _, _ in batch], [y for _, y, _ in batch])
            target = torch.tensor([s for *_, s in batch])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    out = {}
    for name, (a, b) in adapters.items():
        out[f"{name}.a"] = a.detach().numpy().copy()
        out[f"{name}.b"] = b.detach().numpy().copy()
    out["head.weight"] = head.weight.detach().numpy().copy()
    out["head.bias"] = head.bias.detach().numpy().copy()
    return out


def _add_adapter(linear: Any, a: Any, b: Any) -> None:
    """linear(x) + x A^T B^T while training (merged into the weight at load by CrossEncoder)."""
    plain = linear.forward
    linear.forward = lambda x: plain(x) + (x @ a.T) @ b.T


def train(
    rows: list[dict], embedder: Embedder
) -> tuple[HistGradientBoostingClassifier, dict[str, np.ndarray], dict[str, int]]:
    """Both models on the given tuning rows, and a note of what they learned from."""
    pairs = labelled_pairs(rows)
    note = {"pairs": len(pairs), "positives": sum(1 for *_, same in pairs if same)}
    return fit_classifier(embedder, pairs), train_cross_encoder(pairs), note


def main() -> None:
    embedder = Embedder(dtype="float32")
    classifier, cross, note = train(tune_rows(load_rows()), embedder)
    TreeEnsemble.from_sklearn(classifier).save(MODEL_FILE)
    np.savez_compressed(ADAPTER_FILE, **cross)
    meta = {
        "features": list(FEATURE_NAMES),
        "data": str(DATA.relative_to(DATA.parent.parent.parent)),
        "data_sha256": hashlib.sha256(DATA.read_bytes()).hexdigest(),
        "split": "tune (every fold)",
        **note,
        "cross_encoder": {"rank": RANK, "epochs": EPOCHS, "learning_rate": LEARNING_RATE, "seed": SEED},
        "embedding_dtype": embedder.dtype,
        "scikit_learn": sklearn.__version__,
    }
    MODEL_FILE.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
