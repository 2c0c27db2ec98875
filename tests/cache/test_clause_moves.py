"""Clauses moved to the other end of a question keep its key: the wrapper words a moved clause brings to an
end are the question's own ("invite someone", "is it okay"), and those it takes away from one are still
wrappers ("For a bakery, tell me how ..."). Each case here failed before the rule it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache_service.canonical import canonical_keys, canonical_text, clause_orders
from cache_service.vetoes import veto
from tools.cache import perturb


def same(a: str, b: str) -> bool:
    return bool(canonical_keys(a) & canonical_keys(b))


@pytest.mark.parametrize(
    ("written", "moved"),
    [
        # an indefinite pronoun after a verb is its object, not a closer like "... or something"
        ("How do I invite someone to my workspace?", "To my workspace, how do I invite someone?"),
        (
            "Can I still return something to the shop after 30 days?",
            "To the shop after 30 days, can I still return something?",
        ),
        # "OK" in capitals starts no sentence, and "okay" after a copula is what is asked
        ("How much screen time is OK for a 9 year old?", "For a 9 year old, how much screen time is OK?"),
        ("Is it okay to run every day?", "To run every day, is it okay?"),
        # "What's" asks: the leading run stops there instead of at "quick"
        (
            "What's a quick way to fall asleep when I am anxious?",
            "When I am anxious, what's a quick way to fall asleep?",
        ),
        # a leading "To <verb>" is a purpose clause
        (
            "How many words do I need to know to read a newspaper?",
            "To know to read a newspaper, how many words do I need?",
        ),
        # a wrapper at the start of a clause moved away from the front
        (
            "Tell me how to write a business plan for a bakery",
            "For a bakery, tell me how to write a business plan",
        ),
        # whom the answer is for, at either end
        ("What's the best digital piano for a beginner?", "For a beginner, what's the best digital piano?"),
        # "So that" opens a purpose clause, not a filler
        (
            "Should I file early so that my refund comes sooner?",
            "So that my refund comes sooner, should I file early?",
        ),
        # a discourse marker at either end
        (
            "Honestly, is it worth growing potatoes in bags?",
            "Is it worth growing potatoes in bags, honestly?",
        ),
        # four or five clauses: rotations
        (
            "I'm self-employed, work from home, and use my car for work, what expenses can I claim?",
            "For work, what expenses can I claim, I'm self-employed, work from home, and use my car?",
        ),
    ],
)
def test_a_moved_clause_keeps_the_key(written: str, moved: str) -> None:
    assert same(written, moved), (canonical_keys(written), canonical_keys(moved))


def test_the_object_and_the_predicate_stay_in_the_key() -> None:
    assert canonical_text("How do I invite someone?").endswith("invite someone")
    assert canonical_text("Is 5 hours of sleep OK?").endswith("sleep ok")
    assert canonical_text("What's a quick way to fall asleep?").startswith("what is a quick way")
    # an address at the end still goes
    assert same("How do I compress a folder?", "How do I compress a folder anyone?")


def test_rotations_are_whole_clauses_only() -> None:
    a = "I fly from Leeds, change in Amsterdam, then go on to Rome, what does it cost?"
    assert not same(a, "I fly from Rome, change in Amsterdam, then go on to Leeds, what does it cost?")
    assert not same(a, "I fly from Leeds, change in Rome, then go on to Amsterdam, what does it cost?")
    assert same(a, "What does it cost, I fly from Leeds, change in Amsterdam, then go on to Rome?")
    assert len(list(clause_orders(list("abcde")))) == 5  # rotations, not 120 permutations
    assert len(list(clause_orders(list("abcdefg")))) == 1  # as written beyond six


def test_clause_moves_of_questions_written_apart_keep_their_key() -> None:
    """240 questions in six voices written apart from the normalizer (data/writers/clauses_tune3/, tune-side),
    each moved by the perturbation suite's own code: nearly all keep their key (654 of 657 when written)."""
    path = Path(perturb.__file__).parent / "data" / "writers" / "clauses_tune3" / "questions.jsonl"
    questions = [json.loads(line)["q"] for line in path.read_text().splitlines() if line.strip()]
    moves = [(q, perturb.perturb(q, "clause", {}, salt=salt)) for q in questions for salt in ("", "x", "y")]
    moves = [(q, m) for q, m in moves if m is not None and m != q]
    kept = sum(same(q, m) for q, m in moves)
    assert len(moves) > 600 and kept >= 0.98 * len(moves), (kept, len(moves))


def test_the_suite_moves_a_clause_inside_the_question_sentence_only() -> None:
    rng = perturb.rng_for("clause", "", "x")
    one = "How do I open a joint account, with my partner?"
    assert perturb.move_clause(one, rng) == "With my partner, how do I open a joint account?"
    message = (
        "Hi, my son is 8 and has homework I can't remember how to do myself. Could you explain the bus stop "
        "method, using 156 divided by 6? Thanks, Claire"
    )
    moved = perturb.move_clause(message, perturb.rng_for("clause", "", message))
    assert moved == (
        "Hi, my son is 8 and has homework I can't remember how to do myself. Using 156 divided by 6, could "
        "you explain the bus stop method? Thanks, Claire"
    )
    # several sentences and none of them asked: no clause move is made up
    assert perturb.move_clause("I need a will. Tell me how, for England.", rng) is None


@pytest.mark.parametrize(
    ("written", "moved"),
    [
        (
            "Is it safe to drink coffee while pregnant? I have like 2 cups a day",
            "While pregnant, is it safe to drink coffee? I have like 2 cups a day",
        ),
        (
            "I can get a free bus pass, but I'm not sure how to apply. Could you walk me through it, step by "
            "step?",
            "I can get a free bus pass, but I'm not sure how to apply. Step by step, could you walk me "
            "through it?",
        ),
        (
            "is 16gb ram enough for gaming in 2024 or do i need 32?? mostly play warzone",
            "For gaming in 2024 or do i need 32, is 16gb ram enough?? mostly play warzone",
        ),
    ],
)
def test_a_clause_moved_inside_one_sentence_of_several_keeps_the_key(written: str, moved: str) -> None:
    assert canonical_keys(written) & canonical_keys(moved)
    assert veto(moved, written) == ""
