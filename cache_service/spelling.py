"""Spelling correction for the canonical tier: a retyped question with a typo ("electricty", "conection")
should find the entry its correct spelling stored.

The dictionary is general English, not our data: the words of wordfreq's list (cache_service/
word_frequency.tsv.gz, CC BY-SA 4.0: cache_service/WORD_FREQUENCY_LICENSE) at Zipf frequency 3.5 or more
(about 15,000 words), searched by symspellpy (symmetric deletes, Damerau-Levenshtein distance up to 2).
A word is corrected only when all of these hold, so a correction is rare and unambiguous:

- it is lower-case letters only (never a capitalized word, a name, a number or a code: "Lyon", "PS5",
  "macOS"); the first word of a sentence may carry its capital;
- it is not itself a listed word of some frequency (Zipf below CORRECTABLE_BELOW, 2.5: "form" is never
  turned into "from", nor "buy" into "by", nor a name typed in lower case such as "etsy" into "easy");
  common misspellings that wordfreq lists ("teh" 3.0, "recieve" 2.8) are therefore left alone too;
- the nearest dictionary words are at distance 1 (distance 2 only for words of 5 letters or more), and the
  most frequent of them is at least AMBIGUITY_RATIO times as frequent as the next ("hwo" could be "how" or
  "who": left alone; "adress" could be "address" or "dress": left alone).

The same correction runs on the stored question and on the looked-up one, so a wrong correction can only
join two spellings of one word, never change a question's numbers, names or negation (cache_service/
vetoes.py still reads the original words).
"""

from __future__ import annotations

import functools
import gzip

from cache_service.artifacts import path_of

FREQUENCY_FILE = path_of("word_frequency")  # listed in cache_service/artifacts.json
KNOWN_ZIPF = 3.5  # the only corrections: words at least this common
# Words at least this common are never corrected: the list's rarer words are as often names typed in lower
# case ("etsy" would become "easy") or terms ("chmod") as misspellings.
CORRECTABLE_BELOW = 2.5
AMBIGUITY_RATIO = 10.0  # the best correction must be this many times as frequent as the next one
MIN_LENGTH_FOR_TWO_EDITS = 5


@functools.cache
def _dictionary() -> tuple[object, dict[str, float]]:
    """(SymSpell over the common words, word -> Zipf for every listed word). ~0.5 s, ~15k words."""
    from symspellpy import SymSpell

    zipf: dict[str, float] = {}
    for line in gzip.decompress(FREQUENCY_FILE.read_bytes()).decode().splitlines():
        if line.startswith("#"):
            continue
        hundredths, words = line.split("\t")
        for w in words.split(" "):
            zipf.setdefault(w, int(hundredths) / 100)
    speller = SymSpell(max_dictionary_edit_distance=2, prefix_length=7)
    for w, z in zipf.items():
        if z >= KNOWN_ZIPF and w.isalpha():
            speller.create_dictionary_entry(w, int(10**z))
    return speller, zipf


def load() -> None:
    """Build the dictionary now (at service start), not in the first lookup."""
    _dictionary()


def zipf(word: str) -> float:
    """`word`'s Zipf frequency in wordfreq's list (lower case); 0 when it is not listed."""
    return _dictionary()[1].get(word, 0.0)


@functools.lru_cache(maxsize=65536)
def correct(word: str) -> str:
    """`word` (lower case) corrected, or itself when it is common, not a plain word or not unambiguous."""
    if not word.isalpha() or not word.islower() or len(word) < 2:
        return word
    speller, zipf = _dictionary()
    if zipf.get(word, 0.0) >= CORRECTABLE_BELOW:
        return word
    from symspellpy import Verbosity

    max_distance = 2 if len(word) >= MIN_LENGTH_FOR_TWO_EDITS else 1
    found = speller.lookup(word, Verbosity.ALL, max_edit_distance=max_distance)  # type: ignore[attr-defined]
    if not found:
        return word
    nearest = min(s.distance for s in found)
    counts = sorted((s.count for s in found if s.distance == nearest), reverse=True)
    if len(counts) > 1 and counts[0] < AMBIGUITY_RATIO * counts[1]:
        return word
    best = next(s.term for s in found if s.distance == nearest and s.count == counts[0])
    return best
