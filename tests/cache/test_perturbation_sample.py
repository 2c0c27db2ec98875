"""A fixed sample of the perturbation suite (tests/cache/data/perturbation_sample.jsonl, written once by
`python -m tools.cache.perturb --write-sample` from the frozen questions): the canonical tier, which needs
no embedding model, against retyped copies and perturbed traps. The full suite, with the semantic tier,
runs in the benchmark (tools/cache/evaluate.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from cache_service.canonical import canonical_keys, near_typo
from cache_service.vetoes import veto

SAMPLE = Path(__file__).parent / "data" / "perturbation_sample.jsonl"
# Share of each kind's retyped copies matched without the embedding model: a canonical key in common, or
# (typos) a near typo, which the semantic tier accepts from a low cosine; the semantic tier serves the rest
# (measured in the benchmark). Set a little under what this sample gave when it was written, so a
# regression of the normalizer shows here. Case variants of a text with names are left to the uncased
# embedding (identical vectors), wrappers outside the normalizer's own list to the semantic tier.
MATCHED_AT_LEAST = {
    "case": 0.9,
    "punctuation": 1.0,
    "clause": 0.9,
    "typo1": 0.85,
    "typo2": 0.9,
    "wrapper": 0.4,
}


def rows() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]


def matched(r: dict) -> bool:
    """A canonical hit, or a near typo, that passes the vetoes."""
    same = bool(canonical_keys(r["a"]) & canonical_keys(r["b"])) or near_typo(r["b"], r["a"])
    return same and not veto(r["b"], r["a"])


def test_the_sample_covers_every_kind_both_ways() -> None:
    kinds = Counter((r["kind"], r["should_hit"]) for r in rows())
    for kind in ("typo1", "typo2", "wrapper", "clause", "case", "punctuation"):
        assert kinds[(kind, True)] >= 5 and kinds[(kind, False)] >= 5, kind


@pytest.mark.parametrize("kind", sorted(MATCHED_AT_LEAST))
def test_retyped_copies_match_without_the_model(kind: str) -> None:
    copies = [r for r in rows() if r["kind"] == kind and r["should_hit"]]
    found = [r for r in copies if matched(r)]
    assert len(found) >= MATCHED_AT_LEAST[kind] * len(copies), [
        (r["a"], r["b"]) for r in copies if r not in found
    ]


def test_perturbed_traps_never_match() -> None:
    wrong = [(r["a"], r["b"]) for r in rows() if not r["should_hit"] and matched(r)]
    assert wrong == []
