"""Typos that make another listed string, read from their place in a question otherwise word for word the
same (cache_service/typos.aligned_typo), "too" for "to", and "no" for "on" before a determiner."""

from __future__ import annotations

import pytest

from cache_service.pair_checks import negated, words
from cache_service.typos import aligned_typo
from cache_service.vetoes import veto


@pytest.mark.parametrize(
    ("x", "y", "typo"),
    [
        ("des", "does", True),  # a listed string, but ten times rarer than the word in its place
        ("wa", "way", True),
        ("win", "won", False),  # two common words: another tense, maybe
        ("cup", "cups", False),  # an inflection: one thing or several
        ("walk", "walked", False),
        ("on", "of", False),  # two function words
        ("bay", "baby", False),
        ("ol", "old", True),  # two letters and an ending: a word cut short, no inflection
        ("dsg", "dogs", True),  # a short word mistyped twice into no word in use
        ("c", "so", True),
        ("unn", "in", True),
        ("te", "time", False),  # twice mistyped into a string in use: maybe that word
        ("unset", "set", False),  # two letters added at one end: a prefix
    ],
)
def test_aligned_typos(x: str, y: str, typo: bool) -> None:
    assert aligned_typo(x, y) is typo


@pytest.mark.parametrize(
    ("stored", "retyped"),
    [
        ("How long does a gel manicure last?", "How long des a gel manicure last?"),
        ("How long should I wait to swim after a meal?", "How long should I wait too swim after a meal?"),
        ("Is a week too much for a cold to last?", "Is a week ttoo much for a cold to last?"),
        ("How far can I walk on the Moon in a day?", "How far can I walk no the Moon in a day?"),
        ("Is it safe for dogs to eat grapes?", "Is it safe for dsg to eat grapes?"),
        ("Why is the Mona Lisa so famous?", "Why is the Mona Lisa c famous?"),
    ],
)
def test_retyped_into_listed_strings_is_no_veto(stored: str, retyped: str) -> None:
    assert veto(retyped, stored) == ""


@pytest.mark.parametrize(
    ("stored", "other"),
    [
        ("How much coffee should I drink a day?", "How much coffee is too much to drink a day?"),
        ("Is there a way to undo a commit?", "Is there no way to undo a commit?"),
        ("Who won the race in Monaco?", "Who win the race in Monaco?"),  # "win" is no typo of "won"
        ("How do I set the default project?", "How do I unset the default project?"),  # a prefix, no typo
    ],
)
def test_what_only_looks_like_a_typo_still_vetoes(stored: str, other: str) -> None:
    assert veto(other, stored) != ""


@pytest.mark.parametrize(
    ("stored", "retyped"),
    [
        ("What is the 14th Amendment about?", "What is the 14ht Amendment about?"),  # letters swapped
        ("How do I print on a 3d printer?", "How do I print on a 3dd printer?"),  # one doubled
        ("What is Hume's fork?", "What is Hume'ss fork?"),  # a possessive mistyped
        ("What can I do if I'm 17?", "What can I do if I'mm 17?"),  # "I'm" is no name
        ("Why aren't my seeds growing?", "Why aren'r my seeds growing?"),  # "n't" mistyped keeps its negation
    ],
)
def test_mistyped_codes_possessives_and_contractions_are_no_veto(stored: str, retyped: str) -> None:
    assert veto(retyped, stored) == ""


def test_another_code_or_a_possessive_is_no_typo() -> None:
    assert veto("How heavy is a 10km bag?", "How heavy is a 10kg bag?") != ""  # another letter: another unit
    assert not negated(words("why are men's shoes wider")) and negated(words("why aren'r they wider"))
