"""Three readings of what a question asks that no embedding threshold sees: the negation put on another word,
the same words rearranged around "than", and a number said as a percentage on one side only."""

from __future__ import annotations

import pytest

from cache_service.pair_checks import percents
from cache_service.pair_checks import veto as number_negation_veto
from cache_service.vetoes import direction_veto, negation_moved, veto


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "My garbage disposal hums but won't spin. What do I do?",
            "My garbage disposal doesn't hum or make any sound at all. What do I do?",
        ),
        (
            "Why am I getting 'borrowed value does not live long enough' in Rust?",
            "Why am I getting 'cannot borrow as mutable more than once' in Rust?",
        ),
        ("the fan spins but does not blow air", "the fan blows air but does not spin"),
    ],
)
def test_a_negation_put_on_another_word_differs(a: str, b: str) -> None:
    assert veto(a, b) == "negation differs"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # the same thing negated, in other words around it
        ("my phone won't charge", "why is my phone not charging"),
        (
            "how do i find a stud in the wall without a stud finder",
            "i dont own a stud finder, how do i find studs",
        ),
        ("whats the best potting mix for succulents in pots without drainage holes", "a pot with no holes"),
        (
            "a breakfast that keeps me full without a lot of carbs",
            "a filling breakfast that is not carb heavy",
        ),
        (
            "how do i transfer my saves?? dont wanna lose my progress",
            "transfer my saves without losing progress",
        ),
        ("we're not native speakers of German", "we don't speak German natively"),
    ],
)
def test_the_same_negation_in_other_words_is_not_moved(a: str, b: str) -> None:
    assert not negation_moved(a, b)


def test_one_negation_alone_is_left_to_the_count_of_negators() -> None:
    assert not negation_moved("why does my fan not spin", "why does my fan spin so loud")
    assert veto("why does my fan not spin", "why does my fan spin") == "negation differs"


def test_the_same_words_rearranged_around_than_differ() -> None:
    a = "Can I claim tax relief for working at home if it's my choice rather than my employer's requirement?"
    b = "Can I claim tax relief for working at home if it's my employer's requirement rather than my choice?"
    assert veto(a, b) == "direction differs"
    # a sentence or a clause that moved keeps its meaning
    a, b = (
        "Is a laptop faster than a desktop? Asking for gaming.",
        "Asking for gaming. Is a laptop faster than a desktop?",
    )
    assert direction_veto(a, b) == ""
    assert (
        direction_veto(
            "if it is cheaper, is a laptop faster than a desktop",
            "is a laptop faster than a desktop, if it is cheaper",
        )
        == ""
    )


def test_a_number_said_as_a_percentage_on_one_side_only_differs() -> None:
    assert percents("count cells > 50% in A1") == [50.0]
    assert percents("fifty per cent off, 20 percent back") == [20.0, 50.0]
    assert veto(
        "Excel formula to count cells > 50 in A1:A100", "Excel formula to count cells > 50% in A1:A100"
    ) == ("units differ")
    assert veto("save 20% a month", "save 20 percent a month") == ""
    # a split written as a ratio is a share without the sign
    assert (
        number_negation_veto("split a dataset 80/20", "split a dataset 80 percent train 20 percent test")
        == ""
    )
