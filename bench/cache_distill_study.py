"""Study, tuning split only: does MiniLM taught to reproduce mpnet's similarities make a better verifier?

The opt-in all-mpnet-base-v2 serves ~10 points more of the tuning split's should-hit pairs than the default
all-MiniLM-L6-v2 at the same false hits, but its forward pass is ~4x slower than the latency target allows.
This trains a copy of MiniLM (all weights, a few epochs on the CPU) so that its cosine between two texts
matches mpnet's, on the tuning split's texts only: every turn pair the verifier is asked about and as many
random pairs of tuning texts (so the rest of the space keeps its shape). No label is used: the teacher's
cosine is the target. The student is written as a sentence-transformers directory; evaluate it with

    .venv/bin/python -m bench.cache_distill_study --out /tmp/minilm-distilled
    .venv/bin/python -m bench.cache_features_study --variants base --model-dir /tmp/minilm-distilled

(the held-out folds' texts were seen by the student, without their labels: a shipped student would be
taught on the tuning texts and judged on frozen ones it never saw). `--held-out-fold K` teaches on the other
folds' texts only; `cache_features_study --fold K` then judges fold K alone, which the student never saw.
Nothing is shipped from it.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np

from bench.cache_quality import evaluation_rows
from cache_service.embedding_models import MINILM, MPNET, embedding_model
from cache_service.pair_checks import expand_contractions
from cache_service.verifier_training import labelled_pairs, load_rows, tune_rows


def mean_pool(states, mask):  # noqa: ANN001, ANN201
    mask = mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--held-out-fold", type=int, default=None, help="teach on the other folds' texts only (a clean check)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    torch.set_num_threads(2)
    all_rows = load_rows()
    rows = [r for r in evaluation_rows(all_rows) if r["split"] == "tune"]
    assert all(r["split"] == "tune" for r in rows)
    pairs = [(a, b) for a, b, _ in labelled_pairs(tune_rows(all_rows, held_out_fold=args.held_out_fold))]
    texts = sorted({t for p in pairs for t in p})
    rng = random.Random(0)
    pairs += [(rng.choice(texts), rng.choice(texts)) for _ in range(len(pairs))]
    started = time.perf_counter()
    teacher = SentenceTransformer(embedding_model(MPNET).default_directory(), device="cpu")
    vectors = teacher.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    index = {t: i for i, t in enumerate(texts)}
    targets = np.array([float(vectors[index[a]] @ vectors[index[b]]) for a, b in pairs], dtype=np.float32)
    del teacher
    print(
        f"teacher: {len(texts)} texts, {len(pairs)} pairs, {time.perf_counter() - started:.0f} s", flush=True
    )

    student = SentenceTransformer(embedding_model(MINILM).default_directory(), device="cpu")
    tokenizer, encoder = student.tokenizer, student[0].auto_model
    encoder.train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=args.lr, weight_decay=0.01)
    order = list(range(len(pairs)))

    def embed(batch: list[str]):  # noqa: ANN202
        tokens = tokenizer(batch, padding=True, truncation=True, max_length=128, return_tensors="pt")
        out = encoder(**tokens).last_hidden_state
        return torch.nn.functional.normalize(mean_pool(out, tokens["attention_mask"]), dim=-1)

    for epoch in range(args.epochs):
        rng.shuffle(order)
        total, steps = 0.0, 0
        for start in range(0, len(order), args.batch):
            chunk = order[start : start + args.batch]
            a = embed([pairs[i][0] for i in chunk])
            b = embed([pairs[i][1] for i in chunk])
            loss = torch.nn.functional.mse_loss((a * b).sum(-1), torch.from_numpy(targets[chunk]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + float(loss.detach()), steps + 1
        print(
            f"epoch {epoch + 1}: mean loss {total / steps:.5f}, {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    encoder.eval()
    student.save(args.out)
    # the tuning texts as the verifier reads them are what the student must place like mpnet does
    probe = [expand_contractions(t) for t in texts[:200]]
    got = student.encode(probe, normalize_embeddings=True)
    print(f"saved {args.out}; probe mean norm {np.linalg.norm(got, axis=1).mean():.3f}")


if __name__ == "__main__":
    main()
