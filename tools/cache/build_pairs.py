"""Builds tools/cache/data/cache_pairs.jsonl, the labelled set of tools/cache/evaluate.py, from the seed files
there.

Each seed is one question with its paraphrases, a near repeat and trap variants that need another answer
(negation, entity swap, changed number or date, changed scope); each conversation seed is a multi-turn chat
with versions that ask the same thing and versions whose earlier turns change the answer. Every text gets
an answer group: two texts share one only if one answer serves both, so a lookup can be judged with many
entries stored at once. Three splits, by topic (never by pair):

- `test`, frozen, only evaluated: half the topics of the first author's seeds (a hash of the seed's first
  question);
- `tune`, the only data anything is fitted or chosen on: the other half, the older hand-written set
  (cache_eval.jsonl, which the former word lists were written from) and sixteen more writers' seeds
  (cache_seeds_tune_writers*.jsonl);
- `external`, frozen, only evaluated: seeds by two further writers who saw neither this code nor any of
  the data above (cache_seeds_external*.jsonl): the nearest thing here to questions nobody here wrote;
- `fresh`, frozen, only evaluated: seeds by three more writers (2026-12-03) who saw neither the code nor
  any data (cache_seeds_fresh*.jsonl), added after the verifier's last change was decided, so no version of
  the verifier was ever chosen with their questions in view;
- `writers`, frozen, only evaluated: four out-of-style writers (a hurried customer on a phone, a non-native
  speaker, a support agent pasting tickets, a student; data/writers/NAME/, copied unchanged, each with its
  README.md), frozen before the redesigned cache (canonical tier, vetoes) was measured on them. Their rows
  carry the writer's name in `writer`;
- `tune` also holds the tune-side writers of data/writers_tune/NAME/ (2026-12-05: voice dictation, a lab
  technician's units and abbreviations, a parent's long messages, a gamer's slang, British office English),
  written to the same brief with two more near repeats per seed (`n_more`): the near repeats people make,
  in voices the older tune data lacks, to choose rules on without reading a frozen split;
- `writers2`, frozen, only evaluated: three more out-of-style writers (a retiree, a software developer, a
  shopkeeper; data/writers/NAME/ as above, their seeds, conversations and README.md copied unread; their
  generator scripts left out), frozen (2026-12-04) after the calibration rule and the near-repeat and veto
  changes of that session were decided and before anything was measured on them.

    .venv/bin/python -m tools.cache.build_pairs
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cache_service.keys import normalize_text

HERE = Path(__file__).parent / "data"
WRITERS = HERE / "writers"
WRITER_NAMES = ("phone", "nonnative", "agent", "student")
WRITERS2_NAMES = ("retiree", "dev", "shopkeeper")
WRITERS_TUNE = HERE / "writers_tune"

# (seed files, topic prefix, split: None = by topic hash)
SINGLE_SOURCES = (
    (("cache_seeds_a.jsonl", "cache_seeds_b.jsonl", "cache_seeds_c.jsonl"), "s", None),
    (("cache_seeds_tune_writers.jsonl",), "w", "tune"),
    (("cache_seeds_external.jsonl",), "x", "external"),
    (("cache_seeds_fresh.jsonl",), "f", "fresh"),
)
CONVERSATION_SOURCES = (
    (("cache_seeds_conv.jsonl",), "c", None),
    (("cache_seeds_tune_writers_conv.jsonl",), "wc", "tune"),
    (("cache_seeds_external_conv.jsonl",), "xc", "external"),
    (("cache_seeds_fresh_conv.jsonl",), "fc", "fresh"),
)
LEGACY = "cache_eval.jsonl"
# Tuning questions (q1) a reviewer judged against frozen ones (q2), listed by duplicate_candidates --frozen
FROZEN_DUPLICATES = HERE / "cache_frozen_duplicates.jsonl"
OUT = HERE / "cache_pairs.jsonl"
TEST_SHARE = 0.5
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


def read_seeds(files: tuple[str, ...]) -> list[dict]:
    return [json.loads(line) for f in files for line in (HERE / f).read_text().splitlines() if line.strip()]


def writer_rows(
    names: tuple[str, ...] = WRITER_NAMES, split: str = "writers", root: Path = WRITERS, prefix: str = "w"
) -> list[dict]:
    """The out-of-style writers' seeds and conversations, split `split`, each row marked with its writer."""
    rows: list[dict] = []
    for name in names:
        folder = root / name
        for file, make, kind in (
            ("seeds.jsonl", single_pairs, "s"),
            ("conversations.jsonl", conversation_pairs, "v"),
        ):
            if not (folder / file).exists():
                continue
            lines = [line for line in (folder / file).read_text().splitlines() if line.strip()]
            for n, line in enumerate(lines):
                rows += [
                    {**r, "writer": name}
                    for r in make(json.loads(line), f"{prefix}{kind}-{name}-{n:03d}", split)
                ]
    return rows


def user_turns(turns: list[str]) -> list[dict[str, str]]:
    """[u, a, u, ...] -> chat messages, the last one being the user's question."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def single_pairs(seed: dict, topic: str, split: str | None) -> list[dict]:
    base = {
        "topic": topic,
        "split": split or split_of(seed["q"]),
        "a": seed["q"],
        "a_group": topic,
    }
    rows = [{**base, "kind": "paraphrase", "b": p, "b_group": topic} for p in seed["p"]]
    for near in (seed["n"], *seed.get("n_more", ())):
        rows.append({**base, "kind": "near_repeat", "b": near, "b_group": topic})
    for field, kind in TRAP_KINDS.items():
        if field in seed:
            rows.append({**base, "kind": kind, "b": seed[field], "b_group": f"{topic}:{field}"})
    return rows


def conversation_pairs(seed: dict, topic: str, split: str | None) -> list[dict]:
    a = user_turns(seed["a"])
    base = {
        "topic": topic,
        "split": split or split_of(seed["a"][0]),
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


def user_texts(row: dict) -> set[str]:
    texts = set()
    for side in (row["a"], row["b"]):
        turns = [side] if isinstance(side, str) else [m["content"] for m in side if m["role"] == "user"]
        texts |= {normalize_text(t) for t in turns}
    return texts


def without_frozen_texts(rows: list[dict]) -> list[dict]:
    """The rows, less every tuning row that shares a user text with a frozen split, or holds a question a
    reviewer judged to ask the same as a frozen one (FROZEN_DUPLICATES: "Can PS5 play PS4 games?" against
    "Does the PS5 run games that were made for the PS4?"): writers reach for the same common questions
    ("When did World War II end?"), and a classifier fitted on a pair holding a test question, in any
    wording, has seen part of the test (and the frozen lookups would find it as a "wrong" neighbour)."""
    frozen = set().union(*(user_texts(r) for r in rows if r["split"] != "tune"))
    if FROZEN_DUPLICATES.exists():
        judged = [json.loads(line) for line in FROZEN_DUPLICATES.read_text().splitlines() if line.strip()]
        frozen |= {normalize_text(p["q1"]) for p in judged if p["same_answer"]}
    return [r for r in rows if r["split"] != "tune" or not user_texts(r) & frozen]


def build() -> list[dict]:
    rows: list[dict] = []
    for sources, make in ((SINGLE_SOURCES, single_pairs), (CONVERSATION_SOURCES, conversation_pairs)):
        for files, prefix, split in sources:
            for n, seed in enumerate(read_seeds(files)):
                rows += make(seed, f"{prefix}{n:03d}", split)
    rows += writer_rows()
    rows += writer_rows(WRITERS2_NAMES, "writers2")
    rows += legacy_pairs()
    # last, so that adding tune-side writers leaves every earlier row's id as it was
    tune_writers = (
        tuple(sorted(d.name for d in WRITERS_TUNE.iterdir() if d.is_dir())) if WRITERS_TUNE.exists() else ()
    )
    rows += writer_rows(tune_writers, "tune", WRITERS_TUNE, "t")
    rows = without_frozen_texts(rows)
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
