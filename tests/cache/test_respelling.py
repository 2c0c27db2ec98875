"""Words written another way are no difference (cache_service/respelling.py); a changed unit, number,
name or count still is."""

from __future__ import annotations

import pytest

from cache_service.respelling import respelled
from cache_service.vetoes import veto


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I book a table for 4 people at 7 pm?", "How do I book a table for 4 people at 7pm?"),
        ("My Wi-Fi keeps dropping at night", "my wifi keeps dropping at night"),
        ("Is the US economy growing?", "Is the United States economy growing?"),
        ("Is the American economy growing?", "Is the United States economy growing?"),
        ("Is the US economy growing?", "Is the American economy growing?"),
        ("Can I use my New York license in Texas?", "Can I use my NY license in Texas?"),
        ("Can I carry 10kg on Ryanair?", "Can I carry 10 kilograms on Ryanair?"),
        ("How often should I feed a 6-month-old puppy?", "How often should I feed a 6 months old puppy?"),
        ("What sleeping bag for 40°F nights?", "What sleeping bag for 40 degrees Fahrenheit nights?"),
        ("What happens in the 3rd Harry Potter book?", "What happens in the third Harry Potter book?"),
        ("Do I pay tax on an 80k salary?", "Do I pay tax on an 80,000 salary?"),
        ("OK so how do I reset my router?", "so how do I reset my router?"),
        (
            "How do I set up screen time limits for my kid's iPhone?",
            "how do I set up screen time limits for my kids iPhone",
        ),
        (
            "My garbage disposal hums but won't spin. What do I do?",
            "my garbage disposal hums but wont spin what do i do",
        ),
        ("What is 80 increased by 15%?", "what is 80 increased by 15 %"),
        ("How many combinations with 4 digits from 0 to 9?", "how many combinations with 4 digits from 0-9"),
        (
            "How do I know if my machine learning model is overfitting?",
            "how do i know if my ML model is overfitting?",
        ),
        (
            "Appetizers per person for a 1-hour cocktail hour?",
            "Appetizers per person for a one-hour cocktail hour?",
        ),
        ("What's the gravity on the Moon in m/s²?", "whats the gravity on the moon in m/s2"),
        ("How long does it take thru the mail?", "How long does it take through the mail?"),
    ],
)
def test_the_same_words_written_another_way_pass(a: str, b: str) -> None:
    assert veto(a, b) == "", veto(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Can I carry 10kg on Ryanair?", "Can I carry 10 km on Ryanair?"),  # another unit
        ("Best UK savings account", "Best US savings account"),  # "UK savings" is no acronym
        ("best uk savings account", "best us savings account"),
        ("Can I use my New York license in Texas?", "Can I use my NJ license in Texas?"),
        ("How many teaspoons are in a tablespoon?", "How many teaspoons are in 4 tablespoons?"),  # a count
        ("Is the store open on Sundays?", "Is the store open on Saturday?"),
        ("Is the UK economy growing?", "Is the United States economy growing?"),
        ("pandas drop rows where column is NaN", "pandas drop rows where any column is NaN"),  # scope
        ("Solve 3x + 7 = 22", "Solve 3x - 7 = 22"),  # a sign is no spelling
        ("How many combinations with 4 digits from 0 to 9?", "how many combinations with 4 digits from 0-8"),
        ("What is the best ML course?", "What is the best UK course?"),
    ],
)
def test_a_changed_unit_name_count_or_scope_is_still_refused(a: str, b: str) -> None:
    assert veto(a, b) != ""


def test_respelled_names_the_words_on_both_sides() -> None:
    assert respelled("a 6-month-old puppy", "a 6 months old puppy") >= {"6-month-old", "6", "months", "old"}
    assert "us" in respelled("the US economy", "the United States economy")
    assert respelled("a tablespoon", "4 tablespoons") == set()


def test_any_after_a_negator_adds_no_scope() -> None:
    assert (
        veto(
            "How do I unclog a bathroom sink without using chemicals?",
            "How do I unclog a bathroom sink without using any chemicals?",
        )
        == ""
    )
