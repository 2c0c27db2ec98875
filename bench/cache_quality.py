"""Quality of the semantic cache on the labelled set bench/data/cache_eval.jsonl.

For every pair, its first question ("a") is stored as the service would store it (partitioned by model,
tenant, parameters and conversation history), then its second question ("b") is looked up with the service's
own code: exact match, cosine within the partition, the verifier. A hit on a pair labelled "hit" is correct;
any hit on a pair labelled "miss" is a false hit. Reported for a range of thresholds, with and without the
verifier, on the tuning half, the held-out half, a "fresh" set written after the verifier was frozen, and all;
the default threshold is picked on the tuning half only.

    .venv/bin/python -m bench.cache_quality [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.report import write_section
from cache_service.core import TOP_K, acceptable
from cache_service.embedder import Embedder
from cache_service.index import VectorIndex
from cache_service.keys import ParsedKey, parse_key
from cache_service.settings import CacheSettings
from services.gen import cache_pb2

DATA = Path(__file__).parent / "data" / "cache_eval.jsonl"
SPLITS = ("tune", "holdout", "fresh", "all")
THRESHOLDS = [round(0.60 + 0.025 * i, 3) for i in range(15)]
TARGET_FALSE_HIT = 0.01
TARGET_PARAPHRASE = 0.60
RECALL_SLACK = 0.02


def make_key(question: str, history: list[dict] | None, scope: str) -> ParsedKey:
    messages = [cache_pb2.Message(role=m["role"], content=m["content"]) for m in history or []]
    messages.append(cache_pb2.Message(role="user", content=question))
    return parse_key(
        cache_pb2.CacheKey(model="eval-model", scope=scope, messages=messages, params_fingerprint="p")
    )


@dataclass
class Outcome:
    hit: bool
    correct: bool  # for "hit" pairs: returned this pair's own entry


def load_rows() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def evaluate(
    rows: list[dict], vectors: dict[str, np.ndarray], threshold: float, verifier: bool
) -> list[Outcome]:
    outcomes = []
    for r in rows:
        stored = make_key(r["a"], r.get("a_history"), r.get("a_scope", "tenant-a"))
        query = make_key(r["b"], r.get("b_history"), r.get("b_scope", "tenant-a"))
        index = VectorIndex(dim=vectors[r["a"]].shape[0])
        index.add(stored.entry_id, stored.partition, stored.scope, vectors[r["a"]], stored.query)
        if query.entry_id in index:  # exact match answers first
            hit_id: str | None = query.entry_id
        else:
            cands = index.search(query.partition, vectors[r["b"]], TOP_K, threshold)
            ok = acceptable(query.query, cands, verifier)
            hit_id = ok[0].entry_id if ok else None
        outcomes.append(Outcome(hit_id is not None, hit_id == stored.entry_id))
    return outcomes


def summarize(rows: list[dict], outcomes: list[Outcome], split: str) -> dict[str, float]:
    sel = [(r, o) for r, o in zip(rows, outcomes, strict=True) if split == "all" or r["split"] == split]
    pos = [o for r, o in sel if r["label"] == "hit"]
    neg = [o for r, o in sel if r["label"] == "miss"]
    hits = [(r, o) for r, o in sel if o.hit]
    good = sum(1 for r, o in hits if r["label"] == "hit" and o.correct)
    return {
        "n_pos": len(pos),
        "n_neg": len(neg),
        "paraphrase_hit_rate": sum(o.correct for o in pos) / max(len(pos), 1),
        "false_hit_rate": sum(o.hit for o in neg) / max(len(neg), 1),
        "wrong_entry_hits": sum(1 for o in pos if o.hit and not o.correct),
        "precision": good / len(hits) if hits else 1.0,
    }


def per_split(row: dict[str, dict[str, float]], metric: str) -> str:
    return " / ".join(f"{row[s][metric]:.1%}" for s in SPLITS if s != "all")


def upper_bound(stats: dict[str, float], n: int) -> float:
    """One-sided 95% upper bound of a rate from n trials (exact for zero events: the 'rule of three')."""
    k = round(stats["false_hit_rate"] * n)
    if k == 0:
        return 1 - 0.05 ** (1 / n)
    p = k / n
    return p + 1.645 * (p * (1 - p) / n) ** 0.5


def pick_threshold(table: dict[tuple[float, bool], dict[str, dict[str, float]]]) -> float:
    """On the tuning half, with the verifier: among thresholds with false hits under target, the highest one
    whose paraphrase hit rate is within RECALL_SLACK of the best (the verifier's word lists will miss cases in
    the wild, so recall is traded for a stricter embedding match while it is cheap)."""
    ok = [t for t in THRESHOLDS if table[(t, True)]["tune"]["false_hit_rate"] < TARGET_FALSE_HIT]
    if not ok:
        return max(THRESHOLDS)
    best = max(table[(t, True)]["tune"]["paraphrase_hit_rate"] for t in ok)
    return max(t for t in ok if table[(t, True)]["tune"]["paraphrase_hit_rate"] >= best - RECALL_SLACK)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write-docs", action="store_true", help="write the section of docs/BENCHMARKS.md")
    args = parser.parse_args()
    rows = load_rows()
    started = time.perf_counter()
    embedder = Embedder()
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vectors = dict(zip(texts, embedder.encode(texts), strict=True))
    table = {
        (t, v): {s: summarize(rows, evaluate(rows, vectors, t, v), s) for s in SPLITS}
        for t in THRESHOLDS
        for v in (False, True)
    }
    chosen = pick_threshold(table)
    configured = CacheSettings().similarity_threshold
    kinds = Counter(r["kind"] for r in rows)
    t0 = THRESHOLDS[0]
    lines = [
        f"Command: `{' '.join(['.venv/bin/python -m bench.cache_quality', *sys.argv[1:]])}` "
        f"({len(rows)} labelled pairs in `bench/data/cache_eval.jsonl`: "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        + f"; model all-MiniLM-L6-v2; {time.perf_counter() - started:.0f} s).",
        "",
        "For each pair the first question is stored, then the second is looked up with the service's own "
        "code (partition, exact match, cosine, verifier). Paraphrase hit rate is hits on pairs labelled hit; "
        "false-hit rate is hits on hard negatives; precision is correct hits over all hits. Splits: *tune* "
        "and *held-out* halves of the first 365 pairs (split by question, so no question is in both; the "
        "threshold is picked on *tune* only, but the verifier's word lists were written while looking at "
        "errors on both halves), and *fresh*: 115 pairs on new topics written after the verifier was frozen "
        "and never used to change anything, the honest estimate for unseen questions. Pairs per split "
        "(paraphrases / hard negatives): "
        + ", ".join(f"{s} {table[(t0, True)][s]['n_pos']} / {table[(t0, True)][s]['n_neg']}" for s in SPLITS)
        + ".",
        "",
        "| threshold | verifier | paraphrase hit rate (tune / held-out / fresh) "
        "| false-hit rate (tune / held-out / fresh) | precision (all) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in THRESHOLDS:
        for v in (False, True):
            row = table[(t, v)]
            mark = " **(default)**" if v and abs(t - configured) < 1e-6 else ""
            lines.append(
                f"| {t:.3f}{mark} | {'on' if v else 'off'} | {per_split(row, 'paraphrase_hit_rate')} "
                f"| {per_split(row, 'false_hit_rate')} | {row['all']['precision']:.1%} |"
            )
    at_default = {v: evaluate(rows, vectors, configured, v) for v in (False, True)}
    lines += ["", f"False hits by kind at the default threshold {configured:.3f} (verifier off -> on):", ""]
    lines += [
        "| kind | pairs | false hits, verifier off | false hits, verifier on |",
        "| --- | --- | --- | --- |",
    ]
    for kind in sorted(k for k in kinds if not k.startswith("paraphrase")):
        idx = [i for i, r in enumerate(rows) if r["kind"] == kind]
        off = sum(at_default[False][i].hit for i in idx)
        on = sum(at_default[True][i].hit for i in idx)
        lines.append(f"| {kind} | {len(idx)} | {off} | {on} |")
    d = table.get((configured, True))
    if d:
        n_neg = d["all"]["n_neg"]
        lines += [
            "",
            f"At the default ({configured:.3f}, verifier on): paraphrase hit rate "
            f"{per_split(d, 'paraphrase_hit_rate')} (tune / held-out / fresh), false-hit rate "
            f"{per_split(d, 'false_hit_rate')}, precision {d['all']['precision']:.1%} (targets: false hits "
            f"< {TARGET_FALSE_HIT:.0%}, paraphrases > {TARGET_PARAPHRASE:.0%}). With {n_neg} hard negatives "
            f"in all, the 95% upper bound on the false-hit rate is {upper_bound(d['all'], n_neg):.1%}.",
        ]
    lines.append(
        f"Threshold picked on the tuning half by this script (false hits < {TARGET_FALSE_HIT:.0%}, the "
        f"highest threshold within {RECALL_SLACK:.0%} of the best paraphrase hit rate): {chosen:.3f}; "
        f"configured default (CACHE_SIMILARITY_THRESHOLD): {configured:.3f}."
    )
    report = "\n".join(lines)
    print(report)
    if os.environ.get("CACHE_QUALITY_SHOW_ERRORS"):
        for v in (False, True):
            for r, o in zip(rows, at_default[v], strict=True):
                if (r["label"] == "miss" and o.hit) or (r["label"] == "hit" and not o.correct):
                    print(f"verifier={v} {r['id']} {r['label']} hit={o.hit}: {r['a']!r} / {r['b']!r}")
    if args.write_docs:
        write_section("cache-quality", "## Semantic cache quality\n\n" + report)


if __name__ == "__main__":
    main()
