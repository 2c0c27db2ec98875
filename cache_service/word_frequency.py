"""How common a word is in English at large: what tells a reworded question from one about something else.

A rewording leaves common words on one side only ("way", "get", "fix", "purchase"); a swapped entity or a
changed scope leaves rare ones ("Lyon", "monstera", "hyperinflation", "semicolons"). The word-piece
features (pair_features.py) cannot tell those apart, so the verifier is also told how rare the rarest
content word only one side has is, how much information those words carry together, and how rare the
rarest word both sides share is (a specific topic).

Rarity is a word's Zipf frequency (log10 of its occurrences per billion words: "the" ~7.7, "purchase" ~4.7,
"monstera" ~1.5), from the English list of the `wordfreq` package (Robyn Speer; data CC BY-SA 4.0:
cache_service/WORD_FREQUENCY_LICENSE), a general table built from Wikipedia, subtitles, news, books and the
web, not fitted on any of our data. cache_service/word_frequency_build.py writes it into
cache_service/word_frequency.tsv.gz; the service reads it at start (`load`).
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

from cache_service.related_words import one_sided_words

FREQUENCY_FILE = Path(__file__).with_name("word_frequency.tsv.gz")
NO_WORD = 8.0  # above any word's Zipf frequency ("the" is ~7.7): stands for "no such word"
UNLISTED = 0.0  # the list stops at Zipf 1.0: a word it lacks is rarer than that
RARITY_NAMES = (
    "rarest_one_sided_min",  # the rarer side's rarest one-sided content word (Zipf)
    "rarest_one_sided_max",  # the other side's
    "one_sided_information_min",  # sum of (NO_WORD - Zipf) over a side's one-sided content words, smaller
    "one_sided_information_max",
    "rarest_shared",  # the rarest content word both sides have
)


@functools.cache
def _table() -> dict[str, float]:
    """word -> Zipf frequency. The file's lines: the Zipf frequency in hundredths, a tab, its words."""
    table: dict[str, float] = {}
    for line in gzip.decompress(FREQUENCY_FILE.read_bytes()).decode().splitlines():
        if line and not line.startswith("#"):
            hundredths, words = line.split("\t")
            zipf = int(hundredths) / 100
            table.update(dict.fromkeys(words.split(), zipf))
    return table


def load() -> None:
    """Read the table now (~0.1 s; the service calls this at start, so no lookup pays for it)."""
    _table()


def zipf(word: str) -> float:
    return _table().get(word, UNLISTED)


def rarity_features(wa: list[str], wb: list[str]) -> tuple[float, ...]:
    """RARITY_NAMES for two texts' words (pair_checks.words)."""
    return rarity(*one_sided_words(wa, wb))


def rarity(only_a: list[str], only_b: list[str], shared: list[str]) -> tuple[float, ...]:
    """RARITY_NAMES from the split of related_words.one_sided_words, for callers that have it."""
    za, zb = [zipf(w) for w in only_a], [zipf(w) for w in only_b]
    rarest = sorted((min(za, default=NO_WORD), min(zb, default=NO_WORD)))
    information = sorted((sum(NO_WORD - z for z in za), sum(NO_WORD - z for z in zb)))
    return (*rarest, *information, min((zipf(w) for w in shared), default=NO_WORD))
