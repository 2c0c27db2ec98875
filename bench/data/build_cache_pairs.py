"""Builds bench/data/cache_pairs.jsonl, the labelled set of bench/cache_quality.py, from the seed files here.

Each seed is one question with its paraphrases, a near repeat and trap variants that need another answer
(negation, entity swap, changed number or date, changed scope); each conversation seed is a multi-turn chat
with versions that ask the same thing and versions whose earlier turns change the answer. Every text gets
an answer group: two texts share one only if one answer serves both, so a lookup can be judged with many
entries stored at once. Seeds are split by topic (a hash of the seed's first question, never by pair):
`test` is frozen and only evaluated; `tune` is the only data anything is fitted or chosen on, in two
folds, also by topic: the verifier's classifier is fitted on `fit` and the thresholds are chosen on
`calibrate` (probabilities of pairs the classifier was fitted on would be optimistic). The older
hand-written set (cache_eval.jsonl) was read while the former word lists were written, so it joins `fit`.

    .venv/bin/python -m bench.data.build_cache_pairs
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).parent
SEED_FILES = ("cache_seeds_a.jsonl", "cache_seeds_b.jsonl", "cache_seeds_c.jsonl")
CONVERSATIONS = "cache_seeds_conv.jsonl"
LEGACY = "cache_eval.jsonl"
OUT = HERE / "cache_pairs.jsonl"
TEST_SHARE = 0.5
CALIBRATE_SHARE = 0.35  # of the tuning topics
TRAP_KINDS = {
    "neg": "negation",
    "ent": "entity_swap",
    "num": "number_date",
    "date": "number_date",
    "scope": "scope",
}
LEGACY_KINDS = {
    "paraphrase": "paraphrase",
    "paraphrase_history": "conversation_same",
    "negation": "negation",
    "antonym": "negation",
    "entity": "entity_swap",
    "number": "number_date",
    "unit": "number_date",
    "date": "number_date",
    "near": "scope",
    "history": "conversation_different",
    "scope": "tenant",
}


def split_of(topic: str) -> str:
    digest = int(hashlib.sha256(topic.encode()).hexdigest()[:8], 16)
    return "test" if digest / 0xFFFFFFFF < TEST_SHARE else "tune"


def fold_of(topic: str) -> str:
    """Within `tune`: `fit` or `calibrate`; empty for `test`."""
    if split_of(topic) == "test":
        return ""
    digest = int(hashlib.sha256(("fold:" + topic).encode()).hexdigest()[:8], 16)
    return "calibrate" if digest / 0xFFFFFFFF < CALIBRATE_SHARE else "fit"


def user_turns(turns: list[str]) -> list[dict[str, str]]:
    """[u, a, u, ...] -> chat messages, the last one being the user's question."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def single_pairs(seed: dict, n: int) -> list[dict]:
    topic = f"s{n:03d}"
    base = {
        "topic": topic,
        "split": split_of(seed["q"]),
        "fold": fold_of(seed["q"]),
        "a": seed["q"],
        "a_group": topic,
    }
    rows = [{**base, "kind": "paraphrase", "b": p, "b_group": topic} for p in seed["p"]]
    rows.append({**base, "kind": "near_repeat", "b": seed["n"], "b_group": topic})
    for field, kind in TRAP_KINDS.items():
        if field in seed:
            rows.append({**base, "kind": kind, "b": seed[field], "b_group": f"{topic}:{field}"})
    return rows


def conversation_pairs(seed: dict, n: int) -> list[dict]:
    topic = f"c{n:03d}"
    a = user_turns(seed["a"])
    base = {
        "topic": topic,
        "split": split_of(seed["a"][0]),
        "fold": fold_of(seed["a"][0]),
        "a": a,
        "a_group": topic,
    }
    rows = []
    for same in seed["same"]:
        rows.append({**base, "kind": "conversation_same", "b": user_turns(same), "b_group": topic})
        # same earlier turns, the last question reworded
        rows.append(
            {
                **base,
                "kind": "conversation_same",
                "b": user_turns([*seed["a"][:-1], same[-1]]),
                "b_group": topic,
            }
        )
    for i, diff in enumerate(seed["diff"]):
        group = f"{topic}:diff{i}"
        rows.append({**base, "kind": "conversation_different", "b": user_turns(diff), "b_group": group})
        if seed["same"] and diff[:-1] != seed["a"][:-1]:
            # the other context, with the last question reworded
            rows.append(
                {
                    **base,
                    "kind": "conversation_different",
                    "b": user_turns([*diff[:-1], seed["same"][0][-1]]),
                    "b_group": group,
                }
            )
    return rows


def legacy_pairs() -> list[dict]:
    """Groups by text: a question recurs across rows, and "hit" rows join their two sides' groups."""
    raw = [json.loads(line) for line in (HERE / LEGACY).read_text().splitlines()]
    sides = []
    for r in raw:
        a = [*(r.get("a_history") or []), {"role": "user", "content": r["a"]}]
        b = [*(r.get("b_history") or []), {"role": "user", "content": r["b"]}]
        sides.append((json.dumps(a), json.dumps(b)))
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for r, (a, b) in zip(raw, sides, strict=True):
        if r["label"] == "hit":
            parent[root(a)] = root(b)
    rows = []
    for r, (a, b) in zip(raw, sides, strict=True):
        a_msgs, b_msgs = json.loads(a), json.loads(b)
        rows.append(
            {
                "topic": f"v1:{r['id']}",
                "split": "tune",
                "fold": "fit",
                "kind": LEGACY_KINDS[r["kind"]],
                "a": a_msgs if len(a_msgs) > 1 else r["a"],
                "b": b_msgs if len(b_msgs) > 1 else r["b"],
                "a_group": "v1:" + hashlib.sha256(root(a).encode()).hexdigest()[:12],
                "b_group": "v1:"
                + hashlib.sha256(root(b).encode()).hexdigest()[:12]
                + ("" if r.get("a_scope") == r.get("b_scope") else ":other-tenant"),
                "a_scope": r.get("a_scope", "tenant-a"),
                "b_scope": r.get("b_scope", "tenant-a"),
            }
        )
    return rows


def build() -> list[dict]:
    rows: list[dict] = []
    seeds = [json.loads(line) for f in SEED_FILES for line in (HERE / f).read_text().splitlines() if line]
    for n, seed in enumerate(seeds):
        rows += single_pairs(seed, n)
    convs = [json.loads(line) for line in (HERE / CONVERSATIONS).read_text().splitlines() if line]
    for n, seed in enumerate(convs):
        rows += conversation_pairs(seed, n)
    rows += legacy_pairs()
    for i, r in enumerate(rows):
        r["id"] = f"{r['topic']}-{i:04d}"
        r["should_hit"] = r["a_group"] == r["b_group"]
    return rows


def main() -> None:
    rows = build()
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} pairs -> {OUT}")


if __name__ == "__main__":
    main()
