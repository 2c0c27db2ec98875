"""Wrappers of several clauses and sentences (cache_service/phatic.py, cache_service/canonical.py): a clause
next to a dropped greeting needs no phatic word of its own when it is a sentence of its own, a list's phrase
never leaves the rest of its clause behind, and what carries the question stays."""

from __future__ import annotations

import pytest

from cache_service.canonical import canonical_keys, strip_wrappers
from cache_service.vetoes import veto

STORED = "How do I descale a kettle?"


@pytest.mark.parametrize(
    "wrapped",
    [
        "Hi, newbie here. How do I descale a kettle?",
        "Hey, it's me again. How do I descale a kettle?",
        "Hi there, long time lurker here. How do I descale a kettle?",
        "Evening all! How do I descale a kettle?",
        "Asking for a friend: how do I descale a kettle?",
        "So basically, how do I descale a kettle?",
        "Hey mate, how do I descale a kettle?",  # not "mate," left by the greeting list
        "Hey, quick one: how do I descale a kettle?",
        "How do I descale a kettle? Let me know, thanks!",
        "How do I descale a kettle? Looking forward to your reply.",
        "how do I descale a kettle Many thanks in advance!",
        "how do I descale a kettle Would really appreciate any help.",
        "How do I descale a kettle or something?",
        "How do I descale a kettle by any chance?",
        "How do I descale a kettle, in simple words?",
        "How do I descale a kettle for a beginner?",
        "Can I ask, How do I descale a kettle?",  # a question word is never an addressee
        "helloooo how do I descale a kettle",  # a letter held down
        "evening folks How do I descale a kettle?",  # an unpunctuated sentence starts at the capital
        "How do I descale a kettle? Have a lovely weekend!",  # a sentence after the question saying nothing
        "How do I descale a kettle? Best,",
        "how do I descale a kettle Any help would be greatly appreciated",  # a sentence at a capital
        "sorry if this is a dumb one but how do I descale a kettle",
        "I am writing to inquire how do I descale a kettle?",
    ],
)
def test_a_wrapped_question_has_the_stored_ones_key(wrapped: str) -> None:
    assert canonical_keys(wrapped) & canonical_keys(STORED), strip_wrappers(wrapped)
    assert veto(wrapped, STORED) == ""


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Hi! In Monopoly, do you collect rent in jail?", "In Monopoly, do you collect rent in jail"),
        ("How much does the rental cost, for a day? Thanks!", "How much does the rental cost, for a day"),
        ("Sorry if asked before, but can I freeze milk?", "if asked before, but can I freeze milk"),
        ("Hi, not sure. Can I freeze milk?", "not sure. Can I freeze milk"),  # a negator is never a wrapper's
        ("Is a kettle safe? Or not? Thanks", "Is a kettle safe? Or not"),
        # one word after "?" may be the question's own
        ("Is the pool heated? Always?", "Is the pool heated? Always"),
        ("Hi, is it a good day To sail?", "is it a good day To sail"),
    ],
)
def test_what_carries_the_question_stays(text: str, kept: str) -> None:
    assert strip_wrappers(text) == kept
