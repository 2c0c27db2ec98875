"""Vetoes on a year named on one side only, on phrasal verbs that refuse or prevent, and on the same words
with their names or numbers swapped (cache_service/pair_checks.py, cache_service/vetoes.py)."""

from __future__ import annotations

import pytest

from cache_service.pair_checks import dates, words, years
from cache_service.pair_checks import veto as number_negation_veto
from cache_service.vetoes import veto


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Who is the mayor of Boston?", "Who was the mayor of Boston in 1995?"),  # another time
        ("What does a Eurail pass cost?", "What did a Eurail pass cost as of 2019?"),
        ("Who played the lead in that film?", "Who turned down the lead in that film?"),
        ("Why does copper turn green?", "How can I keep copper from turning green?"),
        ("Should I take the job offer?", "Should I decline the job offer?"),
        ("Can a doctor confirm lupus with one test?", "Can a doctor rule out lupus with one test?"),
        (
            "Can I run a 120Hz monitor on a cable rated for 60Hz?",
            "Can I run a 60Hz monitor on a cable rated for 120Hz?",
        ),  # swapped, with no direction word
    ],
)
def test_another_time_a_refusal_or_a_swap_vetoes(a: str, b: str) -> None:
    assert veto(b, a) != ""


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I parse a date like 2023-05-01 in pandas?", "How do I parse an ISO date in pandas?"),
        ("Is $2000 enough for a week in Rome?", "Is that enough money for a week in Rome?"),
        ("How do I keep my bread fresh?", "How can bread be kept fresh longest?"),  # "keep", no "from"
        ("Who backed out of the deal?", "Who pulled out of the deal?"),  # not every particle verb
    ],
)
def test_dates_amounts_and_plain_verbs_are_no_time_or_negation(a: str, b: str) -> None:
    assert number_negation_veto(b, a) == ""


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the population of Canada in 2024?", "canada population 2024"),  # keywords, reordered
        ("How do I get from the airport to the city?", "How do I get into the city from the airport?"),
    ],
)
def test_reordered_keywords_are_no_swap(a: str, b: str) -> None:
    assert veto(b, a) == ""


def test_a_year_is_a_lone_four_digit_year() -> None:
    assert years("What changed in 2012, and in the 1990s?") == {"2012", "1990"}
    assert years("2023-05-01, $2000, 2,000 words, 12019 and 1000 miles") == set()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Is green tea good for your teeth?", "Is green tea bad for your teeth?"),
        ("How do I stay asleep after a night shift?", "How do I stay awake after a night shift?"),
        ("When can I put basil plants outside?", "When can I start basil seeds indoors?"),
        (
            "Count the weekdays between two dates, including holidays",
            "Count the weekdays between two dates, excluding holidays",
        ),
    ],
)
def test_common_antonyms_veto(a: str, b: str) -> None:
    assert veto(b, a).startswith("opposite words")


def test_one_content_word_swapped_in_a_short_question_vetoes() -> None:
    assert veto("What is the cube root of 729?", "What is the square root of 729?") == "a detail differs"
    assert veto("Why is the sky blue in the colour photo?", "Why is the sky blue in the color photo?") == ""
    assert veto("Is it suitable for him?", "Is it appropriate for him?") == ""  # nothing else in common


def test_a_date_word_in_the_possessive_is_that_date() -> None:
    """ "today's rate" names today: the same date as "the rate today", another than "tomorrow's"."""
    assert dates(words("What's today's euro to dollar rate?")) == {"today"}
    today = "What is the exchange rate from euros to dollars today?"
    assert veto(today, "What's today's euro to dollar rate?") == ""
    monday = "What is the weather in Paris on Monday?"
    assert veto("What's today's weather in Paris?", monday) == "dates differ"
