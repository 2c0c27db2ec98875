"""Study, tuning split only: would fine-tuning the sentence model itself make the verifier serve more?

For each cross-validation fold of the tuning topics, all-MiniLM-L6-v2 is fine-tuned on that fold's training
turn pairs (the verifier's own, cache_service/verifier_training.py: positives and traps, pairs the vetoes
refuse left out) with the CoSENT loss (every positive pair's cosine pushed above every negative pair's in the
batch), the trees are refitted on its states, and the held-out fold is looked up as bench/cache_quality.py
does (every tuning question stored in one index). The rule that picks the shipped thresholds then runs on the
out-of-fold lookups. `--epochs 0` is the shipped recipe (no fine-tuning), for comparison in the same run.
Never reads the frozen splits. Prints figures; nothing is shipped from it.

    .venv/bin/python -m bench.cache_finetune_study --epochs 1
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from bench.cache_quality import Lookup, evaluation_rows, pick, run_lookups, tally, totals
from cache_service.embedder import Embedder
from cache_service.embedding_models import MINILM, embedding_model
from cache_service.token_states import TokenStateCache
from cache_service.tree_ensemble import TreeEnsemble
from cache_service.verifier import PairVerifier, Thresholds
from cache_service.verifier_training import FOLDS, Pair, fold_of, labelled_pairs, load_rows, train, tune_rows

BATCH = 32
SCALE = 20.0  # CoSENT's temperature on the cosines


def cosent_loss(cosines: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log(1 + sum over (positive i, negative j) of exp(SCALE * (cos_j - cos_i)))."""
    diff = SCALE * (cosines[None, :] - cosines[:, None])
    ordered = labels[:, None] > labels[None, :]
    return torch.logsumexp(torch.cat([torch.zeros(1), diff[ordered]]), dim=0)


def fine_tune(pairs: list[Pair], epochs: float, lr: float, out: str) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(embedding_model(MINILM).default_directory(), device="cpu")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = int(epochs * len(pairs) / BATCH)
    order: list[Pair] = []
    while len(order) < steps * BATCH:
        shuffled = pairs[:]
        random.shuffle(shuffled)
        order += shuffled
    started = time.perf_counter()
    for step in range(steps):
        batch = order[step * BATCH : (step + 1) * BATCH]
        a = model(model.preprocess([x for x, _, _ in batch]))["sentence_embedding"]
        b = model(model.preprocess([y for _, y, _ in batch]))["sentence_embedding"]
        labels = torch.tensor([float(same) for *_, same in batch])
        loss = cosent_loss(torch.nn.functional.cosine_similarity(a, b), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save(out)
    print(f"  fine-tuned: {steps} steps in {time.perf_counter() - started:.0f} s", flush=True)


def out_of_fold_lookups(epochs: float, lr: float) -> tuple[list[dict], list[Lookup]]:
    all_rows = load_rows()
    rows = [r for r in evaluation_rows(all_rows) if r["split"] == "tune"]
    lookups: list[Lookup | None] = [None] * len(rows)
    for fold in range(FOLDS):
        training = tune_rows(all_rows, held_out_fold=fold)
        with tempfile.TemporaryDirectory() as model_dir:
            if epochs > 0:
                fine_tune(labelled_pairs(training), epochs, lr, model_dir)
            embedder = Embedder(model_dir if epochs > 0 else None, backend="torch")
            states = TokenStateCache(embedder, capacity_mb=1 << 16)
            verifier = PairVerifier(states, TreeEnsemble.from_sklearn(train(training, states)[0]))
            for i, (row, lookup) in enumerate(
                zip(rows, run_lookups(rows, states, embedder.dim, lambda _, v=verifier: v), strict=True)
            ):
                if fold_of(row["topic"]) == fold:
                    lookups[i] = lookup
        print(f"fold {fold} done", flush=True)
    assert all(lk is not None for lk in lookups)
    return rows, [lk for lk in lookups if lk is not None]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=float, default=1.0, help="0: the shipped model, not fine-tuned")
    parser.add_argument("--lr", type=float, default=2e-5)
    args = parser.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    rows, lookups = out_of_fold_lookups(args.epochs, args.lr)
    floor, picked = pick(rows, lookups)
    served, positives, wrong, traps = totals(tally(rows, lookups, floor, picked))
    print(
        f"epochs {args.epochs:g}, lr {args.lr:g}: the rule picks cosine {floor:.2f}, verifier "
        f"{picked.question:g} / {picked.context:g}: served {served}/{positives} = {served / positives:.1%}, "
        f"false hits {wrong}/{traps}"
    )
    for question in (0.95, 0.97, 0.98, 0.985, 0.99):
        served, positives, wrong, _ = totals(tally(rows, lookups, 0.55, Thresholds(question, 0.6)))
        print(f"  at 0.55 / {question:g} / 0.6: served {served / positives:.1%}, false hits {wrong}")


if __name__ == "__main__":
    main()
