"""Near repeats without the embedding model: typos read word by word (cache_service/typos.py), greetings and
thanks read by word class (cache_service/phatic.py), and the vetoes that keep swapped details apart."""

from __future__ import annotations

import pytest

from cache_service.canonical import canonical_keys, near_typo
from cache_service.phatic import strip_phatic
from cache_service.typos import typo_edits
from cache_service.vetoes import veto


def served(stored: str, retyped: str) -> bool:
    """What the cache does without the model: a canonical key in common or a near typo, and no veto."""
    same = bool(canonical_keys(stored) & canonical_keys(retyped)) or near_typo(retyped, stored)
    return same and veto(retyped, stored) == ""


@pytest.mark.parametrize(
    ("x", "y", "edits"),
    [
        ("to", "tl", 1),  # a function word mistyped into a rare string
        ("the", "te", 1),
        ("in", "inn", 1),
        ("drywall", "dryawll", 1),  # the intended word may itself be rare
        ("the", "thhr", 2),  # two edits in a short word typed into no word at all
        ("what's", "what'ss", 1),  # a contraction's ending
        ("10-year-old", "10-year-opd", 1),  # a compound, part by part
        ("my", "m", 1),  # a stray letter is no word
        ("get", "ge", 1),  # two letters outside the closed class: an abbreviation at most
    ],
)
def test_typos_are_told_by_letters_and_frequency(x: str, y: str, edits: int) -> None:
    assert typo_edits(x, y) == edits
    assert typo_edits(y, x) == edits


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ("on", "of"),  # two function words
        ("is", "us"),
        ("rate", "rat"),  # two real words a letter apart: how traps swap a detail
        ("tsp", "tbsp"),
        ("us", "uk"),
        ("board", "card"),
        ("16gb", "16mb"),  # units and codes are never typos
        ("10-year-old", "12-year-old"),
        ("x", "y"),  # two single letters: variables
        ("etsy", "ebay"),
    ],
)
def test_different_words_are_no_typos(x: str, y: str) -> None:
    assert typo_edits(x, y) is None


@pytest.mark.parametrize(
    ("stored", "retyped"),
    [
        ("How do I reset my router to factory settings?", "How do I reset my router tl factory settings?"),
        ("What time does the sun set in London in June?", "hWat time does the sun set in London in June?"),
        ("How do I convert a list to a set in Python?", "HHow do I convert a list to a set in Python?"),
        (
            "What's the difference between a stock and a bond?",
            "What'ss the difference between a stock and a bond?",
        ),
        (
            "Should I water my plants without drainage holes?",
            "Should I water my plants withhout drainage holes?",
        ),
        ("How do I patch a 2-inch hole in drywall?", "How do I patch a 2-iinch hole in dryawll?"),
        ("How long does a honeybee live in summer?", "How long does a honeybee live in smmer?"),
    ],
)
def test_retyped_with_typos_is_served(stored: str, retyped: str) -> None:
    assert served(stored, retyped)


@pytest.mark.parametrize(
    ("stored", "retyped"),
    [
        (
            "What is the exchange rate from euros to dollars?",
            "What is the exchange rat from euros to dollars?",
        ),
        ("How do I turn on wifi?", "How do I turn of wifi?"),
        ("What is the capital of Austria?", "What is the capital of Australia?"),
        ("Can I take 2 tablets of ibuprofen?", "Can I take 3 tablets of ibuprofen?"),
        ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?"),
        ("Add 2 tsp of salt to the dough", "Add 2 tbsp of salt to the dough"),
        (
            "Does the train from Paris to Lyon run on Sundays?",
            "Does the train from Lyon to Paris run on Sundays?",
        ),
    ],
)
def test_swapped_details_are_not_served(stored: str, retyped: str) -> None:
    assert not served(stored, retyped)


@pytest.mark.parametrize(
    ("text", "core"),
    [
        ("Good afternoon folks! How do I reset my router?", "How do I reset my router"),
        ("How do I reset my router? Appreciate any pointers :)", "How do I reset my router"),
        ("Sorry to bother you again, how do I reset my router?", "how do I reset my router"),
        ("Could you tell me how do I reset my router please", "how do I reset my router"),
        ("How do I reset my router? Thanks so much for your time, Sam", "How do I reset my router"),
        ("This might be a silly question, but how do I reset my router?", "how do I reset my router"),
        ("How do I fix my tap any ideas", "How do I fix my tap"),
        ("How do I reset my router? No worries if not!", "How do I reset my router"),
        ("How do I reset my router if possible", "How do I reset my router"),
        ("Hi Sarah how do I reset my router", "how do I reset my router"),
        ("What is quantum physics in simple terms?", "What is quantum physics"),
    ],
)
def test_greetings_and_thanks_are_read_by_word_class(text: str, core: str) -> None:
    assert strip_phatic(text) == core


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            "How do I reset my router? Or not?",
            "How do I reset my router? Or not",
        ),  # a negator is the question's
        ("How do I reset my router? Why?", "How do I reset my router? Why"),  # so is a question word
        ("How much does the rental cost, for a day?", "How much does the rental cost, for a day"),
        ("What is Python for please?", "What is Python for"),  # only the pleading word goes, never "for"
        (
            "Is it correct to end an email with 'Best regards'?",
            "Is it correct to end an email with 'Best regards'",
        ),
        (
            "Customer on the Pro plan wants a refund. How should I advise?",
            "Customer on the Pro plan wants a refund. How should I advise",
        ),
        ("Tell me a joke", "Tell me a joke"),  # too little would be left
        ("How do I say hello in English?", "How do I say hello in English"),
        ("How do I get to Paris", "How do I get to Paris"),
        (
            "Can I get a green card if I am already in the US?",
            "Can I get a green card if I am already in the US",
        ),
    ],
)
def test_what_carries_meaning_stays(text: str, kept: str) -> None:
    assert strip_phatic(text) == kept


def test_a_wrapped_question_is_served_and_its_traps_are_not() -> None:
    stored = "Is it safe to eat raw eggs?"
    assert served(stored, "Hey folks, hope all is well! Is it safe to eat raw eggs? Appreciate it, Sam")
    assert not served(stored, "Hey folks! Is it not safe to eat raw eggs? Thanks!")
    assert not served(stored, "Hey folks! Is it safe to eat raw eggs in pregnancy? Thanks!")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "What settings should I use to photograph fireworks?",
            "What settings should I avoid for fireworks?",
        ),
        ("Is it safe to take melatonin every night?", "Is it safe to stop taking melatonin every night?"),
        ("When does Ramadan start in 2025?", "When does Ramadan end in 2025?"),
        (
            "How to read a csv with a semicolon separator in pandas",
            "How to write a csv with a semicolon separator in pandas",
        ),
        ("What is 72 degrees Fahrenheit in Celsius?", "What is 72 degrees Celsius in Fahrenheit?"),
        ("What is 80 increased by 15%?", "What is 80 decreased by 15%?"),  # opposites, inflected
        ("How much water should I drink per day?", "How much water is too much to drink per day?"),
        ("How do I remove duplicates from an array?", "How do I keep only the duplicates of an array?"),
    ],
)
def test_negating_verbs_and_opposites_veto(a: str, b: str) -> None:
    assert veto(a, b) != ""


def test_real_words_a_letter_apart_are_left_to_the_threshold() -> None:
    from cache_service.typos import real_word_typo

    assert real_word_typo("start", "stat") and real_word_typo("router", "route")
    assert not real_word_typo("line", "lines")  # one thing or several: a number changed
    assert not real_word_typo("rate", "rat")  # too short to tell
    assert not real_word_typo("16gb", "16mb")
    # never accepted below the threshold as a near typo: another real word may be meant
    assert not near_typo("When do babies usually start crawling?", "When do babies usually stat crawling?")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "How do I turn off data roaming so I don't get charged?",
            "How can I turn off data roaming to avoid charges?",
        ),
        (
            "How do I block a number that keeps calling me?",
            "How do I block a number that won't stop calling me?",
        ),
        ("Which foods should I avoid when pregnant?", "Which foods should I not eat when pregnant?"),
    ],
)
def test_a_negator_and_a_negating_verb_say_the_same(a: str, b: str) -> None:
    """Polarity, not the words that carry it: "don't get charged" is "avoid charges", and "won't stop" is
    "keeps"; one side negated against the other plain still differs (the test above)."""
    assert veto(a, b) != "negation differs"


def test_one_side_negated_by_a_verb_still_differs() -> None:
    assert veto("Which foods should I eat when pregnant?", "Which foods should I avoid when pregnant?")
    assert veto(
        "How do I block a number that keeps calling me?", "How do I block a number that won't call me?"
    )
    assert veto("Is it safe to take melatonin every night?", "Is it safe to not take melatonin every night?")
