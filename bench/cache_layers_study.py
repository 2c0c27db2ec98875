"""Study, tuning split only: which hidden layers should join the last in the verifier's contextual vectors?

For each candidate set of layers (`context_layers` of cache_service/embedding_models.py, patched for the run),
the sentence model's word-piece states are computed through the product's own Embedder, the classifier is
fitted once per cross-validation fold of the tuning topics, and every tuning pair is looked up out of fold
against one index of all tuning questions (bench/cache_quality.py's harness). Printed per set: the rule's
pick (false hits at most 1% of every kind, then most served) and the strict end of the trade-off, the most
should-hit pairs served with at most k false hits over a grid of thresholds. Never reads the frozen splits;
nothing is shipped from it.

    .venv/bin/python -m bench.cache_layers_study --layers none 2 3 4 5 2,4
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from bench.cache_quality import FOLDS, evaluation_rows, run_lookups, trade_off_row
from cache_service import embedding_models
from cache_service.embedder import Embedder
from cache_service.token_states import TokenStateCache
from cache_service.tree_ensemble import TreeEnsemble
from cache_service.verifier import PairVerifier
from cache_service.verifier_training import fold_of, load_rows, train, tune_rows

BUDGETS = (4, 6, 8, 10, 15)
GRID = (
    (0.55, 0.60, 0.70),
    (0.90, 0.95, 0.96, 0.97, 0.98, 0.985, 0.99, 0.995),
    (0.5, 0.6, 0.7),
)


def parse_layers(spec: str) -> tuple[int, ...]:
    return () if spec == "none" else tuple(int(k) for k in spec.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--layers", nargs="+", default=["none", "2"], help="'none' or comma-separated indices"
    )
    parser.add_argument("--embedding-model", default=embedding_models.MINILM)
    parser.add_argument("--embedding-backend", default="auto", help="as CACHE_EMBEDDING_BACKEND")
    args = parser.parse_args()
    all_rows = load_rows()
    rows = [r for r in evaluation_rows(all_rows) if r["split"] == "tune"]
    shipped = embedding_models.EMBEDDING_MODELS[args.embedding_model]
    print(f"{args.embedding_model}, tuning split out of fold, {len(rows)} pairs")
    print(
        "| layers beside the last | rule's pick | served / false hits there | most served, <= k false hits |"
    )
    print("| --- | --- | --- | --- |")
    for spec in args.layers:
        embedding_models.EMBEDDING_MODELS[args.embedding_model] = replace(
            shipped, context_layers=parse_layers(spec)
        )
        embedder = Embedder(model=args.embedding_model, backend=args.embedding_backend)
        states = TokenStateCache(embedder, capacity_mb=1 << 16)
        by_fold = {}
        for fold in range(FOLDS):
            classifier, _ = train(tune_rows(all_rows, held_out_fold=fold), states)
            by_fold[fold] = PairVerifier(states, TreeEnsemble.from_sklearn(classifier))
        lookups = run_lookups(
            rows, states, embedder.dim, lambda r, by_fold=by_fold: by_fold[fold_of(r["topic"])]
        )
        print(trade_off_row(spec, rows, lookups, GRID, BUDGETS))
    embedding_models.EMBEDDING_MODELS[args.embedding_model] = shipped


if __name__ == "__main__":
    main()
