"""The verifier alone: pure functions, no model."""

from __future__ import annotations

import pytest

from cache_service.verifier import extract, stem, verify


@pytest.mark.parametrize(
    ("query", "cached"),
    [
        ("How can I enable two-factor authentication?", "How do I turn on two-factor authentication?"),
        ("What's the capital city of France?", "What is the capital of France?"),
        ("Convert 5 km to miles", "How many miles is 5 km?"),
        ("What is 25 times 4?", "What's twenty five times four?"),
        ("Who is the painter of the Mona Lisa?", "Who painted the Mona Lisa?"),
        ("how do i use docker", "How do I use Docker?"),
    ],
)
def test_same_question_passes(query: str, cached: str) -> None:
    assert verify(query, cached).ok


@pytest.mark.parametrize(
    ("query", "cached", "reason"),
    [
        ("How do I turn off 2FA?", "How do I turn on 2FA?", "opposite words"),
        ("How do I disable notifications?", "How do I enable notifications?", "opposite words"),
        ("Is it not safe to eat raw eggs?", "Is it safe to eat raw eggs?", "negation"),
        ("Why doesn't my code compile?", "Why does my code compile?", "negation"),
        ("What is the capital of Germany?", "What is the capital of France?", "named entities"),
        ("what is the capital of germany", "what is the capital of france", "named entities"),
        ("Who wrote Macbeth?", "Who wrote Hamlet?", "named entities"),
        ("What is 20% of 200?", "What is 15% of 200?", "numbers"),
        ("How many miles is ten km?", "How many miles is 5 km?", "numbers"),
        ("Convert 5 miles to km", "Convert 5 km to miles", "units"),
        ("How many km is 5 miles?", "How many miles is 5 km?", "units"),
        ("Convert Fahrenheit to Celsius", "Convert Celsius to Fahrenheit", "units"),
        ("Is 5 MB enough?", "Is 5 GB enough?", "units"),
        ("Flights from London to Paris", "Flights from Paris to London", "order reversed"),
        ("How do I reset my username?", "How do I reset my password?", "content words"),
        ("What is the weather tomorrow?", "What is the weather today?", "opposite words"),
    ],
)
def test_different_question_fails_for_the_right_reason(query: str, cached: str, reason: str) -> None:
    verdict = verify(query, cached)
    assert not verdict.ok
    assert reason in verdict.reason


def test_verdict_is_symmetric_on_opposites() -> None:
    assert not verify("How do I log in?", "How do I log out?").ok
    assert not verify("How do I log out?", "How do I log in?").ok


def test_extract_reads_numbers_units_and_roles() -> None:
    f = extract("How many miles is 1,000 km?")
    assert f.numbers == ["1000"]
    assert f.unit_roles == {"target": {"mile"}, "source": {"km"}}
    assert extract("the second and 3rd item").numbers == ["2", "3"]
    assert extract("I can't log in").negated
    assert not extract("I can't not log in").negated


def test_stem_matches_inflections() -> None:
    assert stem("exercising") == stem("exercise")
    assert stem("duplicates") == stem("duplicate")
    assert stem("painter") == stem("painted")


def test_added_words_are_tolerated_only_a_little() -> None:
    assert verify("What is the capital city of France?", "What is the capital of France?").ok
    long_add = "Write a poem about cats that rhymes, uses short lines and mentions sunshine"
    verdict = verify(long_add, "Write a poem about cats")
    assert not verdict.ok and "added" in verdict.reason
