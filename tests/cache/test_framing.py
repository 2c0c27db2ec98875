"""A stored question inside framing of the writer's own (cache_service/framing.py): the question's run of
the message is found by its canonical key, the rest must say nothing about it."""

from __future__ import annotations

import pytest

from cache_service.framing import framed_question, segments
from cache_service.vetoes import veto


def test_segments_cut_at_marks_followed_by_a_space_only() -> None:
    assert segments("Hey, tired mum here, Which planet is closest to the sun? Thanks a lot, Raj") == [
        "Hey,",
        "tired mum here,",
        "Which planet is closest to the sun?",
        "Thanks a lot,",
        "Raj",
    ]
    assert segments("Is $3,000 or 3.5% more - per year?") == ["Is $3,000 or 3.5% more", "per year?"]


@pytest.mark.parametrize(
    ("message", "stored", "question"),
    [
        (
            "Hey, tired mum here, Which planet is closest to the sun? Thanks a lot, Raj",
            "Which planet is closest to the sun?",
            "Which planet is closest to the sun?",
        ),
        (
            "Hi, I'm sorry if this is a silly question, Can dogs eat grapes?",
            "Can dogs eat grapes?",
            "Can dogs eat grapes?",  # the shortest run: the apology stays out of what the vetoes read
        ),
        (
            "Explain it to me like I'm a child: How do I apply for a library card in Chicago?",
            "How do I apply for a library card in Chicago?",
            "How do I apply for a library card in Chicago?",
        ),
        (
            "If my flight is delayed 4 hours, am I entitled to compensation? Been going round in circles.",
            "If my flight is delayed 4 hours, am I entitled to compensation?",
            "If my flight is delayed 4 hours, am I entitled to compensation?",
        ),
        (
            "My wife wants to know which medications can I take with grapefruit juice?",
            "Which medications can I take with grapefruit juice?",
            "which medications can I take with grapefruit juice?",  # a lead-in cut before the question word
        ),
        ("so basically how do I unclog a sink?", "How do I unclog a sink?", "how do I unclog a sink?"),
        (
            "Why does my controller keep drifting innit?",
            "Why does my controller keep drifting?",
            "Why does my controller keep drifting?",
        ),  # a chat tag after the question
        ("Hi, can dogs eat grapes tbh? Thanks, Raj", "Can dogs eat grapes?", "can dogs eat grapes?"),
        # a negator of the writer's not knowing, or of a hurry
        ("ngl i have no idea how do I unclog a sink?", "How do I unclog a sink?", "how do I unclog a sink?"),
        ("Hi, no rush, is SPF 30 enough?", "Is SPF 30 enough?", "is SPF 30 enough?"),
        (
            "What apps are best for learning Korean no rush?",
            "What apps are best for learning Korean?",
            "What apps are best for learning Korean?",
        ),
    ],
)
def test_a_question_inside_framing_is_found(message: str, stored: str, question: str) -> None:
    assert framed_question(message, stored) == question
    assert veto(question, stored) == ""


@pytest.mark.parametrize(
    ("message", "stored"),
    [
        ("Can dogs eat grapes? My dog is a puppy.", "Can dogs eat grapes?"),  # context on the question
        ("Can dogs eat grapes? What about raisins?", "Can dogs eat grapes?"),  # another question
        ("Can dogs eat grapes? I live in Canada.", "Can dogs eat grapes?"),  # a place
        ("Can dogs eat grapes? Mine is 3.", "Can dogs eat grapes?"),  # a number
        ("Hi, not ready yet, is SPF 30 enough?", "Is SPF 30 enough?"),  # a negator of anything else
        ("I do not eat meat, what protein should I eat?", "What protein should I eat?"),
        ("For someone with braces, is an electric toothbrush better?", "Is an electric toothbrush better?"),
        ("If I have rosacea, can I use retinol?", "Can I use retinol?"),  # a clause of the question
        ("What is the speed limit on highways in Texas?", "What is the speed limit on highways?"),
        ("Which planet is closest to the sun?", "Which planet is closest to the sun?"),  # one segment
        ("In the UK how do I renew a passport?", "How do I renew a passport?"),  # a place, a clause opener
        ("My 5 year old wants to know why is the sky blue?", "Why is the sky blue?"),  # a number
        ("How do I lose weight quickly?", "How do I lose weight?"),  # a word that qualifies is no tag
        ("How do I reset my router right?", "How do I reset my router?"),  # nor is a direction word
        ("Why does iron rust or is that a dumb question?", "Why does iron rust?"),  # a tag is short
    ],
)
def test_what_changes_the_question_is_not_framing(message: str, stored: str) -> None:
    assert framed_question(message, stored) is None
