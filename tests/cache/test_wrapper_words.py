"""Wrappers recognised by their words' classes: interjections, forms of address, a first sentence of
wrapper words alone, "... but <question>", a trailing "okay" tag. Each wrapped case failed before its rule;
the kept cases guard the question's own words."""

from __future__ import annotations

import pytest

from cache_service.canonical import canonical_keys, canonical_text

STORED = "How do I descale a kettle?"


@pytest.mark.parametrize(
    "wrapped",
    [
        "Long time lurker, first time poster. How do I descale a kettle?",
        "How do I descale a kettle lmao?",
        "Respected madam, how do I descale a kettle?",
        "Hi bro how do I descale a kettle",
        "hey quick one how do I descale a kettle",
        "might be a dumb one but how do I descale a kettle",
        "How do I descale a kettle just curious",
        "How do I descale a kettle? thats it",
        "i wanna ask how do I descale a kettle",
    ],
)
def test_wrapper_words_go(wrapped: str) -> None:
    assert canonical_keys(wrapped) & canonical_keys(STORED), canonical_text(wrapped)


def test_a_trailing_okay_tag_goes_unless_it_is_asked() -> None:
    assert canonical_text("What's the best way to descale a kettle okay?") == canonical_text(
        "What's the best way to descale a kettle?"
    )
    assert canonical_text("Is my old kettle okay").endswith("kettle okay")
    assert canonical_text("For toddlers, is whole milk okay?").endswith("milk okay")
    assert canonical_keys("For toddlers, is whole milk okay?") & canonical_keys(
        "Is whole milk okay for toddlers?"
    )


def test_a_first_sentence_with_content_stays() -> None:
    assert canonical_text("My kettle is old. How do I descale it?").startswith("my kettle is old")
    assert canonical_text("First time buyer. How do I get a mortgage?").startswith("first time buyer")
