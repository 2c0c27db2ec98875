"""The verifier's lexical features: which content words of one question the other does not account for, by
WordNet's meanings (cache_service/related_words.py), and the table built from WordNet."""

from __future__ import annotations

import gzip

import pytest

from cache_service.pair_checks import words
from cache_service.related_words import (
    LINKS,
    RELATED_FILE,
    _table,
    linked_meanings,
    related_features,
    word_meanings,
)


def features(a: str, b: str) -> tuple[float, float, float]:
    return related_features(words(a), words(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # a shared meaning (synonyms), an inflection WordNet lists as irregular, a derived word
        ("Where can I buy train tickets to Paris?", "Where can I purchase train tickets to Paris?"),
        ("My phone gets wet, what do I do?", "My phone got wet, what do I do?"),
        ("How do I fix a leaking tap?", "How do I repair a leaking tap?"),
        ("How do I install a ceiling fan?", "Ceiling fan installation, how?"),
        ("How do I remove rust from a bike chain?", "Rust removal from a bike chain"),
    ],
)
def test_reworded_words_are_related(a: str, b: str) -> None:
    unrelated_min, unrelated_max, _ = features(a, b)
    assert unrelated_min == unrelated_max == 0.0


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("Who wrote Macbeth?", "Who wrote Hamlet?"),
        ("How do I treat a bee sting?", "How do I treat a jellyfish sting?"),
    ],
)
def test_a_swapped_word_is_unrelated_on_both_sides(a: str, b: str) -> None:
    assert features(a, b)[:2] == (1.0, 1.0)


def test_function_words_and_numbers_are_left_to_other_checks() -> None:
    # "do" / "can" swap freely; "4" / "four" is the numbers check's business.
    assert features("How do I reset my password?", "How can I reset my password?") == (0.0, 0.0, 0.0)
    assert features("A table for 4 people", "A table for four people") == (0.0, 0.0, 0.0)
    # Words both sides share are not counted at all; an added word counts on its side only.
    assert features("How do I boil eggs?", "How do I boil duck eggs?") == (0.0, 1.0, 0.0)


def test_the_table_is_wordnet_and_holds_only_the_links_followed() -> None:
    words_, _, inflections = _table()
    assert len(words_) > 50_000  # every single word of WordNet 3.0, not a hand-picked list
    assert word_meanings("buy") & word_meanings("purchase")
    assert not word_meanings("france") & word_meanings("germany")
    assert inflections["bought"] == "buy"
    symbols = {
        line[0]
        for line in gzip.decompress(RELATED_FILE.read_bytes()).decode().splitlines()
        if line and not line[0].isalpha() and line[0] not in "#="
    }
    assert symbols == set(LINKS)
    # "recommend" and "recommendation" share no meaning; derivation links them.
    recommend, recommendation = word_meanings("recommend"), word_meanings("recommendation")
    assert not recommend & recommendation
    assert any(linked_meanings(m) & recommendation for m in recommend)
