"""Quality of the semantic cache on bench/data/cache_pairs.jsonl, with every stored question in one index.

The first side ("a") of every labelled pair, single question or conversation, is stored at once (about 700
entries: a wrong neighbour can win), then each second side ("b") is looked up with the service's own code:
partition and exact match (cache_service/keys.py), the index's cosine search, the verifier (cheap checks,
then the classifier, conversation turn by turn). Every text has an answer group: a hit is right when the
entry's group is the looked-up one's. "Served" counts right hits on pairs that should hit; a "false hit" is
any hit on an entry of another group (a trap answered, or a wrong neighbour).

Two thresholds are chosen on the tuning split only, by cross-validation: the verifier's classifier is fitted
again once per fold of the tuning topics (cache_service/verifier_training.py, the same recipe as the shipped
one) and every tuning pair is judged by the classifier that did not see its topic. The cosine floor and the
verifier's probability are the pair that serves most with false hits at most 1% of every kind of trap.
The `test` split (other topics) is judged by the shipped classifier, fitted on the whole tuning split, at the
configured defaults, once: it is the headline. The `external` and `fresh` splits (questions by writers who
saw neither the code nor the other data; the fresh ones written after the verifier's last change was
decided) are judged the same way, and all three pooled. Rates come with Wilson 95% intervals.

    .venv/bin/python -m bench.cache_quality [--write-docs] [--tune-only] [--embedding-model all-mpnet-base-v2]

Every text is run through the model once (its states kept in memory for the folds and the lookups).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.report import model_section, publish
from cache_service.core import TOP_K
from cache_service.embedder import EMBEDDING_BACKENDS, EMBEDDING_DTYPES, Embedder
from cache_service.embedding_models import DEFAULT_EMBEDDING_MODEL, EMBEDDING_MODELS
from cache_service.index import VectorIndex
from cache_service.keys import Conversation, ParsedKey, normalize_text, parse_key
from cache_service.settings import CacheSettings
from cache_service.token_states import TokenStateCache
from cache_service.tree_ensemble import TreeEnsemble
from cache_service.verifier import PairVerifier, Thresholds, classifier_for
from cache_service.verifier_training import FOLDS, fold_of, load_rows, train, tune_rows
from common.gen import cache_pb2

DATA = Path(__file__).parent / "data" / "cache_pairs.jsonl"
# Tuning-split questions from different seeds within cosine 0.75 of each other, each pair judged by a
# reviewer who saw only the two questions: one answer for both, or not (docs/SEMANTIC_CACHE.md).
DUPLICATES = Path(__file__).parent / "data" / "cache_tune_duplicates.jsonl"
FLOORS = [round(0.50 + 0.05 * i, 2) for i in range(9)]
VERIFIER_THRESHOLDS = [
    0.5,
    0.6,
    0.7,
    0.8,
    0.85,
    0.9,
    0.93,
    0.95,
    0.96,
    0.965,
    0.97,
    0.975,
    0.98,
    0.985,
    0.99,
    0.995,
]
TARGET_FALSE_HIT = 0.01
LEGACY_TOPIC = "v1:"
HIT_KINDS = ("paraphrase", "near_repeat", "conversation_same")
EXTERNAL = "other writers (frozen)"
FRESH = "fresh writers (frozen)"
FROZEN_SPLITS = (("test (frozen, headline)", "test"), (EXTERNAL, "external"), (FRESH, "fresh"))
TUNE = "tune, out of fold (thresholds chosen here)"


def evaluation_rows(rows: list[dict]) -> list[dict]:
    """The rows the figures are measured on, with one answer group per question.

    The older hand-written pairs (topics "v1:", bench/data/build_cache_pairs.py) were grouped pair by pair, so
    one question carries several group ids there ("How can I change my email address?" and "How do I change
    my email address?" in two groups) and a right answer from one of them would count as a wrong neighbour:
    they are training data only, neither stored nor looked up here. And a question written identically in
    two rows (after the verifier's own normalization) is one answer group: the groups it carries are joined.
    In the tuning split only, so are two writers' groups that a reviewer judged to share one answer
    (DUPLICATES: "Is it safe for dogs to eat grapes?" and "Are grapes safe for dogs to eat?" from two
    seeds); the frozen splits keep their groups as written.
    """
    kept = [dict(r) for r in rows if not r["topic"].startswith(LEGACY_TOPIC)]
    parent: dict[str, str] = {}

    def root(group: str) -> str:
        while parent.setdefault(group, group) != group:
            group = parent[group]
        return group

    first_group: dict[str, str] = {}
    for r in kept:
        for side in ("a", "b"):
            turns = make_key(r[side], "any").conversation.turns
            text = "\0".join(normalize_text(t) for _, t in turns)
            group = r[f"{side}_group"]
            if text in first_group:
                parent[root(group)] = root(first_group[text])
            first_group.setdefault(text, group)
    tune_groups = {
        normalize_text(r[side]): r[f"{side}_group"]
        for r in kept
        if r["split"] == "tune"
        for side in ("a", "b")
        if isinstance(r[side], str)
    }
    for pair in load_rows(DUPLICATES):
        a, b = tune_groups.get(normalize_text(pair["q1"])), tune_groups.get(normalize_text(pair["q2"]))
        if pair["same_answer"] and a is not None and b is not None:
            parent[root(a)] = root(b)
    for r in kept:
        r["a_group"], r["b_group"] = root(r["a_group"]), root(r["b_group"])
    return kept


def make_key(side: str | list[dict[str, str]], scope: str) -> ParsedKey:
    messages = [{"role": "user", "content": side}] if isinstance(side, str) else side
    return parse_key(
        cache_pb2.CacheKey(
            model="eval-model",
            scope=scope,
            messages=[cache_pb2.Message(role=m["role"], content=m["content"]) for m in messages],
            params_fingerprint="p",
        )
    )


@dataclass
class Lookup:
    """What one lookup can return at any pair of thresholds: an exact entry's group, or its candidates."""

    exact_group: str | None
    # (cosine, verifier's probability on the question, on the least likely earlier turn, group), best first
    candidates: list[tuple[float, float, float, str]]

    def hit_group(self, floor: float, thresholds: Thresholds | None) -> str | None:
        if self.exact_group is not None:
            return self.exact_group
        for cosine, question, context, group in self.candidates:
            if cosine >= floor and (
                thresholds is None or (question >= thresholds.question and context >= thresholds.context)
            ):
                return group
        return None


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / max(n, 1):.1%} [{lo:.1%}, {hi:.1%}]"


def run_lookups(
    rows: list[dict],
    encoder: TokenStateCache,
    dim: int,
    verifier_for: Callable[[dict], PairVerifier],
    stored_rows: list[dict] | None = None,
) -> list[Lookup]:
    """Every row's lookup against an index of the first sides of stored_rows (default: rows); its candidates
    judged by verifier_for(row)."""
    stored = {}
    for r in rows if stored_rows is None else stored_rows:
        key = make_key(r["a"], r.get("a_scope", "tenant-a"))
        stored.setdefault(key.entry_id, (key, r["a_group"]))
    queries = [make_key(r["b"], r.get("b_scope", "tenant-a")) for r in rows]
    texts = sorted({k.query for k, _ in stored.values()} | {k.query for k in queries})
    vectors = {}
    for start in range(0, len(texts), 64):
        chunk = texts[start : start + 64]
        vectors.update(zip(chunk, encoder.encode(chunk), strict=True))
    index = VectorIndex(dim=dim)
    groups = {}
    for entry_id, (key, group) in stored.items():
        index.add(entry_id, key.partition, key.scope, vectors[key.query], key.stored_text)
        groups[entry_id] = group
    lookups = []
    for r, q in zip(rows, queries, strict=True):
        if q.entry_id in groups:
            lookups.append(Lookup(groups[q.entry_id], []))
            continue
        cands = index.search(q.partition, vectors[q.query], TOP_K, min(FLOORS))
        verdicts = verifier_for(r).judge(
            q.conversation, [Conversation.decode(c.query) for c in cands], Thresholds(0.0, 0.0)
        )
        lookups.append(
            Lookup(
                None,
                [
                    (c.similarity, v.question_probability, v.context_probability, groups[c.entry_id])
                    for c, v in zip(cands, verdicts, strict=True)
                ],
            )
        )
    return lookups


def tally(
    rows: list[dict], lookups: list[Lookup], floor: float, thresholds: Thresholds | None
) -> dict[str, list[int]]:
    """Per kind: [hits that count (served for hit kinds, false hits for traps), pairs]."""
    out: dict[str, list[int]] = {}
    for r, lk in zip(rows, lookups, strict=True):
        got = lk.hit_group(floor, thresholds)
        counts = out.setdefault(r["kind"], [0, 0])
        counts[1] += 1
        if r["should_hit"]:
            counts[0] += got == r["b_group"]
            out.setdefault("wrong_neighbour", [0, 0])[0] += got is not None and got != r["b_group"]
        else:
            counts[0] += got is not None and got != r["b_group"]
    return out


def totals(t: dict[str, list[int]]) -> tuple[int, int, int, int]:
    served = sum(v[0] for k, v in t.items() if k in HIT_KINDS)
    positives = sum(v[1] for k, v in t.items() if k in HIT_KINDS)
    wrong = sum(v[0] for k, v in t.items() if k not in HIT_KINDS)  # traps answered + wrong neighbours
    traps = sum(v[1] for k, v in t.items() if k not in HIT_KINDS and k != "wrong_neighbour")
    return served, positives, wrong, traps


def excess_false_hits(t: dict[str, list[int]]) -> int:
    """False hits above TARGET_FALSE_HIT of each kind of trap (wrong neighbours: of the should-hit pairs)."""
    positives = sum(v[1] for k, v in t.items() if k in HIT_KINDS)
    excess = 0
    for kind, (wrong, n) in t.items():
        if kind in HIT_KINDS:
            continue
        allowed = TARGET_FALSE_HIT * (positives if kind == "wrong_neighbour" else n)
        excess += max(0, wrong - math.floor(allowed))
    return excess


def pick(rows: list[dict], lookups: list[Lookup]) -> tuple[float, Thresholds]:
    """The thresholds (cosine floor, verifier on the question and on earlier turns) with false hits within
    TARGET_FALSE_HIT of every kind (or, if none, the fewest beyond it) serving the most should-hit pairs;
    ties go to the stricter."""
    best: tuple[int, int, float, float, float] | None = None
    for floor in FLOORS:
        for question in VERIFIER_THRESHOLDS:
            for context in VERIFIER_THRESHOLDS:
                t = tally(rows, lookups, floor, Thresholds(question, context))
                key = (-excess_false_hits(t), totals(t)[0], question, context, floor)
                if best is None or key >= best:
                    best = key
    assert best is not None
    return best[4], Thresholds(best[2], best[3])


def trade_off_row(
    label: str,
    rows: list[dict],
    lookups: list[Lookup],
    grid: tuple[tuple[float, ...], ...],
    budgets: list[int] | tuple[int, ...],
) -> str:
    """A study's table row: the rule's pick and what it serves, then the strict end of the trade-off, the
    most should-hit pairs served with at most k false hits over `grid` (floors, question and context
    thresholds)."""
    floor, picked = pick(rows, lookups)
    served, positives, wrong, _ = totals(tally(rows, lookups, floor, picked))
    best = dict.fromkeys(budgets, 0)
    for f, q, c in itertools.product(*grid):
        s, _, w, _ = totals(tally(rows, lookups, f, Thresholds(q, c)))
        for k in budgets:
            if w <= k:
                best[k] = max(best[k], s)
    curve = ", ".join(f"<= {k}: {best[k]}" for k in budgets)
    return (
        f"| {label} | {floor:.2f} / {picked.question:g} / {picked.context:g} | "
        f"{served}/{positives} = {served / positives:.1%} / {wrong} | {curve} |"
    )


def describe(thresholds: Thresholds) -> str:
    return f"verifier {thresholds.question:g} on the question, {thresholds.context:g} on earlier turns"


def kind_table(
    parts: dict[str, tuple[list[dict], list[Lookup]]], floor: float, thresholds: Thresholds
) -> list[str]:
    names = list(parts)
    lines = ["| kind | should hit? | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
    tallies = {n: tally(*parts[n], floor, thresholds) for n in names}
    kinds = sorted(
        {k for t in tallies.values() for k in t if k != "wrong_neighbour"},
        key=lambda k: (k not in HIT_KINDS, k),
    )
    for kind in kinds:
        cells = [rate(*tallies[n].get(kind, [0, 0])) for n in names]
        lines.append(f"| {kind} | {'yes' if kind in HIT_KINDS else 'no'} | " + " | ".join(cells) + " |")
    served_cells, false_cells, wrong_cells = [], [], []
    for n in names:
        served, positives, wrong, traps = totals(tallies[n])
        served_cells.append(rate(served, positives))
        false_cells.append(rate(wrong, traps))
        wrong_cells.append(str(tallies[n].get("wrong_neighbour", [0, 0])[0]))
    lines.append("| **should hit, served** | yes | " + " | ".join(served_cells) + " |")
    lines.append(
        "| **false hits (traps answered + wrong neighbours) / traps** | no | "
        + " | ".join(false_cells)
        + " |"
    )
    lines.append("| of which a should-hit pair got another entry | | " + " | ".join(wrong_cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write-docs", action="store_true", help="write the section of docs/BENCHMARKS.md")
    parser.add_argument(
        "--tune-only", action="store_true", help="pick the thresholds and print tuning figures, no test split"
    )
    parser.add_argument(
        "--embedding-model",
        default=DEFAULT_EMBEDDING_MODEL,
        choices=sorted(EMBEDDING_MODELS),
        help="as CACHE_EMBEDDING_MODEL: its own verifier and default thresholds",
    )
    parser.add_argument(
        "--embedding-dtype",
        default=CacheSettings().embedding_dtype,
        choices=EMBEDDING_DTYPES,
        help="the embedder's weights, as CACHE_EMBEDDING_DTYPE (default: the service's)",
    )
    parser.add_argument(
        "--embedding-backend",
        default=CacheSettings().embedding_backend,
        choices=EMBEDDING_BACKENDS,
        help="who runs the embedder, as CACHE_EMBEDDING_BACKEND (default: the service's)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    all_rows = load_rows(DATA)
    rows = evaluation_rows(all_rows)
    model = EMBEDDING_MODELS[args.embedding_model]
    embedder = Embedder(dtype=args.embedding_dtype, model=model.name, backend=args.embedding_backend)
    states = TokenStateCache(embedder, capacity_mb=1 << 16)  # every text once, for every fold and lookup
    # The tuning split judged out of fold: one pair of models per fold, trained without that fold's topics.
    by_fold = {}
    for fold in range(FOLDS):
        classifier, _ = train(tune_rows(all_rows, held_out_fold=fold), states)
        by_fold[fold] = PairVerifier(states, TreeEnsemble.from_sklearn(classifier))
    # The tuning split is looked up in an index of its own entries: the frozen splits' entries (and their
    # answer groups) must not weigh on the thresholds. The frozen splits are looked up among every split's
    # entries, the tuning split's included, so a wrong neighbour from anywhere can win.
    parts: dict[str, tuple[list[dict], list[Lookup]]] = {}  # in the order of the docs' table
    if not args.tune_only:  # the shipped classifier is not loaded otherwise: it may be refitted after this
        shipped = PairVerifier(states, classifier_for(model.name))
        for name, split in FROZEN_SPLITS:
            frozen = [r for r in rows if r["split"] == split]
            lookups = run_lookups(frozen, states, embedder.dim, lambda _: shipped, stored_rows=rows)
            parts[name] = (frozen, lookups)
    tune = [r for r in rows if r["split"] == "tune"]
    parts[TUNE] = (tune, run_lookups(tune, states, embedder.dim, lambda r: by_fold[fold_of(r["topic"])]))
    floor, picked = pick(*parts[TUNE])
    if args.tune_only:
        print(f"picked on the tuning split, out of fold: cosine floor {floor:.2f}, {describe(picked)}")
        print("\n".join(kind_table(parts, floor, picked)))
        return
    settings = CacheSettings(embedding_model=model.name)
    d_floor, d_p = settings.similarity_threshold, settings.verifier_thresholds()
    test_rows, test_lookups = parts["test (frozen, headline)"]
    served, positives, wrong, traps = totals(tally(test_rows, test_lookups, d_floor, d_p))
    x_served, x_positives, x_wrong, x_traps = totals(tally(*parts[EXTERNAL], d_floor, d_p))
    f_served, f_positives, f_wrong, f_traps = totals(tally(*parts[FRESH], d_floor, d_p))
    pooled = [totals(tally(*parts[name], d_floor, d_p)) for name, _ in FROZEN_SPLITS]
    p_served, p_positives, p_wrong, p_traps = (sum(column) for column in zip(*pooled, strict=True))
    kinds = Counter(r["kind"] for r in rows)
    lines = [
        f"Command: `{' '.join(['.venv/bin/python -m bench.cache_quality', *sys.argv[1:]])}` ({len(rows)} "
        f"labelled pairs of `bench/data/cache_pairs.jsonl` evaluated (the {len(all_rows) - len(rows)} older "
        "pairs are training data only): "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        + f"; {len(set(r['a_group'] for r in rows))} answer groups stored in one index; embedder "
        f"{embedder.dtype} on {embedder.backend}; {time.perf_counter() - started:.0f} s).",
        "",
        f"**Headline, frozen test split, defaults (cosine floor {d_floor:.2f}, {describe(d_p)})**: "
        f"should-hit pairs served {rate(served, positives)}; false hits {rate(wrong, traps)} of traps "
        "(95% Wilson intervals).",
        "",
        f"**Other writers' questions (frozen, {len(parts[EXTERNAL][0])} pairs by two writers who saw neither "
        f"the code nor the data above)**: served {rate(x_served, x_positives)}; false hits "
        f"{rate(x_wrong, x_traps)} of traps.",
        "",
        f"**Fresh writers' questions (frozen, {len(parts[FRESH][0])} pairs by three writers who saw neither "
        "the code nor any data, written after this verifier was decided)**: served "
        f"{rate(f_served, f_positives)}; false hits {rate(f_wrong, f_traps)} of traps.",
        "",
        f"**All three frozen splits pooled** (every frozen pair, {p_positives + p_traps} in all): served "
        f"{rate(p_served, p_positives)}; false hits {rate(p_wrong, p_traps)} of traps.",
        "",
        f"Thresholds picked by this script on the tuning split only, judged out of fold ({FOLDS} folds by "
        f"topic; false hits <= {TARGET_FALSE_HIT:.0%} of every kind of trap, then most pairs served): "
        f"cosine floor {floor:.2f}, {describe(picked)}; configured defaults (CACHE_SIMILARITY_THRESHOLD, "
        f"CACHE_VERIFIER_THRESHOLD, CACHE_CONTEXT_VERIFIER_THRESHOLD): {d_floor:.2f}, {d_p.question:g}, "
        f"{d_p.context:g}.",
        "",
        "By kind at the defaults (served for should-hit kinds, false hits for traps):",
        "",
        *kind_table(parts, d_floor, d_p),
        "",
        "Without the verifier (cosine alone, the same index), test split:",
        "",
        "| cosine floor | served | false hits / traps |",
        "| --- | --- | --- |",
    ]
    for f in (0.80, 0.85, 0.90, 0.95):
        s, p, w, t = totals(tally(test_rows, test_lookups, f, None))
        lines.append(f"| {f:.2f} | {rate(s, p)} | {rate(w, t)} |")
    section, title = model_section("cache-quality", "Semantic cache quality", model.name)
    publish(section, [title, "", *lines], args.write_docs)


if __name__ == "__main__":
    main()
