"""Lists question pairs from different answer groups a reviewer should judge: do they share one answer?

Writers reach for the same questions in different seeds ("How many hours of sleep does a 14 year old
need?" in one, a trap "... a fourteen year old ..." in another), and the evaluation would count the right
answer from the other seed as a false hit. The candidates are found by the sentence model's cosine alone
(no veto, nothing fitted): for every two answer groups from different topics, their closest two single
questions, when at or above MIN_COSINE. Pairs already judged are left out. The output (JSON Lines, "q1" /
"q2", shuffled so a reviewer sees no order) goes to a reviewer who reads only the pairs; the answers are
appended as {"q1", "q2", "same_answer"}:

    .venv/bin/python -m tools.cache.duplicate_candidates > /tmp/pairs.jsonl   # -> cache_tune_duplicates.jsonl

Tuning questions against tuning questions by default: a judged pair joins the two groups in the tuning
split's evaluation (evaluate.load_evaluation_rows), and frozen splits are never read. With --frozen, tuning
questions (q1) against the frozen splits' (q2), for cache_frozen_duplicates.jsonl: a tuning question that
asks what a frozen one asks is leakage, and the build drops the tuning pairs that hold it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import numpy as np

from tools.cache.build_pairs import FROZEN_DUPLICATES
from tools.cache.evaluate import DUPLICATES, Vectors, load_evaluation_rows, load_rows

MIN_COSINE = 0.75


def single_questions(rows: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """text -> its answer group, text -> its topic, for the single-question sides of the rows."""
    group_of: dict[str, str] = {}
    topic_of: dict[str, str] = {}
    for r in rows:
        for side in ("a", "b"):
            if isinstance(r[side], str):
                group_of.setdefault(r[side], r[f"{side}_group"])
                topic_of.setdefault(r[side], r["topic"])
    return group_of, topic_of


def candidates(left: list[str], right: list[str], group_of: dict[str, str], topic_of: dict[str, str]):
    """Per pair of answer groups (one text from `left`, one from `right`, other topics), its closest texts."""
    vectors = Vectors("all-minilm-l6-v2")
    vectors.ensure(set(left) | set(right))
    sims = np.stack([vectors[t] for t in left]) @ np.stack([vectors[t] for t in right]).T
    best: dict[frozenset[str], tuple[float, str, str]] = {}
    for i, j in zip(*np.nonzero(sims >= MIN_COSINE), strict=True):
        a, b = left[i], right[j]
        if a == b or group_of[a] == group_of[b] or topic_of[a] == topic_of[b]:
            continue
        groups = frozenset((group_of[a], group_of[b]))
        if groups not in best or sims[i, j] > best[groups][0]:
            best[groups] = (float(sims[i, j]), a, b)
    return [(a, b) for _, a, b in best.values()]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--frozen", action="store_true", help="tuning questions against the frozen splits'")
    args = parser.parse_args()
    rows = load_evaluation_rows()
    group_of, topic_of = single_questions(rows)
    tune = sorted(single_questions([r for r in rows if r["split"] == "tune"])[0])
    if args.frozen:
        right = sorted(single_questions([r for r in rows if r["split"] != "tune"])[0])
        done_file = FROZEN_DUPLICATES
    else:
        right, done_file = tune, DUPLICATES
    judged = {frozenset((p["q1"], p["q2"])) for p in load_rows(done_file)} if done_file.exists() else set()
    pairs = [p for p in candidates(tune, right, group_of, topic_of) if frozenset(p) not in judged]
    random.Random(0).shuffle(pairs)
    for a, b in pairs:
        sys.stdout.write(json.dumps({"q1": a, "q2": b}) + "\n")


if __name__ == "__main__":
    main()
