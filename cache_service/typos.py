"""Whether two differing words can be one word mistyped: the word-by-word check behind canonical.near_typo
and the detail veto's tolerance of typos.

A typo is a letter substituted, dropped, doubled or transposed. Whether a pair of words is one is read from
their letters and from general English word frequencies (wordfreq's list, cache_service/spelling.py), never
from any evaluation data:

- rare-typo: the rarer word is no established word (Zipf below TYPO_WORD_BELOW, unlisted strings at 0) and
  the other is at least TYPO_FREQUENCY_GAP more frequent ("conection" / "connection", "dryawll" /
  "drywall"; never two unlisted strings, which are as likely two names typed in lower case);
- closed-class typo: the commoner word is a function word (an article, pronoun, auxiliary, preposition or
  conjunction: a closed class of English) and the other is not one and is much rarer ("to" / "tl", "the" /
  "te", "in" / "inn"); a function word turned into another ("on" / "of", "is" / "us") is a different word;
- two letters that are no function word ("te", "ge": abbreviations at most) a hundred times rarer than the
  other word are its typo; a single letter other than "a" and "i" counts as no word at all;
- the edits allowed grow with the length: one in a word of up to three letters, two in a longer one, two in
  a three-letter word mistyped into no listed word at all ("the" / "thhr"), and two in any short word where
  the two questions are otherwise word for word the same and the typed string is in little use ("dsg" /
  "dogs", "c" / "so"), unless the letters were added at one end ("set" / "unset": a prefix);
- a compound or contraction is compared part by part ("single-pole" / "single-pol", "10-year-old" /
  "10-year-opd", "what's" / "what'ss"), its numbers equal.
Two real words a letter apart ("rate" / "rat", "cups" / "cup", "tsp" / "tbsp") are never called a typo: that
is how traps swap a detail.
"""

from __future__ import annotations

import functools
import re

from cache_service import spelling

TYPO_WORD_BELOW = 3.5  # the mistyped side of a rare-typo: rarer than this (Zipf) ...
TYPO_FREQUENCY_GAP = 1.5  # ... and at least this much rarer than the intended word (30 times)
TWO_LETTER_GAP = 2.0  # two letters outside the closed class: at least this much rarer ("te" / "time")
CLOSED_CLASS_GAP = 1.5  # a function word's typo: at least this much rarer than the function word
UNLISTED = 1.0  # below this a string is no word at all (the list's floor is about 1)

# Articles, pronouns, auxiliaries, modals, prepositions, conjunctions, question words: a closed class of
# English, typed in nearly every question (a typo lands in one as often as anywhere else).
CLOSED_CLASS = frozenset(
    """a an the this that these those some any each every all both no my your his her its our their me
    you he she it we they them us him i what which who whom whose when where why how whether is am are
    was were be been being do does did have has had can could will would shall should may might must to
    of in on at by for from with about into onto over under up out off as than and or but so if then
    not nor too very there here""".split()
)


def osa(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance (a transposition is one edit), or limit + 1 beyond `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        previous2, previous = previous, current
    return previous[-1]


def _zipf(word: str) -> float:
    """The word's Zipf frequency; a single letter other than "a" and "i" is no word in running text (the
    list counts letters of abbreviations and initials)."""
    return 0.0 if len(word) == 1 and word not in ("a", "i") else spelling.zipf(word)


def _word_edits(x: str, y: str, aligned: bool = False) -> int | None:
    """Edits between two differing plain words (letters only) when one is a typo of the other, else None.
    `aligned`: the two stand in the same place of two questions otherwise the same, where a short word
    mistyped twice ("orf" / "for", "dsg" / "dogs", "c" / "so") has no other reading."""
    zx, zy = _zipf(x), _zipf(y)
    (rare, z_rare), (common, z_common) = sorted(((x, zx), (y, zy)), key=lambda p: p[1])
    rare_typo = z_rare < TYPO_WORD_BELOW and z_common >= z_rare + TYPO_FREQUENCY_GAP
    # a string of two letters outside the closed class is an abbreviation at most ("te", "ge")
    rare_typo |= len(rare) == 2 and rare not in CLOSED_CLASS and z_common >= z_rare + TWO_LETTER_GAP
    closed_typo = (
        common in CLOSED_CLASS and rare not in CLOSED_CLASS and z_rare <= z_common - CLOSED_CLASS_GAP
    )
    if not (rare_typo or closed_typo):
        return None
    short = min(len(x), len(y)) <= 3
    limit = 1 if short and not aligned and not (z_rare < UNLISTED and len(common) >= 3) else 2
    if aligned and short and (z_rare >= TYPO_WORD_BELOW or _affixed(x, y)):
        # twice mistyped into a word in use ("te" / "time", "un" / "sun"): maybe that word; letters
        # added at one end ("set" / "unset", "go" / "gone"): a prefix or an ending
        limit = 1
    distance = osa(x, y, limit)
    return distance if distance <= limit else None


def _affixed(x: str, y: str) -> bool:
    """Whether the longer word is the shorter with letters added at its start or its end."""
    short, long = sorted((x, y), key=len)
    return long.startswith(short) or long.endswith(short)


_CONTRACTED = frozenset("s t re ll ve m d".split())  # what comes after the apostrophe of a contraction


def _suffix_edits(x: str, y: str) -> int | None:
    """A contraction's ending mistyped ("what'ss", "don'r"): one edit from a contraction's ending into no
    contraction's ending."""
    if (x in _CONTRACTED) == (y in _CONTRACTED):
        return None
    return 1 if osa(x, y, 1) <= 1 else None


@functools.lru_cache(maxsize=65536)
def typo_edits(x: str, y: str, aligned: bool = False) -> int | None:
    """Letter edits between two differing words (lower case) when one can be a mistyping of the other,
    None when they are different words (or numbers, codes, names: anything but letters and hyphens).
    `aligned`: the words stand in the same place of two questions otherwise word for word the same."""
    px, py = re.split(r"([-'])", x), re.split(r"([-'])", y)
    if len(px) != len(py) or px[1::2] != py[1::2]:
        return None
    total = 0
    for i, (a, b) in enumerate(zip(px, py, strict=True)):
        if a == b:
            continue
        if not (a.isalpha() and b.isalpha()):
            return None
        after_apostrophe = i > 0 and px[i - 1] == "'"
        edits = _suffix_edits(a, b) if after_apostrophe else _word_edits(a, b, aligned)
        if edits is None:
            return None
        total += edits
    return total if total else None


REAL_WORD_MIN_LENGTH = 4


def real_word_typo(x: str, y: str) -> bool:
    """Two letter-only words of at least REAL_WORD_MIN_LENGTH letters one edit apart ("start" / "stat",
    "router" / "route"; "rate" / "rat" is too short to tell; never a singular and its plural): maybe a
    mistyping, maybe another word. The detail veto leaves them to the embedding's threshold (never
    accepted below it as a near typo)."""
    plural = x + "s" == y or y + "s" == x or x + "es" == y or y + "es" == x  # one thing or several
    return (
        x.isalpha()
        and y.isalpha()
        and min(len(x), len(y)) >= REAL_WORD_MIN_LENGTH
        and not plural
        and osa(x, y, 1) == 1
    )


ALIGNED_FREQUENCY_GAP = 1.0  # an aligned real-word typo: the typed word at least this much rarer (10 times)
_INFLECTIONS = ("s", "es", "d", "ed", "ing", "er", "est", "ly", "n", "en")


def aligned_typo(x: str, y: str) -> bool:
    """Two words one edit apart in the same place of two questions otherwise word for word the same, the
    typed one at least ten times rarer ("des" / "does", "wa" / "way", "orf" / "for"): a word of its own in
    another language or an abbreviation, but no English question's. Never an inflection ("cup" / "cups",
    "walk" / "walked": one thing or several, now or then), never two function words ("on" / "of"), never
    two words of like frequency ("win" / "won", "bay" / "baby")."""
    if typo_edits(x, y, aligned=True) is not None:
        return True
    if not (x.isalpha() and y.isalpha()) or osa(x, y, 1) != 1 or (x in CLOSED_CLASS and y in CLOSED_CLASS):
        return False
    short, long = sorted((x, y), key=len)
    if len(short) > 2 and long.startswith(short) and long[len(short) :] in _INFLECTIONS:
        return False  # two letters and an ending ("ol" / "old") are a word cut short, not inflected
    return abs(_zipf(x) - _zipf(y)) >= ALIGNED_FREQUENCY_GAP
