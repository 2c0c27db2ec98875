"""How rare, in English at large, the words are that only one side of a pair has
(cache_service/word_frequency.py), and the table built from wordfreq's list."""

from __future__ import annotations

import gzip

from cache_service.pair_checks import words
from cache_service.word_frequency import FREQUENCY_FILE, NO_WORD, UNLISTED, _table, rarity_features, zipf


def features(a: str, b: str) -> tuple[float, ...]:
    return rarity_features(words(a), words(b))


def test_the_table_is_a_general_english_frequency_list() -> None:
    table = _table()
    assert len(table) > 200_000  # the whole list, not words picked from any evaluation set
    assert 7.5 < zipf("the") < 8.0
    assert zipf("the") > zipf("purchase") > zipf("hyperinflation") > UNLISTED
    assert zipf("qwzxv") == UNLISTED
    first = gzip.decompress(FREQUENCY_FILE.read_bytes()).decode().splitlines()[0]
    assert first.startswith("#") and "wordfreq" in first and "CC BY-SA" in first


def test_a_reworded_question_leaves_common_words_and_a_swapped_entity_rare_ones() -> None:
    reworded = features("Where can I buy train tickets?", "Where can I get train tickets?")
    swapped = features("What is the capital of Slovenia?", "What is the capital of Kyrgyzstan?")
    rarest_min, rarest_max, information_min, information_max, _ = range(5)
    assert reworded[rarest_min] > swapped[rarest_min]  # "buy", "get" against "slovenia", "kyrgyzstan"
    assert reworded[information_max] < swapped[information_max]


def test_words_on_both_sides_and_function_words_are_not_one_sided() -> None:
    # "do" / "can" are function words; "password" and "reset" are shared.
    rarest_min, rarest_max, information_min, information_max, rarest_shared = features(
        "How do I reset my password?", "How can I reset my password?"
    )
    assert rarest_min == rarest_max == NO_WORD
    assert information_min == information_max == 0.0
    assert rarest_shared == min(zipf("reset"), zipf("password"))
    # an added word counts on its side only
    assert features("How do I boil eggs?", "How do I boil duck eggs?")[:4] == (
        zipf("duck"),
        NO_WORD,
        0.0,
        NO_WORD - zipf("duck"),
    )
