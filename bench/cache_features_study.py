"""Study, tuning split only: which extra features should the verifier's classifier read?

Each variant appends features to cache_service/pair_features.py's (patched for the run), the classifier is
fitted once per cross-validation fold of the tuning topics, and every tuning pair is looked up out of fold
against one index of all tuning questions (bench/cache_quality.py's harness). Printed per variant: the
rule's pick (false hits at most 1% of every kind, then most served) and the strict end of the trade-off, the
most should-hit pairs served with at most k false hits over a grid of thresholds. Never reads the frozen
splits; nothing is shipped from it.

Variants (joined with "+"):
- `base`: the shipped features (since 2026-12-03 with word rarity, cache_service/word_frequency.py, which
  this study measured as a variant before it shipped: docs/SEMANTIC_CACHE.md);
- `rare2`: also, per side, how many one-sided content words are rare (Zipf < 4);
- `interaction`: the two sentence vectors' element-wise product and absolute difference (the classic
  classification head on sentence embeddings), so the trees can read which directions of meaning differ;
- `bagK`: K classifiers fitted on bootstrap samples of the turn pairs, averaged.

`--model-dir` reads the states of another model directory of the same architecture (the distillation
study's student); `--fold K` judges fold K's lookups alone (against every tuning entry).

    .venv/bin/python -m bench.cache_features_study --variants base rare2 interaction bag5
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from bench.cache_quality import FOLDS, evaluation_rows, run_lookups, trade_off_row
from cache_service import pair_features as pf
from cache_service import verifier, verifier_training
from cache_service.embedder import Embedder
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL
from cache_service.pair_checks import words
from cache_service.related_words import one_sided_words
from cache_service.token_states import TokenStateCache
from cache_service.tree_ensemble import TreeEnsemble
from cache_service.verifier import PairVerifier
from cache_service.verifier_training import fold_of, load_rows, train, tune_rows
from cache_service.word_frequency import zipf

BUDGETS = (10, 20, 30, 40, 60)
GRID = (
    (0.55, 0.60, 0.65, 0.70, 0.75, 0.80),
    (0.90, 0.93, 0.95, 0.96, 0.97, 0.98, 0.985, 0.99, 0.995),
    (0.5, 0.6, 0.7, 0.8),
)


def rare_counts(a: str, b: str) -> tuple[float, ...]:
    """Per side (sorted), how many content words only that side has are rare in English (Zipf < RARE)."""
    only_a, only_b, _ = one_sided_words(words(a), words(b))
    return tuple(
        float(n) for n in sorted((sum(zipf(w) < RARE for w in only_a), sum(zipf(w) < RARE for w in only_b)))
    )


RARE = 4.0  # Zipf: rarer than once in 100,000 words


def interaction(a: pf.TokenStates, b: pf.TokenStates) -> np.ndarray:
    return np.concatenate([a.sentence * b.sentence, np.abs(a.sentence - b.sentence)]).astype(np.float64)


def patch(variant: str) -> None:
    text_extra: Callable[[str, str], tuple[float, ...]] | None = rare_counts if "rare2" in variant else None
    state_extra = interaction if "interaction" in variant else None

    def text_features(a: str, b: str) -> tuple[float, ...]:
        base = pf.text_features(a, b)
        return base + text_extra(a, b) if text_extra else base

    def pair_features(a: pf.TokenStates, b: pf.TokenStates, texts) -> np.ndarray:  # noqa: ANN001
        base = pf.pair_features(a, b, texts)
        return np.concatenate([base, state_extra(a, b)]) if state_extra else base

    for module in (verifier, verifier_training):
        module.text_features = text_features
        module.pair_features = pair_features


def fit(variant: str, rows: list[dict], states: TokenStateCache) -> TreeEnsemble:
    """The shipped recipe, or (variant `bagK`) K of its models fitted on bootstrap samples of the turn
    pairs, averaged in logit space (one ensemble whose leaves are scaled by 1/K)."""
    bags = next((int(p[3:]) for p in variant.split("+") if p.startswith("bag")), 0)
    if not bags:
        return TreeEnsemble.from_sklearn(train(rows, states)[0])
    pairs = verifier_training.labelled_pairs(rows)
    rng = np.random.default_rng(0)
    models = []
    for _ in range(bags):
        sample = [pairs[i] for i in rng.integers(0, len(pairs), len(pairs))]
        models.append(TreeEnsemble.from_sklearn(verifier_training.fit_classifier(states, sample)))
    width = max(m.feature.shape[1] for m in models)

    def cat(field: str) -> np.ndarray:
        arrays = [getattr(m, field) for m in models]
        padded = [
            np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=(True if a.dtype == bool else 0))
            for a in arrays
        ]
        return np.concatenate(padded)

    return TreeEnsemble(
        baseline=float(np.mean([m.baseline for m in models])),
        feature=cat("feature"),
        threshold=cat("threshold"),
        left=cat("left"),
        right=cat("right"),
        is_leaf=cat("is_leaf"),
        value=cat("value") / bags,
        depth=max(m.depth for m in models),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", default=["base", "rarity"])
    parser.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL)
    parser.add_argument("--model-dir", default=None, help="another directory of the same architecture")
    parser.add_argument(
        "--budgets", default=",".join(map(str, BUDGETS)), help="false-hit budgets, comma-separated"
    )
    parser.add_argument(
        "--fold",
        type=int,
        default=None,
        help="judge only this fold's lookups (against the whole tuning index)",
    )
    args = parser.parse_args()
    all_rows = load_rows()
    rows = [r for r in evaluation_rows(all_rows) if r["split"] == "tune"]
    embedder = Embedder(path=args.model_dir, model=args.embedding_model)
    states = TokenStateCache(embedder, capacity_mb=1 << 16)
    print(f"{args.model_dir or args.embedding_model}, tuning split out of fold, {len(rows)} pairs")
    print("| variant | rule's pick | served / false hits there | most served, <= k false hits |")
    print("| --- | --- | --- | --- |")
    for variant in args.variants:
        patch(variant)
        by_fold = {}
        for fold in range(FOLDS):
            by_fold[fold] = PairVerifier(
                states, fit(variant, tune_rows(all_rows, held_out_fold=fold), states)
            )
        judged = rows if args.fold is None else [r for r in rows if fold_of(r["topic"]) == args.fold]
        lookups = run_lookups(
            judged,
            states,
            embedder.dim,
            lambda r, by_fold=by_fold: by_fold[fold_of(r["topic"])],
            stored_rows=rows,
        )
        budgets = [int(k) for k in args.budgets.split(",")]
        print(trade_off_row(variant, judged, lookups, GRID, budgets), flush=True)


if __name__ == "__main__":
    main()
