"""The operations of arithmetic veto a hit (cache_service/pair_checks.py `operations`): "767 - 96" and
"767 * 96" were served one answer by the canonical tier, which drops a spaced sign as punctuation, and by the
semantic tier, where a sentence model reads them as one question. Hyphens, ranges, dates, codes and units are
no operations."""

from __future__ import annotations

import pytest

from cache_service.canonical import canonical_keys
from cache_service.pair_checks import operations
from cache_service.vetoes import veto


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("What is 767 - 96?", ["-"]),
        ("What is 767*96?", ["*"]),
        ("What is 12 ÷ 4", ["/"]),
        ("what is 2**10", ["^"]),
        ("Solve 3x - 7 = 22", ["-"]),
        ("(a + b) / 2", ["+", "/"]),
        ("twelve times four", ["*"]),
        ("three x plus seven", ["+"]),
        ("10 divided by 2", ["/"]),
        ("carry-on bag", []),
        ("COVID-19 test", []),
        ("a 2020 Ford F-150", []),
        ("2024/25", ["~/"]),  # loose: a fraction, a date, a year or a quotient
        ("range 0-9", ["~-"]),
        ("a +1.75 prescription at -5 degrees", []),
        ("sixty-five", []),
        ("take it 3 times a week", []),
        ("a plus size dress", []),
        ("I = 5V / 220R", []),
        ("CaCl2·2H2O, a 4x8 bed, 4 by 8 feet", []),
    ],
)
def test_operations_between_operands(text: str, found: list[str]) -> None:
    assert operations(text) == found


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 767 - 96?", "What is 767 * 96?"),
        ("What is 767 - 96?", "What is 767 + 96?"),
        ("What is 767 - 96?", "What is 767/96?"),  # a loose "/" is no minus
        ("What is 12 - 4?", "What is 12 ^ 4?"),
        ("What is 12 - 4?", "What is 12 4?"),
        ("Solve 3x + 7 = 22", "Solve 3x - 7 = 22"),
    ],
)
def test_another_operation_vetoes(a: str, b: str) -> None:
    assert veto(a, b) == veto(b, a) == "operations differ"


def test_the_canonical_tier_would_have_served_them() -> None:
    """Why the veto is needed there: both sides share a canonical key."""
    assert canonical_keys("What is 12 - 4?") & canonical_keys("What is 12 * 4?")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 12 times 4?", "what is 12 * 4"),
        ("What is 767-96?", "What is 767 - 96?"),
        ("how many combinations with 4 digits from 0-9", "how many combinations with 4 digits from 0 to 9"),
        ("tomato plants in a 4x8 raised bed", "tomato plants in a 4 x 8 raised bed"),
        ("Is exfoliating 3 times a week too much?", "Is exfoliating three times weekly too much?"),
    ],
)
def test_the_same_operation_or_none_does_not_veto(a: str, b: str) -> None:
    assert "operations" not in veto(a, b)
